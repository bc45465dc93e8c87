// Dead letters: filter by type, queue and error text; replay or purge one, or every
// letter the filters select (confirmed with their count). Rows come
// from GET /summary/dlq (payloads and errors cut to a preview by the store), refreshed
// every 5 s while "Live" is on.

import { api } from "../api.js";
import { h, icon, int, idText, shortId, swap, when } from "../dom.js";
import { poll, setDeadCount } from "../live.js";
import { callout, confirmAction, explain, pageHead, pager, table, toast } from "../ui.js";

const EVERY_MS = 5000;
const LIMIT = 25;

const BULK_LIMIT = 1000; // letters per request, the most the node takes

/**
 * Bulk replay and purge of every dead letter the page's filters select (all of them with
 * none), through `POST /dlq/replay` and `DELETE /dlq` with the same filters. Each asks
 * first, naming how many letters match now; then it calls as often as it takes, stopping
 * after that many (letters that die meanwhile are not chased). None for one job's letter.
 */
function bulkActions(filters, afterwards) {
  if (filters.job_id) return [];
  const selection = { type: filters.type, queue: filters.queue, error: filters.error };
  const described = Object.entries(selection).filter(([, v]) => v).map(([k, v]) => (k === "error" ? `whose last error contains "${v}"` : `of ${k} ${v}`));
  const which = described.length ? `the letters ${described.join(", ")}` : "every dead letter (no filter)";
  const action = (verb, run) => async () => {
    let matching;
    try {
      matching = (await api("summary/dlq", { query: { ...selection, limit: 1, preview: 1 } })).total;
    } catch (err) {
      toast(`Could not count the dead letters: ${explain(err)}`, { bad: true });
      return;
    }
    if (!matching) {
      toast("No dead letter matches these filters.");
      return;
    }
    const letters = `${int(matching)} dead ${matching === 1 ? "letter" : "letters"}`;
    const ok = await confirmAction(
      verb === "replay"
        ? { title: `Replay ${letters}?`, what: [`Each becomes a fresh job and leaves the dead-letter queue: ${which}.`, "The oldest go first."], confirm: `Replay ${letters}`, danger: false }
        : { title: `Purge ${letters}?`, what: [`Deleted for good, job snapshots and errors: ${which}.`, "Their jobs stay failed and can no longer be replayed."], confirm: `Purge ${letters}` },
    );
    if (!ok) return;
    const query = { ...selection, all: described.length ? "" : "true" };
    let done = 0;
    try {
      while (done < matching) {
        const answer = await run({ ...query, limit: Math.min(BULK_LIMIT, matching - done) });
        const count = answer.replayed ?? answer.purged;
        done += count;
        if (!count || !answer.remaining) break;
      }
      toast(`${verb === "replay" ? "Replayed" : "Purged"} ${int(done)} dead ${done === 1 ? "letter" : "letters"}.`);
    } catch (err) {
      toast(`Stopped after ${int(done)}: ${explain(err)}`, { bad: true });
    }
    afterwards();
  };
  return [
    h("button", { type: "button", class: "small", "data-bulk": "replay", onclick: action("replay", (query) => api("dlq/replay", { method: "POST", query })) }, icon("replay"), "Replay all matching"),
    h("button", { type: "button", class: "small danger", "data-bulk": "purge", onclick: action("purge", (query) => api("dlq", { method: "DELETE", query })) }, icon("trash"), "Purge all matching"),
  ];
}

export async function replayDead(letter, navigateTo) {
  try {
    const job = await api(`dlq/${letter.id}/replay`, { method: "POST" });
    toast(`Replayed: a fresh ${job.type} job is queued.`, { link: { href: `#/jobs/${job.id}`, text: "Open it" } });
    if (navigateTo) navigateTo(job);
    return true;
  } catch (err) {
    toast(`Could not replay: ${explain(err)}`, { bad: true });
    return false;
  }
}

export async function purgeDead(letter) {
  const ok = await confirmAction({
    title: `Purge the dead letter of ${letter.type} job ${shortId(letter.job_id)}?`,
    what: [
      `Its job snapshot and the errors of its ${letter.attempts} ${letter.attempts === 1 ? "attempt" : "attempts"} are deleted for good.`,
      "The job stays failed and can no longer be replayed from here.",
    ],
    confirm: "Purge for good",
  });
  if (!ok) return false;
  try {
    await api(`dlq/${letter.id}`, { method: "DELETE" });
    toast("Purged.");
    return true;
  } catch (err) {
    toast(`Could not purge: ${explain(err)}`, { bad: true });
    return false;
  }
}

export default {
  title: "Dead letters",
  nav: "dlq",
  mount(root, { query, navigate }) {
    const filters = {
      type: query.get("type") || "",
      queue: query.get("queue") || "",
      error: query.get("error") || "",
      job_id: query.get("job_id") || "",
      offset: Math.max(0, Number.parseInt(query.get("offset") || "0", 10) || 0),
    };
    const go = (changes) => navigate("/dlq", { ...filters, offset: 0, ...changes }, { replace: true });
    const typeInput = h("input", { id: "d-type", value: filters.type, placeholder: "any type", autocomplete: "off" });
    const queueInput = h("input", { id: "d-queue", value: filters.queue, placeholder: "any queue", autocomplete: "off" });
    const errorInput = h("input", { id: "d-error", value: filters.error, placeholder: "text in the last error", autocomplete: "off" });
    const liveBox = h("input", { type: "checkbox", id: "d-live", checked: true });
    const filtered = filters.type || filters.queue || filters.error || filters.job_id;
    const body = h("div", null, h("div", { class: "loading" }, "Loading dead letters…"));
    const bulk = h("div", { class: "actions" }, bulkActions(filters, () => live.now()));

    root.append(
      pageHead("Dead letters", { sub: "Jobs whose retries ran out, with every attempt's error. Replay one to run it again as a fresh job." }),
      h(
        "section",
        { class: "panel", "aria-label": "Dead letters" },
        h(
          "form",
          { class: "toolbar", role: "search", onsubmit: (event) => { event.preventDefault(); go({ type: typeInput.value.trim(), queue: queueInput.value.trim(), error: errorInput.value.trim(), job_id: "" }); } },
          h("label", { class: "field", for: "d-type" }, "Type", typeInput),
          h("label", { class: "field", for: "d-queue" }, "Queue", queueInput),
          h("label", { class: "field grow", for: "d-error" }, "Error contains", errorInput),
          h("button", { type: "submit" }, "Filter"),
          filtered ? h("button", { type: "button", class: "link", onclick: () => go({ type: "", queue: "", error: "", job_id: "" }) }, "Clear filters") : null,
          h("div", { class: "end" }, bulk, h("label", { class: "check", for: "d-live" }, liveBox, "Live")),
        ),
        filters.job_id ? h("div", { class: "body" }, callout("info", "Showing the dead letter of job ", h("a", { href: `#/jobs/${filters.job_id}`, class: "mono" }, idText(filters.job_id)), ".")) : null,
        body,
      ),
    );

    const columns = [
      { label: "Dead-lettered", class: "nowrap", cell: (d) => h("a", { href: `#/dlq/${d.id}`, "data-focus": `open:${d.id}` }, when(d.created_at)) },
      {
        label: "Job",
        lead: true,
        cell: (d) => h("div", { class: "idcell" }, h("a", { href: `#/jobs/${d.job_id}` }, d.type), idText(d.job_id)),
      },
      { label: "Queue", cell: (d) => h("span", { class: "mono" }, d.queue) },
      { label: "Attempts", class: "r num", cell: (d) => int(d.attempts) },
      {
        label: "Last error",
        class: "preview",
        cell: (d) => (d.last_error ? h("span", { class: "mono bad", title: d.last_error.text }, d.last_error.text + (d.last_error.truncated ? "…" : "")) : h("span", { class: "faint" }, "—")),
      },
      {
        label: "Actions",
        class: "r",
        cell: (d) =>
          h("div", { class: "actions" },
            h("button", {
              class: "small", "data-focus": `replay:${d.id}`, "data-replay": d.id, "aria-label": `Replay ${d.type} job ${shortId(d.job_id)}`,
              onclick: async () => { await replayDead(d); live.now(); },
            }, icon("replay"), "Replay"),
            h("button", {
              class: "small danger", "data-focus": `purge:${d.id}`, "data-purge": d.id, "aria-label": `Purge the dead letter of ${d.type} job ${shortId(d.job_id)}`,
              onclick: async () => { if (await purgeDead(d)) live.now(); },
            }, icon("trash"), "Purge")),
      },
    ];

    let last = "";
    async function refresh() {
      const data = await api("summary/dlq", {
        query: { type: filters.type, queue: filters.queue, error: filters.error, job_id: filters.job_id, limit: LIMIT, offset: filters.offset },
        quiet: last !== "",
      }).catch((err) => {
        swap(body, callout("bad", explain(err)));
        throw err;
      });
      if (!filtered) setDeadCount(data.total);
      const text = JSON.stringify(data);
      if (text === last) return;
      last = text;
      swap(
        body,
        table(columns, data.dead_letters, { empty: filtered ? "No dead letter matches these filters." : "No dead letters: every job so far either succeeded or is still being retried.", caption: "Dead letters" }),
        data.total > LIMIT || filters.offset ? pager(data, (offset) => go({ offset })) : h("div", { class: "pager" }, h("span", { class: "muted num" }, `${int(data.total)} dead ${data.total === 1 ? "letter" : "letters"}`)),
      );
    }

    let live = poll(refresh, EVERY_MS);
    liveBox.addEventListener("change", () => {
      if (liveBox.checked) live = poll(refresh, EVERY_MS);
      else live.stop();
    });
    return () => live.stop();
  },
};
