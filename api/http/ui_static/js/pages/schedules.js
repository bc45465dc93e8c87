// Schedules: every periodic job this node runs, its timetable, next and last fire (with
// the job the last one enqueued), enable and disable. One request every 5 s: GET
// /schedules; the switch is POST /schedules/{name}/enable or /disable.

import { api } from "../api.js";
import { h, icon, idText, when } from "../dom.js";
import { badge, explain, liveTable, pageHead, panel, toast } from "../ui.js";

const EVERY_MS = 5000;

/** "every 30 s", "cron 0 * * * * (UTC)": a schedule's timetable in words. */
export function timetable(s) {
  if (s.every_seconds) return `every ${s.every_seconds} s`;
  return `cron ${s.cron}${s.timezone ? ` (${s.timezone})` : ""}`;
}

export default {
  title: "Schedules",
  nav: "schedules",
  mount(root) {
    const notice = h("div", { class: "banner" });
    const body = h("div", null, h("div", { class: "loading" }, "Loading schedules…"));
    root.append(
      pageHead("Schedules", { sub: "Periodic jobs. A disabled schedule enqueues nothing until enabled again, on any node." }),
      notice,
      panel("All schedules", { sub: "from the node's configuration and from actors declaring a schedule", id: "schedules-title" }, body),
    );

    async function setEnabled(s, enabled) {
      try {
        await api(`schedules/${encodeURIComponent(s.name)}/${enabled ? "enable" : "disable"}`, { method: "POST" });
        toast(enabled ? `Schedule ${s.name} enabled.` : `Schedule ${s.name} disabled: it enqueues nothing until enabled.`);
      } catch (err) {
        toast(`Could not ${enabled ? "enable" : "disable"} ${s.name}: ${explain(err)}`, { bad: true });
      }
      live.now();
    }

    const columns = [
      {
        label: "Schedule",
        lead: true,
        cell: (s) => h("span", { class: "idcell" }, h("span", { class: "mono", "data-schedule": s.name }, s.name),
          h("span", { class: "muted" }, "enqueues ", h("a", { href: `#/jobs?type=${encodeURIComponent(s.type)}`, class: "mono" }, s.type))),
      },
      { label: "State", cell: (s) => h("span", { "data-state": s.name }, badge(s.enabled ? "active" : "paused", { label: s.enabled ? "enabled" : "disabled" })) },
      { label: "Runs", cell: (s) => h("span", { class: "mono" }, timetable(s)) },
      { label: "Next fire", class: "nowrap", cell: (s) => (s.next_fire ? h("span", { "data-next": s.name }, when(s.next_fire)) : h("span", { class: "faint", "data-next": s.name }, "—")) },
      {
        label: "Last fire",
        class: "nowrap",
        cell: (s) =>
          s.last_fire
            ? h("span", { class: "idcell" }, when(s.last_fire),
                s.last_job_id ? h("a", { href: `#/jobs/${s.last_job_id}`, class: "mono", "data-last-job": s.name }, idText(s.last_job_id)) : null)
            : h("span", { class: "faint" }, "never"),
      },
      { label: "Queue", hideSm: true, cell: (s) => h("span", { class: "mono" }, s.queue || "actor's") },
      { label: "Source", hideSm: true, cell: (s) => h("span", { class: "muted" }, s.source) },
      {
        label: "Actions",
        class: "r",
        cell: (s) =>
          h("button", {
            class: "small", "data-focus": `toggle:${s.name}`, "data-toggle": s.name,
            "aria-label": `${s.enabled ? "Disable" : "Enable"} schedule ${s.name}`,
            onclick: () => setEnabled(s, !s.enabled),
          }, icon(s.enabled ? "pause" : "play"), s.enabled ? "Disable" : "Enable"),
      },
    ];

    const live = liveTable({
      body,
      notice,
      columns,
      read: () => api("schedules", { quiet: true }),
      rows: (data) => data.schedules,
      empty: "No schedule: declare one on an actor (schedule=\"*/5 * * * *\") or in the node's configuration.",
      caption: "Schedules",
      everyMs: EVERY_MS,
    });
    return () => live.stop();
  },
};
