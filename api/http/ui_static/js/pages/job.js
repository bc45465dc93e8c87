// One job: payload, result or error, attempts, timings and its events, with cancel,
// force-cancel (running) and replay (dead-lettered). While the job can still change it
// is refreshed every 2 s (the job and its events: one request a second).

import { api } from "../api.js";
import { absolute, duration, h, icon, prettyJson, idText, shortId, swap, when } from "../dom.js";
import { poll } from "../live.js";
import { badge, callout, confirmAction, explain, pageHead, panel, progressBar, toast } from "../ui.js";

const EVERY_MS = 2000;
const TERMINAL = new Set(["done", "failed", "cancelled"]);
const EVENTS = {
  enqueued: ["clock", "pending", "Enqueued"],
  started: ["play", "running", "Started"],
  succeeded: ["check", "done", "Succeeded"],
  attempt_failed: ["x", "failed", "Attempt failed"],
  retry_scheduled: ["replay", "pending", "Retry scheduled"],
  lease_expired: ["alert", "failed", "Lease expired"],
  dead_lettered: ["inbox", "failed", "Dead-lettered"],
  replayed: ["replay", "running", "Replayed"],
  cancelled: ["ban", "cancelled", "Cancelled"],
};

export function codeBlock(text, label) {
  return h("pre", { class: "code", tabindex: "0", "aria-label": label }, prettyJson(text));
}

export function copyButton(text, what) {
  return h("button", {
    type: "button", class: "small", "aria-label": `Copy ${what}`,
    onclick: async () => {
      try {
        await navigator.clipboard.writeText(text);
        toast(`Copied the ${what}.`);
      } catch {
        toast(`Could not copy; select the ${what} instead.`, { bad: true });
      }
    },
  }, icon("copy"), "Copy");
}

// A failed attempt's traceback, collapsed (it can run to 8 KB), with a copy button;
// null when the attempt kept none (Retry, Fail, a killed worker).
export function tracebackBlock(error) {
  if (!error || !error.traceback) return null;
  // the copy button sits with the open traceback, not in the summary: a click anywhere
  // on the summary opens it
  return h("details", { class: "traceback", "data-traceback": String(error.attempt) },
    h("summary", null, "Traceback"),
    h("div", { class: "traceback-copy" }, copyButton(error.traceback, "traceback")),
    h("pre", { class: "code mono", tabindex: "0", "aria-label": `Traceback of attempt ${error.attempt}` }, error.traceback));
}

function fact(label, value) {
  return h("div", null, h("dt", null, label), h("dd", null, value));
}

function eventDetail(event) {
  if (!event.detail) return null;
  if (event.event === "dead_lettered") return h("span", null, "dead letter ", h("a", { href: `#/dlq/${event.detail}` }, idText(event.detail)));
  if (event.event === "replayed") return h("span", null, "replay of job ", h("a", { href: `#/jobs/${event.detail}` }, idText(event.detail)));
  if (event.event === "retry_scheduled") return `runs again ${absolute(event.detail)}`;
  return event.detail;
}

function crumbs(queue) {
  const jobs = h("a", { href: "#/jobs" }, "Jobs");
  if (!queue) return [jobs];
  return [jobs, h("span", { class: "sep", "aria-hidden": "true" }, " / "), h("a", { href: `#/jobs?queue=${encodeURIComponent(queue)}` }, `queue ${queue}`)];
}

const TIMEOUT_SOURCES = { job: "set on the job", actor: "the actor's", node: "the node's default" };

function timeoutFact(job) {
  if (job.timeout) {
    return h("span", { "data-timeout-source": job.timeout.source }, duration(job.timeout.seconds), h("span", { class: "muted" }, ` · ${TIMEOUT_SOURCES[job.timeout.source]}`));
  }
  return job.timeout_seconds ? duration(job.timeout_seconds) : "actor or node default";
}

function deliveryState(d) {
  if (d.delivered_at) return h("span", { class: "actions" }, badge("done", { label: "delivered" }), when(d.delivered_at));
  if (d.given_up) return badge("failed", { label: "given up" });
  return h("span", { class: "actions" }, badge("pending", { label: "retrying" }), d.next_attempt_at ? ["next ", when(d.next_attempt_at)] : null);
}

function deliveriesPanel(deliveries) {
  return panel("Webhook deliveries", { sub: "each delivery and every attempt at it", id: "deliveries-title" },
    deliveries.length
      ? h("ol", { class: "timeline deliveries" }, deliveries.map((d) =>
          h("li", { class: `tone-${d.delivered_at ? "done" : d.given_up ? "failed" : "pending"}`, "data-delivery": d.id },
            h("span", { class: "mark" }, icon(d.delivered_at ? "check" : d.given_up ? "x" : "clock")),
            h("span", { class: "what" }, d.event, h("span", { class: "faint" }, ` · ${d.attempts.length} ${d.attempts.length === 1 ? "attempt" : "attempts"}`)),
            deliveryState(d),
            h("span", { class: "detail" },
              h("span", { class: "mono" }, d.url),
              h("ul", { class: "attempts" }, d.attempts.map((a) =>
                h("li", { "data-attempt-status": a.status_code ?? "none" }, when(a.at), " · ",
                  a.status_code ? h("span", { class: a.status_code >= 300 ? "bad" : null }, `HTTP ${a.status_code}`) : "no answer",
                  a.error && a.error !== `HTTP ${a.status_code}` ? h("span", { class: "bad" }, ` · ${a.error}`) : null,
                  h("span", { class: "faint" }, ` · node ${a.node}`))))))))
      : h("div", { class: "empty" }, "No delivery yet: the webhook is sent once the job finishes."));
}

export default {
  title: "Job",
  nav: "jobs",
  mount(root, { params, navigate }) {
    const id = params[0].toLowerCase();
    const head = h("div", null, pageHead(`Job ${shortId(id)}`, { crumbs: crumbs(null) }));
    const notice = h("div", { class: "banner" });
    const body = h("div", { class: "stack" }, h("div", { class: "loading" }, "Loading the job…"));
    root.append(head, notice, body);

    let job = null;
    let dead = undefined; // this job's dead letter: undefined = not looked up yet
    let lastJob = "";
    let lastEvents = "";
    let events = [];
    let deliveries = null; // the job's webhook deliveries, once looked up (it has a webhook)
    let chained = undefined; // the job its on_success or on_failure enqueued, once found

    // the job this one's template enqueued: a job whose parent is this one, of that type
    async function findChained() {
      const spec = job.status === "done" ? job.on_success : job.status === "failed" ? job.on_failure : null;
      if (!spec) {
        chained = null;
        return;
      }
      const page = await api("summary/jobs", { query: { parent_id: id, type: spec.type, limit: 1, preview: 1 }, quiet: true });
      chained = page.jobs[0] || null;
    }

    function chainFact(spec, when) {
      const fired = (when === "done" && job.status === "done") || (when === "failed" && job.status === "failed");
      const link = fired && chained && chained.type === spec.type
        ? [" → ", h("a", { href: `#/jobs/${chained.id}`, class: "mono", "data-chained": chained.id }, idText(chained.id)), " ", badge(chained.status)]
        : null;
      return h("span", { class: "mono" }, `enqueues ${spec.type}`, link);
    }

    async function findDeadLetter() {
      const page = await api("summary/dlq", { query: { job_id: id, limit: 1 }, quiet: true });
      dead = page.dead_letters[0] || null;
    }

    async function refresh() {
      const [jobData, eventData] = await Promise.all([
        api(`jobs/${id}`, { quiet: job !== null }),
        api(`jobs/${id}/events`, { quiet: true }).catch(() => ({ events })),
      ]).catch((err) => {
        if (err.status === 404) {
          live.stop();
          swap(body, callout("warn", `No job has the id ${id}. It may have been pruned after its retention; `, h("a", { href: `#/dlq?job_id=${id}` }, "look for its dead letter"), "."));
        } else {
          swap(notice, callout("bad", explain(err)));
        }
        throw err;
      });
      swap(notice);
      job = jobData;
      events = eventData.events;
      if (job.status === "failed" && dead === undefined) await findDeadLetter().catch(() => {});
      if (job.webhook_url) deliveries = (await api(`jobs/${id}/deliveries`, { quiet: true }).catch(() => null))?.deliveries ?? deliveries;
      if (chained === undefined && TERMINAL.has(job.status) && (job.on_success || job.on_failure)) await findChained().catch(() => {});
      const settled = deliveries === null || deliveries.every((d) => d.delivered_at || d.given_up);
      if (TERMINAL.has(job.status) && settled) live.stop(); // a webhook still retrying is worth watching
      const a = JSON.stringify([job, deliveries, chained]);
      const b = JSON.stringify(events);
      if (a === lastJob && b === lastEvents && job.status !== "running") return;
      lastJob = a;
      lastEvents = b;
      draw();
    }

    function draw() {
      swap(
        head,
        pageHead(h("span", { class: "job-head" }, job.type, badge(job.status, { large: true })), {
          crumbs: crumbs(job.queue),
          sub: h("span", { class: "idline" }, h("span", { class: "mono", "data-job-id": job.id }, job.id), copyButton(job.id, "job id")),
          actions: actions(),
        }),
      );
      const took = job.started_at && job.finished_at ? duration((new Date(job.finished_at) - new Date(job.started_at)) / 1000)
        : job.status === "running" && job.started_at ? `${duration((Date.now() - new Date(job.started_at)) / 1000)} so far` : "—";
      const facts = h(
        "dl",
        { class: "facts" },
        fact("Queue", h("a", { href: `#/jobs?queue=${encodeURIComponent(job.queue)}`, class: "mono" }, job.queue)),
        fact("Priority", String(job.priority)),
        fact("Attempts", `${job.attempts} of ${job.max_retries + 1}`),
        fact("Timeout", timeoutFact(job)),
        fact("Created", when(job.created_at)),
        fact(job.status === "pending" ? "Due" : "Due at", when(job.run_at)),
        fact("Started", when(job.started_at)),
        job.finished_at
          ? fact("Finished", h("span", null, when(job.finished_at), h("span", { class: "muted" }, ` · took ${took}`)))
          : fact(job.status === "running" ? "Running for" : "Took", job.status === "running" ? took.replace(" so far", "") : took),
      );
      const sections = [h("section", { class: "panel facts-panel", "aria-label": "Facts" }, facts)];
      if (job.status === "running" && job.progress !== undefined && job.progress !== null) {
        sections.push(h("section", { class: "panel progress-panel", "aria-label": "Progress" },
          h("span", { class: "muted" }, "Progress (ctx.progress)"), progressBar(job.progress)));
      }
      if (job.last_error && job.status !== "done") {
        const label = job.status === "failed" ? "Failed for good" : job.status === "pending" ? "The last attempt failed; it will be retried" : "The last attempt failed";
        const latest = job.errors[job.errors.length - 1];
        sections.push(callout("bad", h("strong", null, label), h("pre", { class: "mono" }, job.last_error), tracebackBlock(latest)));
      }
      if (job.status === "failed" && dead) {
        sections.push(callout("info", "Its dead letter ", h("a", { href: `#/dlq/${dead.id}` }, idText(dead.id)), " can be replayed as a fresh job."));
      }
      const left = [
        panel("Payload", { actions: copyButton(JSON.stringify(job.payload), "payload"), id: "payload-title" }, codeBlock(JSON.stringify(job.payload), "Payload")),
      ];
      if (job.result !== null && job.result !== undefined) {
        left.push(panel("Result", { id: "result-title" }, codeBlock(JSON.stringify(job.result), "Result")));
      }
      if (job.errors.length > 1) { // one error is already in the notice above and in the events
        left.push(
          panel("Errors by attempt", { id: "errors-title" },
            h("ol", { class: "timeline" }, job.errors.map((error) =>
              h("li", { class: "tone-failed" },
                h("span", { class: "mark" }, icon("x")),
                h("span", { class: "what" }, `Attempt ${error.attempt}`),
                when(error.at),
                h("span", { class: "detail mono" }, error.error),
                tracebackBlock(error))))),
        );
      }
      const details = [];
      if (job.workflow_id) {
        details.push(["Workflow", h("span", null,
          h("a", { href: `#/workflows/${job.workflow_id}`, class: "mono", "data-workflow": job.workflow_id }, idText(job.workflow_id)),
          job.step_key ? h("span", { class: "muted" }, ` · step ${job.step_key}`) : null)]);
      }
      if (job.parent_ids && job.parent_ids.length) {
        details.push(["After", h("span", { class: "actions" }, job.parent_ids.map((parent) =>
          h("a", { href: `#/jobs/${parent}`, class: "mono", "data-step-parent": parent }, idText(parent))))]);
      }
      if (job.parent_id) details.push(["Parent", h("a", { href: `#/jobs/${job.parent_id}`, class: "mono" }, idText(job.parent_id))]);
      if (job.on_success) details.push(["On success", chainFact(job.on_success, "done")]);
      if (job.on_failure) details.push(["On failure", chainFact(job.on_failure, "failed")]);
      if (job.dedupe_key) details.push(["Dedupe key", h("span", { class: "mono" }, job.dedupe_key)]);
      if (job.webhook_url) details.push(["Webhook", h("span", { class: "mono" }, job.webhook_url)]);
      details.push(["Updated", when(job.updated_at)]);
      if (deliveries !== null) left.push(deliveriesPanel(deliveries));
      const right = [
        panel("Events", { sub: "the audit trail, oldest first", id: "events-title" },
          events.length
            ? h("ol", { class: "timeline" }, events.map((event) => {
                const [name, tone, label] = EVENTS[event.event] || ["activity", "", event.event];
                return h("li", { class: `tone-${tone}`, "data-event": event.event },
                  h("span", { class: "mark" }, icon(name)),
                  h("span", { class: "what" }, label, event.attempt ? h("span", { class: "faint" }, ` · attempt ${event.attempt}`) : null),
                  when(event.at),
                  h("span", { class: "detail" }, eventDetail(event), event.detail ? " · " : "", `node ${event.node}`));
              }))
            : h("div", { class: "empty" }, "No events recorded.")),
        panel("Details", { id: "details-title" }, h("div", { class: "body" }, h("dl", { class: "kv" }, details.map(([label, value]) => [h("dt", null, label), h("dd", null, value)])))),
      ];
      swap(body, ...sections, h("div", { class: "grid-2" }, h("div", { class: "stack" }, left), h("div", { class: "stack" }, right)));
    }

    function actions() {
      const out = [];
      if (job.status === "pending") {
        out.push(h("button", { class: "danger", "data-focus": "cancel", "data-action": "cancel", onclick: cancel }, icon("ban"), "Cancel"));
      }
      if (job.status === "running") {
        out.push(h("button", { class: "danger", "data-focus": "force", "data-action": "force-cancel", onclick: forceCancel }, icon("ban"), "Force-cancel"));
      }
      if (job.status === "failed" && dead) {
        out.push(h("button", { class: "primary", "data-focus": "replay", "data-action": "replay", onclick: replay }, icon("replay"), "Replay"));
      }
      return out.length ? out : null;
    }

    async function cancel() {
      const ok = await confirmAction({
        title: `Cancel this ${job.type} job?`,
        what: ["It will not run: it leaves the queue and ends cancelled.", "This cannot be undone (enqueue it again to run it)."],
        confirm: "Cancel the job",
      });
      if (ok) await act(() => api(`jobs/${id}`, { method: "DELETE" }), "Cancelled.");
    }

    async function forceCancel() {
      let where = "The worker process running it";
      try {
        const data = await api("workers", { quiet: true });
        const worker = data.workers.find((w) => w.job_id === id);
        if (worker) where = `Worker process ${worker.pid}, running it for ${duration(worker.running_seconds)},`;
        else where = "The worker running it (on another node, or just finishing)";
      } catch {
        // the dialog still says what will happen, without the pid
      }
      const ok = await confirmAction({
        title: `Force-cancel this running ${job.type} job?`,
        what: [
          `${where} is killed now (SIGTERM, then SIGKILL): the attempt stops mid-way, whatever it was doing.`,
          "The job ends cancelled and is not retried.",
          "A fresh worker process replaces the killed one.",
        ],
        confirm: "Kill and cancel",
      });
      if (ok) await act(() => api(`jobs/${id}`, { method: "DELETE", query: { force: "true" } }), "Cancelled; its worker was killed and is being replaced.");
    }

    async function replay() {
      try {
        const fresh = await api(`dlq/${dead.id}/replay`, { method: "POST" });
        toast("Replayed as a new job.", { link: { href: `#/jobs/${fresh.id}`, text: "Open it" } });
        navigate(`/jobs/${fresh.id}`);
      } catch (err) {
        toast(`Could not replay: ${explain(err)}`, { bad: true });
        dead = undefined;
        live.now();
      }
    }

    async function act(call, done) {
      try {
        job = await call();
        toast(done);
      } catch (err) {
        toast(explain(err), { bad: true });
      }
      lastJob = "";
      live.stop();
      live = poll(refresh, EVERY_MS); // one more look (and keep looking if it can still change)
    }

    let live = poll(refresh, EVERY_MS);
    return () => live.stop();
  },
};
