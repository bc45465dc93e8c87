// Workflows: each with its status and progress (steps done of all), newest first.
// One request every 3 s: GET /workflows.

import { api } from "../api.js";
import { h, int, when } from "../dom.js";
import { badge, liveTable, pageHead, panel } from "../ui.js";

const EVERY_MS = 3000;

function progress(wf) {
  const done = wf.jobs.filter((s) => s.status === "done").length;
  return h("span", { class: "num", "data-progress": wf.id }, `${int(done)} / ${int(wf.jobs.length)}`);
}

export default {
  title: "Workflows",
  nav: "workflows",
  mount(root) {
    const notice = h("div", { class: "banner" });
    const body = h("div", null, h("div", { class: "loading" }, "Loading workflows…"));
    root.append(
      pageHead("Workflows", { sub: "Jobs that wait for others: each step runs once every step it waits for is done." }),
      notice,
      panel("Newest first", { id: "workflows-title" }, body),
    );
    const columns = [
      { label: "Workflow", lead: true, cell: (wf) => h("a", { href: `#/workflows/${wf.id}`, "data-workflow": wf.id }, wf.name) },
      { label: "Status", cell: (wf) => badge(wf.status) },
      { label: "Steps done", class: "r", cell: progress },
      { label: "Created", hideSm: true, cell: (wf) => when(wf.created_at) },
    ];
    const live = liveTable({
      body,
      notice,
      columns,
      read: () => api("workflows", { query: { limit: 50 }, quiet: true }),
      rows: (data) => data.workflows,
      empty: "No workflow yet.",
      caption: "Workflows",
      everyMs: EVERY_MS,
    });
    return () => live.stop();
  },
};
