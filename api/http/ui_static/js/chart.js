// The overview's chart: jobs done and attempts failed per second, and pending jobs, over
// the last hour, drawn by uPlot (vendored, see vendor/uplot). Colours follow the page's
// light or dark scheme, and it redraws when the system setting changes.

import uPlot from "../vendor/uplot/uPlot.esm.js";
import { int, rate } from "./dom.js";

const HOUR = 3600;
const MIN_SPAN = 300;

function color(name) {
  return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
}

function fade(hex, alpha) {
  const match = /^#([0-9a-f]{6})$/i.exec(hex);
  if (!match) return hex;
  const n = parseInt(match[1], 16);
  return `rgba(${n >> 16}, ${(n >> 8) & 255}, ${n & 255}, ${alpha})`;
}

/** A chart in `container`; `update({x, done, failed, depth, now, first})` redraws it. */
export function throughputChart(container) {
  let plot = null;
  let data = [[], [], [], []];
  let end = Date.now() / 1000;
  let first = end;

  function build() {
    const [muted, grid, done, failed, depth] = ["--muted", "--border", "--done", "--failed", "--depth"].map(color);
    const axis = { stroke: muted, grid: { stroke: grid, width: 1 }, ticks: { stroke: grid, width: 1 } };
    plot = new uPlot(
      {
        width: Math.max(280, container.clientWidth),
        height: container.clientWidth < 500 ? 220 : 260,
        scales: {
          // the last hour; a younger node's whole life, but never under five minutes
          x: { time: true, range: () => [Math.max(end - HOUR, Math.min(first, end - MIN_SPAN)), end] },
          rate: { range: (u, min, max) => [0, Math.max(1, (max || 0) * 1.15)] },
          depth: { range: (u, min, max) => [0, Math.max(5, (max || 0) * 1.15)] },
        },
        series: [
          { value: (u, v) => (v == null ? "—" : new Date(v * 1000).toLocaleTimeString()) },
          { label: "Done/s", scale: "rate", stroke: done, fill: fade(done, 0.12), width: 1.75, value: (u, v) => (v == null ? "—" : rate(v)) },
          { label: "Failures/s", scale: "rate", stroke: failed, fill: fade(failed, 0.12), width: 1.75, value: (u, v) => (v == null ? "—" : rate(v)) },
          { label: "Pending", scale: "depth", stroke: depth, width: 1.5, dash: [6, 4], spanGaps: true, value: (u, v) => (v == null ? "—" : int(v)) },
        ],
        axes: [
          { ...axis, space: 60 },
          { ...axis, scale: "rate", size: 48 },
          { ...axis, scale: "depth", side: 1, size: 56, grid: { show: false }, stroke: depth },
        ],
        cursor: { y: false, points: { size: 6 } },
        legend: { live: true },
      },
      data,
      container,
    );
  }

  build();
  const resize = new ResizeObserver(() => {
    const width = Math.max(280, container.clientWidth);
    if (plot && Math.abs(plot.width - width) > 2) plot.setSize({ width, height: width < 500 ? 220 : 260 });
  });
  resize.observe(container);
  const scheme = matchMedia("(prefers-color-scheme: dark)");
  const rebuild = () => {
    plot.destroy();
    build();
  };
  scheme.addEventListener("change", rebuild);

  return {
    update(series) {
      end = series.now;
      first = series.first;
      data = [series.x, series.done, series.failed, series.depth];
      plot.setData(data);
    },
    destroy() {
      resize.disconnect();
      scheme.removeEventListener("change", rebuild);
      plot.destroy();
    },
  };
}
