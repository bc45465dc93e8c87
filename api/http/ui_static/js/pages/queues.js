// Queues: depth by priority, how long the longest-waiting job has waited, pause, resume
// and clear (cancel every pending job, after a counted confirmation). One request every
// 2 s: GET /queues.

import { api } from "../api.js";
import { duration, h, icon, int } from "../dom.js";
import { badge, confirmAction, explain, liveTable, pageHead, panel, toast } from "../ui.js";

const EVERY_MS = 2000;
const SLOW_WAIT = 60; // seconds: a due job waiting longer than this is worth a look
const NAME = /^[A-Za-z0-9_.:-]{1,200}$/;
const BULK_LIMIT = 1000; // POST /jobs/cancel takes at most this many per request

function plural(n, noun) {
  return `${int(n)} ${noun}${n === 1 ? "" : "s"}`;
}

export default {
  title: "Queues",
  nav: "queues",
  mount(root) {
    const notice = h("div", { class: "banner" });
    const body = h("div", null, h("div", { class: "loading" }, "Loading queues…"));
    const nameInput = h("input", { id: "pause-name", name: "queue", placeholder: "queue name", autocomplete: "off", required: true, pattern: "[A-Za-z0-9_.:\\-]{1,200}", title: "1 to 200 of A–Z a–z 0–9 _ . : -" });
    const form = h(
      "form",
      { class: "toolbar foot", onsubmit: (event) => { event.preventDefault(); setPaused(nameInput.value.trim(), true); } },
      h("label", { class: "field grow", for: "pause-name" }, "Pause a queue before its jobs arrive", nameInput),
      h("button", { type: "submit" }, icon("pause"), "Pause"),
    );
    root.append(
      pageHead("Queues", { sub: "Pending jobs by priority. A paused queue keeps its jobs and gets no new dispatch on any node until resumed." }),
      notice,
      panel("All queues", { sub: "queues with pending or running jobs, and paused ones", id: "queues-title" }, body, form),
    );

    async function setPaused(name, paused) {
      if (!NAME.test(name)) {
        toast("A queue name is 1 to 200 of A–Z a–z 0–9 _ . : -", { bad: true });
        return;
      }
      try {
        await api(`queues/${encodeURIComponent(name)}/${paused ? "pause" : "resume"}`, { method: "POST" });
        toast(paused ? `Queue ${name} paused: no new job starts from it.` : `Queue ${name} resumed.`);
        nameInput.value = "";
      } catch (err) {
        toast(`Could not ${paused ? "pause" : "resume"} ${name}: ${explain(err)}`, { bad: true });
      }
      live.now();
    }

    // Cancel every pending job of the queue (running ones are left alone), after a
    // confirmation that says how many; one request per BULK_LIMIT jobs.
    async function clearQueue(q) {
      const sure = await confirmAction({
        title: `Cancel ${plural(q.pending, "pending job")} in ${q.name}?`,
        what: [
          `Every pending job of queue ${q.name}, the oldest first, is cancelled and will not run.`,
          q.running ? `Its ${plural(q.running, "running job")} ${q.running === 1 ? "is" : "are"} left alone.` : "Running jobs, if any start meanwhile, are left alone.",
          "This cannot be undone.",
        ],
        confirm: `Cancel ${plural(q.pending, "job")}`,
      });
      if (!sure) return;
      let cancelled = 0;
      let answer = null;
      try {
        do {
          answer = await api("jobs/cancel", { method: "POST", body: { queue: q.name, limit: BULK_LIMIT } });
          cancelled += answer.cancelled;
        } while (answer.remaining > 0 && answer.cancelled > 0);
        const alone = answer.running ? ` ${plural(answer.running, "running job")} left alone.` : "";
        toast(`Cancelled ${plural(cancelled, "job")} in ${q.name}.${alone}`);
      } catch (err) {
        toast(`Could not clear ${q.name}: ${explain(err)}`, { bad: true });
      }
      live.now();
    }

    const columns = [
      {
        label: "Queue",
        lead: true,
        cell: (q) => h("a", { href: `#/jobs?queue=${encodeURIComponent(q.name)}`, class: "mono", "data-focus": `open:${q.name}` }, q.name),
      },
      { label: "State", cell: (q) => badge(q.paused ? "paused" : "active") },
      { label: "Pending", class: "r num", cell: (q) => h("span", { "data-pending": q.name }, int(q.pending)) },
      {
        label: "By priority",
        cell: (q) =>
          Object.keys(q.depth_by_priority).length
            ? h("div", { class: "chips" }, Object.entries(q.depth_by_priority).map(([p, n]) => h("span", { class: "chip", title: `priority ${p}: ${n} pending` }, "P", h("b", null, p), " · ", int(n))))
            : h("span", { class: "faint" }, "—"),
      },
      { label: "Scheduled", class: "r num", hideSm: true, cell: (q) => int(q.scheduled) },
      { label: "Running", class: "r num", cell: (q) => int(q.running) },
      {
        label: "Longest wait",
        class: "r num",
        cell: (q) =>
          q.waiting_seconds == null
            ? h("span", { class: "faint" }, "—")
            : h("span", { class: q.waiting_seconds > SLOW_WAIT ? "warn" : null, title: `due since ${q.oldest_due_at}` },
                q.waiting_seconds > SLOW_WAIT ? [icon("alert"), " "] : null, duration(q.waiting_seconds)),
      },
      {
        label: "Actions",
        class: "r",
        cell: (q) =>
          h("div", { class: "row-actions" },
            h("button", {
              class: "small", "data-focus": `toggle:${q.name}`, "data-queue": q.name,
              "aria-label": `${q.paused ? "Resume" : "Pause"} queue ${q.name}`,
              onclick: () => setPaused(q.name, !q.paused),
            }, icon(q.paused ? "play" : "pause"), q.paused ? "Resume" : "Pause"),
            q.pending
              ? h("button", {
                  class: "small danger", "data-focus": `clear:${q.name}`, "data-clear": q.name,
                  "aria-label": `Cancel the pending jobs of queue ${q.name}`,
                  onclick: () => clearQueue(q),
                }, icon("ban"), "Clear")
              : null),
      },
    ];

    const live = liveTable({
      body,
      notice,
      columns,
      read: () => api("queues", { quiet: true }),
      rows: (data) => data.queues,
      empty: "No queue has pending or running jobs, and none is paused.",
      caption: "Queues",
      everyMs: EVERY_MS,
    });
    return () => live.stop();
  },
};
