// Overview: counts by status, dead letters, workers, the busiest queues, and the last
// hour's throughput. One request every 2 s: GET /stats/history?since=<last bucket>,
// which answers only the buckets the chart does not have yet.

import { api } from "../api.js";
import { throughputChart } from "../chart.js";
import { h, icon, int, plural, rate, relative, swap } from "../dom.js";
import { poll, setDeadCount, setNode } from "../live.js";
import { callout, pageHead, panel } from "../ui.js";

const EVERY_MS = 2000;
const KEEP = 720; // buckets: an hour of 5 s

const CARDS = [
  ["pending", "Pending", "clock"],
  ["running", "Running", "spinner"],
  ["done", "Done", "check"],
  ["failed", "Failed", "x"],
  ["cancelled", "Cancelled", "ban"],
];

function queuesWaiting(n) {
  if (n === 0) return "no queue waiting";
  if (n === 1) return "in 1 queue";
  return n >= 10 ? "in 10+ queues" : `in ${n} queues`;
}

export default {
  title: "Overview",
  nav: "overview",
  mount(root) {
    const sub = h("span", null, "Loading…");
    const notice = h("div", { class: "banner" });
    const cards = h("div", { class: "cards", role: "list", "aria-label": "Jobs by status" });
    const chartBox = h("div", { class: "chart", role: "img", "aria-label": "Jobs done and failed per second, and pending jobs, over the last hour" });
    const rates = h("div", { class: "rates" });
    const chartNote = h("div", { class: "chart-note" });
    const workerBox = h("div", { class: "body" });
    const queueBox = h("div", { class: "body" });
    root.append(
      pageHead("Overview", { sub }),
      notice,
      cards,
      h(
        "div",
        { class: "grid-2" },
        panel(h("span", null, "Last hour", h("span", { class: "per-node", title: "done and failed: this node's attempts; pending: the whole store" }, "this node")), { sub: "per 5 seconds", actions: rates, id: "chart-title" }, chartBox, chartNote),
        h(
          "div",
          { class: "stack" },
          panel(h("span", null, "Workers", h("span", { class: "per-node", title: "worker processes of the node serving this page" }, "this node")), { actions: h("a", { href: "#/workers" }, "All workers"), id: "workers-title" }, workerBox),
          panel("Busiest queues", { actions: h("a", { href: "#/queues" }, "All queues"), id: "queues-title" }, queueBox),
        ),
      ),
    );

    const chart = throughputChart(chartBox);
    const series = { start: [], done: [], failed: [], depth: [] };
    let width = 5;
    let since = 0;

    function merge(incoming) {
      // the server answers from `since` on: drop what we had from there, append the rest
      const keep = series.start.findIndex((start) => start >= since);
      for (const name of Object.keys(series)) {
        if (keep >= 0) series[name].splice(keep);
        series[name].push(...incoming[name]);
        series[name].splice(0, Math.max(0, series[name].length - KEEP));
      }
      if (series.start.length) since = series.start[series.start.length - 1];
    }

    async function refresh() {
      const data = await api("stats/history", { query: { since }, quiet: true });
      width = data.bucket_seconds;
      merge(data.series);
      setNode(data.node);
      drawChart(data);
      drawCards(data);
      drawWorkers(data.workers);
      drawQueues(data.latest);
      sub.textContent = `Node ${data.node} · refreshed every ${EVERY_MS / 1000} s`;
      swap(
        notice,
        data.store_error
          ? callout("bad", h("strong", null, "The store is not answering. "), "Counts below are from ", data.latest ? relative(data.latest.at) : "before", "; the chart still shows this node's own work.")
          : null,
      );
    }

    function drawChart(data) {
      const n = series.start.length;
      // the newest bucket is still filling: its rate would read low, so the lines stop
      // at the last whole bucket while the depth line runs to the latest reading
      const perSecond = (counts) => counts.map((count, i) => (i === n - 1 ? null : count / width));
      chart.update({
        first: series.start.length ? series.start[0] : data.now,
        x: series.start.map((start) => Math.min(start + width, data.now)), // the newest: now
        done: perSecond(series.done),
        failed: perSecond(series.failed),
        depth: series.depth,
        now: data.now,
      });
      const whole = Math.min(12, n - 1); // the last minute of whole buckets
      const sum = (counts) => counts.slice(n - 1 - whole, n - 1).reduce((a, b) => a + b, 0);
      const seconds = Math.max(1, whole * width);
      swap(
        rates,
        h("span", null, "Last minute: ", h("b", null, rate(sum(series.done) / seconds)), " done/s"),
        h("span", null, h("b", null, rate(sum(series.failed) / seconds)), " failures/s"),
      );
      chartNote.textContent = `Done and failures: attempts finished on this node (${data.node}). Pending: all jobs waiting in the store, read while someone watches (gaps where nobody did).`;
    }

    function drawCards(data) {
      const latest = data.latest;
      const counts = latest ? latest.counts : {};
      const lastMinute = (counts2) => counts2.slice(-13, -1).reduce((a, b) => a + b, 0);
      const hints = {
        pending: latest ? queuesWaiting(latest.busiest.length) : "",
        running: latest ? "attempts in progress" : "",
        done: latest ? `+${int(lastMinute(series.done))} last minute (this node)` : "",
        failed: latest ? `${plural(lastMinute(series.failed), "failed attempt", "failed attempts")} last minute` : "",
        cancelled: latest ? "by an operator or a client" : "",
      };
      swap(
        cards,
        ...CARDS.map(([status, label, name]) =>
          h(
            "a",
            { class: `card tone-${status}`, href: `#/jobs?status=${status}`, role: "listitem", "data-focus": `card:${status}`, "data-status": status },
            h("span", { class: "label" }, icon(name), label),
            h("span", { class: "value", "data-count": status }, latest ? int(counts[status] || 0) : "—"),
            h("span", { class: "hint" }, hints[status]),
          ),
        ),
        h(
          "a",
          { class: "card tone-dead", href: "#/dlq", role: "listitem", "data-focus": "card:dlq" },
          h("span", { class: "label" }, icon("inbox"), "Dead letters"),
          h("span", { class: "value", "data-count": "dead_letters" }, latest ? int(latest.dead_letters) : "—"),
          h("span", { class: "hint" }, "to replay or purge"),
        ),
      );
      if (latest) setDeadCount(latest.dead_letters);
    }

    function drawWorkers(workers) {
      const busy = workers.busy || 0;
      const idle = workers.idle || 0;
      const other = (workers.booting || 0) + (workers.stopping || 0);
      const total = busy + idle + other;
      const meter = h("div", { class: "meter", role: "img", "aria-label": `${busy} busy and ${idle} idle of ${total} workers` },
        h("span", { class: "busy" }), h("span", { class: "idle" }));
      meter.children[0].style.width = `${total ? (busy / total) * 100 : 0}%`;
      meter.children[1].style.width = `${total ? (idle / total) * 100 : 0}%`;
      swap(
        workerBox,
        h("div", { class: "rates" },
          h("span", null, h("b", { "data-workers": "busy" }, int(busy)), " busy"),
          h("span", null, h("b", { "data-workers": "idle" }, int(idle)), " idle"),
          other ? h("span", null, h("b", null, int(other)), " starting or stopping") : null),
        h("div", { class: "meter-wrap" }, meter),
      );
    }

    function drawQueues(latest) {
      if (!latest) return;
      if (!latest.busiest.length) {
        swap(queueBox, h("div", { class: "muted" }, "No job is waiting in any queue."));
        return;
      }
      const top = latest.busiest[0].pending;
      swap(
        queueBox,
        h(
          "ul",
          { class: "bars" },
          latest.busiest.slice(0, 6).map((queue) => {
            const bar = h("span");
            bar.style.width = `${Math.max(2, (queue.pending / top) * 100)}%`;
            return h(
              "li",
              null,
              h("a", { href: `#/jobs?queue=${encodeURIComponent(queue.name)}&status=pending`, "data-focus": `q:${queue.name}` }, queue.name),
              h("span", { class: "num muted" }, int(queue.pending)),
              h("div", { class: "bar", "aria-hidden": "true" }, bar),
            );
          }),
        ),
      );
    }

    drawCards({ latest: null, workers: {} }); // the shape at once, numbers when they come
    const live = poll(refresh, EVERY_MS);
    return () => {
      live.stop();
      chart.destroy();
    };
  },
};
