// One dead letter: the job as it was when its retries ran out, and every attempt's
// error; replay or purge it. It does not change, so it is read once.

import { api } from "../api.js";
import { h, icon, shortId, swap, when } from "../dom.js";
import { callout, explain, pageHead, panel } from "../ui.js";
import { purgeDead, replayDead } from "./dlq.js";
import { codeBlock, copyButton, tracebackBlock } from "./job.js";

export default {
  title: "Dead letter",
  nav: "dlq",
  mount(root, { params, navigate }) {
    const id = params[0].toLowerCase();
    const crumbs = [h("a", { href: "#/dlq" }, "Dead letters")];
    const head = h("div", null, pageHead(`Dead letter ${shortId(id)}`, { crumbs }));
    const body = h("div", { class: "stack" }, h("div", { class: "loading" }, "Loading…"));
    root.append(head, body);

    api(`dlq/${id}`)
      .then((dead) => {
        const job = dead.job;
        const brief = { id: dead.id, job_id: dead.job_id, type: job.type, attempts: job.attempts };
        swap(
          head,
          pageHead(`${job.type} · dead letter`, {
            crumbs,
            sub: h("span", { class: "idline" }, "of job ", h("a", { href: `#/jobs/${dead.job_id}`, class: "mono" }, dead.job_id), copyButton(dead.job_id, "job id")),
            actions: [
              h("button", { class: "primary", "data-action": "replay", onclick: () => replayDead(brief, (fresh) => navigate(`/jobs/${fresh.id}`)) }, icon("replay"), "Replay"),
              h("button", { class: "danger", "data-action": "purge", onclick: async () => { if (await purgeDead(brief)) navigate("/dlq"); } }, icon("trash"), "Purge"),
            ],
          }),
        );
        swap(
          body,
          callout("bad", h("strong", null, `Dead-lettered `, when(dead.created_at), ` after ${job.attempts} ${job.attempts === 1 ? "attempt" : "attempts"}`), h("pre", { class: "mono" }, job.last_error || ""), tracebackBlock(dead.errors[dead.errors.length - 1])),
          h(
            "div",
            { class: "grid-2" },
            panel("Payload", { id: "payload-title", sub: `queue ${job.queue} · priority ${job.priority}` }, codeBlock(JSON.stringify(job.payload), "Payload")),
            panel("Errors by attempt", { id: "errors-title" },
              h("ol", { class: "timeline" }, dead.errors.map((error) =>
                h("li", { class: "tone-failed" },
                  h("span", { class: "mark" }, icon("x")),
                  h("span", { class: "what" }, `Attempt ${error.attempt}`),
                  when(error.at),
                  h("span", { class: "detail mono" }, error.error),
                  tracebackBlock(error))))),
          ),
        );
      })
      .catch((err) => {
        swap(body, err.status === 404 ? callout("warn", `No dead letter has the id ${id}: it may have been replayed or purged.`) : callout("bad", explain(err)));
      });
    return null;
  },
};
