// Jobs: filter by status, type and queue, find one by id, page through. Rows come from
// GET /summary/jobs, whose payloads and results are cut to a preview by the store (a
// running job's progress under its status); the page refreshes every 5 s while "Live" is on.

import { api } from "../api.js";
import { duration, h, int, idText, swap, when } from "../dom.js";
import { poll } from "../live.js";
import { badge, callout, explain, pageHead, pager, progressBar, table } from "../ui.js";

const EVERY_MS = 5000;
const LIMIT = 25;
const STATUSES = ["waiting", "pending", "claimed", "running", "done", "failed", "cancelled"];
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

export function jobDuration(job) {
  if (job.started_at && job.finished_at) return duration((new Date(job.finished_at) - new Date(job.started_at)) / 1000);
  if (job.started_at && job.status === "running") return h("span", { class: "muted" }, `${duration((Date.now() - new Date(job.started_at)) / 1000)} so far`);
  return h("span", { class: "faint" }, "—");
}

export default {
  title: "Jobs",
  nav: "jobs",
  mount(root, { query, navigate }) {
    const filters = {
      status: STATUSES.includes(query.get("status")) ? query.get("status") : "",
      type: query.get("type") || "",
      queue: query.get("queue") || "",
      concurrency_key: query.get("concurrency_key") || "",
      offset: Math.max(0, Number.parseInt(query.get("offset") || "0", 10) || 0),
    };
    const go = (changes) => navigate("/jobs", { ...filters, offset: 0, ...changes }, { replace: true });

    const statusButtons = h(
      "div",
      { class: "segmented", role: "group", "aria-label": "Status" },
      ["", ...STATUSES].map((status) =>
        h("button", {
          type: "button", "aria-pressed": String(filters.status === status), "data-filter-status": status || "all",
          onclick: () => go({ status }),
        }, status || "All"),
      ),
    );
    const typeInput = h("input", { id: "f-type", name: "type", value: filters.type, placeholder: "any type", list: "known-types", autocomplete: "off" });
    const queueInput = h("input", { id: "f-queue", name: "queue", value: filters.queue, placeholder: "any queue", autocomplete: "off" });
    const idInput = h("input", { id: "f-id", name: "id", placeholder: "job or dead-letter id", autocomplete: "off", spellcheck: "false" });
    const types = h("datalist", { id: "known-types" });
    const liveBox = h("input", { type: "checkbox", id: "live-toggle", checked: true });
    const notice = h("div");
    const body = h("div", null, h("div", { class: "loading" }, "Loading jobs…"));

    const filterForm = h(
      "form",
      { class: "toolbar", onsubmit: (event) => { event.preventDefault(); go({ type: typeInput.value.trim(), queue: queueInput.value.trim() }); } },
      h("div", { class: "field" }, h("span", null, "Status"), statusButtons),
      h("label", { class: "field", for: "f-type" }, "Type", typeInput),
      h("label", { class: "field", for: "f-queue" }, "Queue", queueInput),
      h("button", { type: "submit" }, "Filter"),
      filters.type || filters.queue || filters.status || filters.concurrency_key ? h("button", { type: "button", class: "link", onclick: () => go({ status: "", type: "", queue: "", concurrency_key: "" }) }, "Clear filters") : null,
      types,
    );
    const findForm = h(
      "form",
      { class: "toolbar", role: "search", onsubmit: (event) => { event.preventDefault(); find(idInput.value.trim()); } },
      h("label", { class: "field grow", for: "f-id" }, "Find by id", idInput),
      h("button", { type: "submit" }, "Open"),
      h("label", { class: "check end", for: "live-toggle" }, liveBox, "Live (every 5 s)"),
    );
    // On a phone the filters fold behind one button, so the first jobs show on the first
    // screen; with a filter set the button says how many.
    const active = [filters.status, filters.type, filters.queue].filter(Boolean).length;
    const filterBox = h("div", { class: "filters", id: "job-filters" }, filterForm, findForm);
    const filterToggle = h("button", {
      type: "button", class: "small filter-toggle", "aria-expanded": "false", "aria-controls": "job-filters",
      onclick: () => {
        const open = !filterBox.classList.contains("open");
        filterBox.classList.toggle("open", open);
        filterToggle.setAttribute("aria-expanded", String(open));
      },
    }, `Filters${active ? ` (${active} set)` : ""}`);
    root.append(
      pageHead("Jobs", { sub: "Newest first. Long payloads and results are cut; open a job to see all of it." }),
      h("section", { class: "panel", "aria-label": "Jobs" }, h("div", { class: "filter-bar" }, filterToggle), filterBox, notice, body),
    );

    async function find(id) {
      if (!UUID.test(id)) {
        swap(notice, callout("warn", "An id is a UUID, like 0b6a6c1e-4c1f-4c55-9b0a-6a0a3f5c2e11."));
        return;
      }
      try {
        await api(`jobs/${id}`);
        navigate(`/jobs/${id.toLowerCase()}`);
      } catch (err) {
        if (err.status !== 404) throw err;
        try {
          await api(`dlq/${id}`);
          navigate(`/dlq/${id.toLowerCase()}`);
        } catch {
          swap(notice, callout("warn", `No job or dead letter has the id ${id}.`));
        }
      }
    }

    const columns = [
      { label: "Status", cell: (job) => h("div", { class: "status-cell" }, badge(job.status), progressBar(job.progress)) },
      {
        label: "Job",
        lead: true,
        cell: (job) =>
          h("div", { class: "idcell" },
            h("a", { href: `#/jobs/${job.id}`, "data-focus": `job:${job.id}`, "data-job": job.id }, job.type),
            idText(job.id)),
      },
      { label: "Queue", cell: (job) => h("span", { class: "mono" }, job.queue) },
      { label: "Priority", class: "r num", hideSm: true, cell: (job) => job.priority },
      { label: "Attempts", class: "r num", cell: (job) => `${job.attempts} / ${job.max_retries + 1}` },
      {
        label: "Payload",
        class: "preview",
        cell: (job) => h("span", { class: "mono", title: job.payload.truncated ? `${job.payload.size} bytes, cut` : null }, job.payload.text + (job.payload.truncated ? "…" : "")),
      },
      {
        label: "Result or error",
        class: "preview",
        hideSm: true,
        cell: (job) =>
          job.last_error && job.status !== "done"
            ? h("span", { class: "mono bad" }, job.last_error.text + (job.last_error.truncated ? "…" : ""))
            : job.result
              ? h("span", { class: "mono" }, job.result.text + (job.result.truncated ? "…" : ""))
              : h("span", { class: "faint" }, "—"),
      },
      { label: "Created", class: "nowrap", cell: (job) => when(job.created_at) },
      { label: "Took", class: "r nowrap", hideSm: true, cell: (job) => jobDuration(job) },
    ];

    let last = "";
    async function refresh() {
      const data = await api("summary/jobs", {
        query: { status: filters.status, type: filters.type, queue: filters.queue, concurrency_key: filters.concurrency_key, limit: LIMIT, offset: filters.offset },
        quiet: last !== "",
      }).catch((err) => {
        swap(body, callout("bad", explain(err)));
        throw err;
      });
      const text = JSON.stringify(data);
      if (text === last) return;
      last = text;
      const what = [
        filters.status,
        filters.type && `of type ${filters.type}`,
        filters.queue && `in queue ${filters.queue}`,
        filters.concurrency_key && `of key ${filters.concurrency_key}`,
      ].filter(Boolean).join(" ");
      swap(
        body,
        table(columns, data.jobs, { empty: what ? `No ${what} jobs.` : "No jobs yet. Enqueue one with POST /jobs.", caption: "Jobs" }),
        data.total > LIMIT || filters.offset ? pager(data, (offset) => go({ offset })) : h("div", { class: "pager" }, h("span", { class: "muted num" }, `${int(data.total)} ${data.total === 1 ? "job" : "jobs"}`)),
      );
    }

    api("workers", { quiet: true })
      .then((data) => {
        const known = new Set(data.nodes.flatMap((node) => node.types));
        types.replaceChildren(...[...known].sort().map((type) => h("option", { value: type })));
      })
      .catch(() => {});

    let live = poll(refresh, EVERY_MS);
    liveBox.addEventListener("change", () => {
      if (liveBox.checked) live = poll(refresh, EVERY_MS);
      else live.stop();
    });
    return () => live.stop();
  },
};
