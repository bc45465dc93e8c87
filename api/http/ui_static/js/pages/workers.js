// Workers: this node's processes (pid, state, the job each runs and for how long, memory,
// jobs done), why workers were replaced, the nodes sharing the store with their last
// heartbeat, and (on PostgreSQL) the other nodes' workers and the cluster's last minute,
// as each node published them with its heartbeat. One request every 2 s: GET /workers.

import { api } from "../api.js";
import { bytes, duration, h, idText, int, plural, relative, swap, when } from "../dom.js";
import { poll, setNode } from "../live.js";
import { badge, callout, explain, pageHead, panel, table } from "../ui.js";

const EVERY_MS = 2000;
const REASONS = {
  crash: "died on its own",
  timeout: "killed: attempt overran",
  cancel: "killed: job force-cancelled",
  lease_lost: "killed: lease lost",
  recycle: "recycled (jobs or memory limit)",
  retired: "retired (reload or fewer workers)",
  shutdown: "node stopping",
  boot: "could not load actors",
  memory: "killed: job over the memory limit",
};

export default {
  title: "Workers",
  nav: "workers",
  mount(root) {
    const notice = h("div", { class: "banner" });
    const workersBox = h("div", null, h("div", { class: "loading" }, "Loading workers…"));
    const exitsBox = h("div");
    const reasonsBox = h("div", { class: "chips" });
    const nodesBox = h("div");
    const othersBox = h("div");
    const clusterSub = h("span", null, "live while their heartbeat is recent");
    const others = panel("Workers on the other nodes", { sub: "as each node published them with its last heartbeat", id: "others-title" }, othersBox);
    others.hidden = true;
    const sub = h("span", null, "");
    root.append(
      pageHead("Workers", { sub }),
      notice,
      h(
        "div",
        { class: "stack" },
        panel(h("span", null, "Processes", h("span", { class: "per-node" }, "this node")), { sub: "each runs one job at a time; a hung one is killed at its deadline", id: "procs-title" }, workersBox),
        panel("Nodes sharing the store", { sub: clusterSub, id: "nodes-title" }, nodesBox),
        others,
        panel(h("span", null, "Replaced workers", h("span", { class: "per-node" }, "this node")), { sub: "since this node started", actions: reasonsBox, id: "exits-title" }, exitsBox),
      ),
    );

    const workerColumns = [
      { label: "PID", lead: true, class: "num", cell: (w) => h("span", { class: "mono", "data-pid": w.pid }, h("span", { class: "sm-only" }, "pid "), String(w.pid)) },
      { label: "State", cell: (w) => h("span", { class: "actions" }, badge(w.state), w.retiring ? h("span", { class: "chip", title: "replaced after its current job" }, "retiring") : null) },
      {
        label: "Current job",
        cell: (w) =>
          w.job_id
            ? h("span", { class: "idcell" }, h("a", { href: `#/jobs/${w.job_id}`, "data-focus": `job:${w.job_id}` }, w.job_type), h("span", { class: "mono" }, idText(w.job_id), ` · attempt ${w.attempt}`))
            : h("span", { class: "faint" }, "—"),
      },
      { label: "Running for", class: "r num", cell: (w) => (w.running_seconds == null ? h("span", { class: "faint" }, "—") : duration(w.running_seconds)) },
      { label: "Memory", class: "r num", cell: (w) => (w.rss_kb == null ? "—" : bytes(w.rss_kb * 1024)) },
      { label: "Jobs done", class: "r num", cell: (w) => int(w.jobs_run) },
      { label: "Slot", class: "r num", hideSm: true, cell: (w) => `${w.slot} · gen ${w.generation}` },
    ];
    const exitColumns = [
      { label: "When", class: "nowrap", cell: (e) => when(e.at) },
      { label: "PID", lead: true, cell: (e) => h("span", { class: "mono" }, String(e.pid)) },
      { label: "Why", cell: (e) => h("span", { "data-reason": e.reason }, h("b", null, e.reason), h("span", { class: "muted" }, ` · ${REASONS[e.reason] || ""}`)) },
      { label: "Exit", cell: (e) => h("span", { class: "muted" }, e.exit) },
      { label: "Job", cell: (e) => (e.job_id ? h("a", { href: `#/jobs/${e.job_id}`, class: "mono" }, idText(e.job_id)) : h("span", { class: "faint" }, "—")) },
    ];
    const nodeColumns = [
      { label: "Node", lead: true, cell: (n) => h("span", { class: "mono" }, n.node_id, n.this ? h("span", { class: "muted" }, " (this one)") : null) },
      { label: "State", cell: (n) => badge(n.live ? "live" : "lost") },
      { label: "Last heartbeat", cell: (n) => h("time", { datetime: n.heartbeat_at, title: n.heartbeat_at }, relative(n.heartbeat_at)) },
      { label: "Started", class: "nowrap", cell: (n) => when(n.started_at) },
      {
        label: "Workers",
        class: "r num nowrap",
        cell: (n) => {
          const workers = workersOf(n);
          if (!workers) return h("span", { class: "faint" }, "—");
          // this node's from its processes now, as the panel above; another's as it last said
          const age = n.this ? "now" : `as of ${relative(n.heartbeat_at)}`;
          return h(
            "span",
            null,
            h("span", { "data-node-workers": n.node_id }, `${workers.filter((w) => w.state === "busy").length} busy of ${workers.length}`),
            h("span", { class: "muted", "data-node-workers-age": n.node_id }, ` · ${age}`),
          );
        },
      },
      { label: "Done / min", class: "r num", cell: (n) => (n.report ? h("span", { "data-node-done": n.node_id }, int(n.report.done_last_minute)) : h("span", { class: "faint" }, "—")) },
      { label: "Failed / min", class: "r num", hideSm: true, cell: (n) => (n.report ? int(n.report.failed_last_minute) : h("span", { class: "faint" }, "—")) },
      { label: "Job types", class: "preview", hideSm: true, cell: (n) => h("span", { class: "mono", title: n.types.join(", ") }, n.types.join(", ") || "—") },
    ];
    const otherColumns = [
      { label: "Node", lead: true, cell: (w) => h("span", { class: "mono" }, w.node_id, h("span", { class: "muted" }, ` · pid ${w.pid}`)) },
      { label: "State", cell: (w) => h("span", { "data-other-pid": w.pid }, badge(w.state)) },
      workerColumns[2],
      { label: "Running for", class: "r num", cell: (w) => (w.running_seconds == null ? h("span", { class: "faint" }, "—") : h("span", { title: "as of its node's last heartbeat" }, duration(w.running_seconds))) },
      { label: "Jobs done", class: "r num", hideSm: true, cell: (w) => int(w.jobs_run) },
    ];

    // One source per node: this node's workers as its processes are now (the Processes
    // panel's), every other node's as its last heartbeat published them.
    let ownWorkers = [];
    const workersOf = (n) => (n.this ? ownWorkers : n.report ? n.report.workers : null);

    async function refresh() {
      let data;
      try {
        data = await api("workers", { quiet: true });
      } catch (err) {
        swap(notice, callout("bad", explain(err)));
        throw err;
      }
      swap(notice);
      setNode(data.node);
      ownWorkers = data.workers;
      const busy = data.workers.filter((w) => w.state === "busy").length;
      const c = data.count;
      const bounds = c && c.min !== c.max ? ` Scaling between ${c.min} and ${c.max}, aiming for ${c.target}.` : "";
      sub.textContent = `Node ${data.node}: ${plural(data.workers.length, "worker process", "worker processes")}, ${busy} busy.${bounds}`;
      swap(workersBox, table(workerColumns, data.workers, { empty: "No worker process is running.", caption: "Worker processes" }));
      const reasons = Object.entries(data.exits_by_reason).filter(([, n]) => n > 0);
      swap(reasonsBox, reasons.length ? reasons.map(([reason, n]) => h("span", { class: "chip", title: REASONS[reason] }, reason, " ", h("b", null, int(n)))) : h("span", { class: "muted" }, "none"));
      swap(exitsBox, table(exitColumns, data.recent_exits, { empty: "No worker has been replaced since the node started.", caption: "Replaced workers, newest first" }));
      const nodes = data.nodes.map((n) => ({ ...n, this: n.node_id === data.node }));
      swap(nodesBox, table(nodeColumns, nodes, { empty: "No node has heartbeated within the hour.", caption: "Nodes" }));
      // the cluster: every live node's published report (this node's from its heartbeat too)
      const reporting = nodes.filter((n) => n.live && n.report);
      if (reporting.length > 1) {
        const all = reporting.flatMap(workersOf);
        const done = reporting.reduce((sum, n) => sum + n.report.done_last_minute, 0);
        const failed = reporting.reduce((sum, n) => sum + n.report.failed_last_minute, 0);
        clusterSub.textContent = `Cluster, ${reporting.length} live nodes: ${all.filter((w) => w.state === "busy").length} of ${plural(all.length, "worker", "workers")} busy; ${int(done)} done and ${int(failed)} failed in the last minute.`;
        clusterSub.dataset.cluster = "";
      } else {
        clusterSub.textContent = "live while their heartbeat is recent";
      }
      const elsewhere = nodes.filter((n) => n.live && !n.this && n.report).flatMap((n) => n.report.workers.map((w) => ({ ...w, node_id: n.node_id })));
      others.hidden = !elsewhere.length;
      swap(othersBox, table(otherColumns, elsewhere, { empty: "", caption: "Workers on the other nodes" }));
    }

    const live = poll(refresh, EVERY_MS);
    return () => live.stop();
  },
};
