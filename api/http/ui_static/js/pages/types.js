// Job types: per type, how many jobs are in each status, the p50 and p95 run time of the
// finished ones and their failure rate, over the jobs the store keeps (finished ones
// until pruned). One request every 10 s: GET /summary/types. A typed actor's parameters
// come from its payload's schema in /openapi.json (read once per visit). Below, for the
// types with a per-key limit, the keys at it and the jobs waiting on them: GET
// /summary/keys, as often (the panel shows only when some type has such a limit).

import { api } from "../api.js";
import { duration, h, int } from "../dom.js";
import { liveTable, pageHead, panel } from "../ui.js";

const EVERY_MS = 10000;
const SHOWN = ["pending", "running", "done", "failed", "cancelled"];
const HIGH_FAILURE = 0.1; // worth a look

function count(t, status) {
  const n = status === "running" ? t.counts.running + t.counts.claimed : t.counts[status];
  if (!n) return h("span", { class: "faint" }, "0");
  return h("a", { href: `#/jobs?type=${encodeURIComponent(t.type)}&status=${status}`, "data-count": `${t.type}:${status}` }, int(n));
}

function seconds(value) {
  return value == null ? h("span", { class: "faint" }, "—") : duration(value);
}

export function percent(rate) {
  if (rate == null) return "—";
  return `${(rate * 100).toFixed(rate < 0.1 && rate > 0 ? 1 : 0)}%`;
}

const REF = "#/components/schemas/";

function typeLabel(schema, schemas) {
  if (!schema) return "any";
  if (schema.$ref) return schema.$ref.slice(REF.length).split(".").pop();
  if (schema.anyOf) return schema.anyOf.map((s) => typeLabel(s, schemas)).join(" | ");
  if (schema.enum) return schema.enum.map((v) => JSON.stringify(v)).join(" | ");
  if (schema.type === "array") return `list[${typeLabel(schema.items, schemas)}]`;
  if (schema.type === "object" && schema.additionalProperties) return `dict[${typeLabel(schema.additionalProperties, schemas)}]`;
  return schema.format || schema.type || "any";
}

/** A typed job type's parameters, one per line: `name: type = default`; classic: any JSON. */
export function parameters(type, schemas) {
  const schema = schemas && schemas[`payload.${type.replaceAll(":", "_")}`];
  if (!schema) return h("span", { class: "faint", "data-params": type }, "any JSON");
  const required = new Set(schema.required || []);
  const props = schema.properties || {};
  if (!Object.keys(props).length) return h("span", { class: "faint", "data-params": type }, "none");
  return h(
    "span",
    { class: "mono", "data-params": type },
    ...Object.entries(props).map(([name, prop], i) =>
      h(
        "span",
        { class: "param" },
        i ? ", " : "",
        h("b", null, name),
        `: ${typeLabel(prop, schemas)}`,
        required.has(name) || !("default" in prop) ? "" : ` = ${JSON.stringify(prop.default)}`,
      ),
    ),
  );
}

function heldKeys(t) {
  if (!t.keys.length) return h("span", { class: "faint" }, "—");
  return h(
    "span",
    { class: "mono", "data-held": t.type },
    ...t.keys.map((k, i) =>
      h(
        "span",
        { class: "param" },
        i ? ", " : "",
        h("a", { href: `#/jobs?type=${encodeURIComponent(t.type)}&concurrency_key=${encodeURIComponent(k.key)}` }, k.key),
        ` ${int(k.running)} running, ${int(k.waiting)} waiting`,
      ),
    ),
  );
}

/** Flow control by key: per type with a per-key limit, the keys at it and what waits. */
function keysPanel(root) {
  const notice = h("div", { class: "banner" });
  const body = h("div", null);
  const section = panel(
    "Keys at their limit",
    { sub: "per type with a key_concurrency: its keys running that many jobs, and the due jobs waiting on them", id: "keys-title" },
    body,
  );
  section.hidden = true;
  root.append(notice, section);
  const columns = [
    { label: "Type", lead: true, cell: (t) => h("span", { class: "mono" }, t.type) },
    { label: "Per key", class: "r num", cell: (t) => h("span", { "data-key-limit": t.type }, int(t.key_concurrency)) },
    { label: "Keys at limit", class: "r num", cell: (t) => h("span", { "data-keys-at-limit": t.type }, int(t.keys_at_limit)) },
    { label: "Waiting on a key", class: "r num", cell: (t) => h("span", { "data-key-waiting": t.type }, int(t.waiting)) },
    { label: "Keys with the most waiting", cell: heldKeys },
  ];
  return liveTable({
    body,
    notice,
    columns,
    read: async () => {
      const data = await api("summary/keys", { quiet: true });
      section.hidden = !data.types.length;
      return data;
    },
    rows: (data) => data.types,
    empty: "No type has a per-key limit.",
    caption: "Keys at their limit",
    everyMs: EVERY_MS,
  });
}

export default {
  title: "Job types",
  nav: "types",
  mount(root) {
    const notice = h("div", { class: "banner" });
    const body = h("div", null, h("div", { class: "loading" }, "Loading job types…"));
    root.append(
      pageHead("Job types", { sub: "Every type among the jobs the store keeps, cluster-wide: finished jobs count until they are pruned." }),
      notice,
      panel("Per type", { sub: "run time of each finished job's last attempt; failure rate = failed / (done + failed)", id: "types-title" }, body),
    );

    const columns = [
      { label: "Type", lead: true, cell: (t) => h("a", { href: `#/jobs?type=${encodeURIComponent(t.type)}`, class: "mono", "data-type": t.type }, t.type) },
      ...SHOWN.map((status) => ({ label: status[0].toUpperCase() + status.slice(1), class: "r num", cell: (t) => count(t, status) })),
      { label: "p50", class: "r num", cell: (t) => h("span", { "data-p50": t.type }, seconds(t.p50_seconds)) },
      { label: "p95", class: "r num", cell: (t) => h("span", { "data-p95": t.type }, seconds(t.p95_seconds)) },
      {
        label: "Failure rate",
        class: "r num",
        cell: (t) => h("span", { "data-rate": t.type, class: t.failure_rate > HIGH_FAILURE ? "bad" : null }, percent(t.failure_rate)),
      },
      { label: "Parameters", cell: (t) => parameters(t.type, schemas) },
    ];

    let schemas = null; // the payload schemas of /openapi.json, read on the first refresh
    const read = async () => {
      if (schemas === null) {
        const doc = await api("openapi.json", { quiet: true }).catch(() => null);
        schemas = (doc && doc.components && doc.components.schemas) || {};
      }
      return api("summary/types", { quiet: true });
    };

    const live = liveTable({
      body,
      notice,
      columns,
      read,
      rows: (data) => data.types,
      empty: "No jobs yet.",
      caption: "Job types",
      everyMs: EVERY_MS,
    });
    const keys = keysPanel(root);
    return () => {
      live.stop();
      keys.stop();
    };
  },
};
