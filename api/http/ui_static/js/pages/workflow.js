// One workflow's graph: its steps in layers (a step sits one layer below the deepest step
// it waits for), each coloured by its status and linking to its job, with the keys it
// waits for under it. One request every 2 s: GET /workflows/{id}.

import { api } from "../api.js";
import { h, int, swap } from "../dom.js";
import { badge, liveView, pageHead, panel } from "../ui.js";

const EVERY_MS = 2000;

/** The steps by layer: roots first, each step below every step it waits for. */
function layers(steps) {
  const byKey = new Map(steps.map((s) => [s.key, s]));
  const depth = new Map();
  for (const step of steps) {
    // steps come parents first, so each parent's depth is known already
    const parents = step.after.filter((k) => byKey.has(k)).map((k) => depth.get(k) ?? 0);
    depth.set(step.key, parents.length ? Math.max(...parents) + 1 : 0);
  }
  const rows = [];
  for (const step of steps) (rows[depth.get(step.key)] ||= []).push(step);
  return rows;
}

function node(step) {
  return h(
    "a",
    { class: `step s-${step.status}`, href: `#/jobs/${step.id}`, "data-step": step.key, "data-status": step.status },
    h("span", { class: "step-key mono" }, step.key),
    badge(step.status),
    step.after.length ? h("span", { class: "step-after faint" }, `after ${step.after.join(", ")}`) : null,
  );
}

export default {
  title: "Workflow",
  nav: "workflows",
  mount(root, route) {
    const id = route.params[0];
    const notice = h("div", { class: "banner" });
    const head = h("div");
    const body = h("div", null, h("div", { class: "loading" }, "Loading the workflow…"));
    root.append(head, notice, panel("Steps", { sub: "each below the steps it waits for", id: "graph-title" }, body));
    const live = liveView({
      notice,
      read: () => api(`workflows/${encodeURIComponent(id)}`, { quiet: true }),
      draw: (wf) => {
        const done = wf.jobs.filter((s) => s.status === "done").length;
        swap(
          head,
          pageHead(h("span", { class: "job-head" }, wf.name, badge(wf.status, { large: true })), {
            sub: `${int(done)} of ${int(wf.jobs.length)} steps done`,
            crumbs: [h("a", { href: "#/workflows" }, "Workflows")],
          }),
        );
        swap(body, h("div", { class: "graph", "data-workflow": wf.id }, layers(wf.jobs).map((row, i) => h("div", { class: "layer", "data-layer": i }, row.map(node)))));
      },
      everyMs: EVERY_MS,
    });
    return () => live.stop();
  },
};
