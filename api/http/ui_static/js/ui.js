// Shared pieces of the pages: status badges, tables that turn into cards on a phone,
// a pager, toasts, the confirmation dialog for destructive actions, and views kept
// current by polling.

import { h, icon, int, swap } from "./dom.js";
import { poll } from "./live.js";

const STATUS_ICONS = {
  pending: "clock",
  running: "spinner",
  done: "check",
  failed: "x",
  cancelled: "ban",
  busy: "spinner",
  idle: "pause",
  booting: "clock",
  stopping: "ban",
  paused: "pause",
  active: "play",
  live: "check",
  lost: "alert",
};

/** A status shown three ways: an icon, the word, and a colour. */
/** What a running job last reported with ctx.progress: a bar for a number 0-1 or an
 * object with `done` and `of` (or `total`), the JSON for any other object; null when
 * there is none. */
export function progressBar(progress) {
  if (progress === undefined || progress === null) return null;
  let fraction = null;
  let label = "";
  if (typeof progress === "number") {
    fraction = progress;
    label = `${Math.round(Math.min(1, Math.max(0, progress)) * 100)}%`;
  } else if (typeof progress === "object" && typeof progress.done === "number" && typeof (progress.of ?? progress.total) === "number") {
    const of = progress.of ?? progress.total;
    fraction = of > 0 ? progress.done / of : 0;
    label = `${progress.done} of ${of}`;
  }
  if (fraction === null) {
    return h("span", { class: "progress-text mono", "data-progress": "" }, JSON.stringify(progress));
  }
  const pct = Math.round(Math.min(1, Math.max(0, fraction)) * 100);
  return h("span", { class: "progress", "data-progress": String(pct) },
    // a native <progress>: the page's CSP allows no inline style to size a bar with
    h("progress", { class: "bar", role: "progressbar", value: String(pct), max: "100", "aria-valuenow": String(pct), "aria-label": `progress ${label}` }),
    h("span", { class: "label" }, label));
}

export function badge(status, { large = false, label } = {}) {
  const name = STATUS_ICONS[status] || "clock";
  const spin = name === "spinner" ? "spin" : "";
  return h(
    "span",
    { class: `badge s-${status}${large ? " lg" : ""}`, "data-status": status },
    icon(name, spin),
    label || status,
  );
}

/**
 * A table. `columns`: [{label, cell(row) -> node, class, lead, hideSm}]. On a phone each
 * row becomes a card whose cells are labelled (`data-label`); the `lead` cell heads it.
 */
export function table(columns, rows, { empty = "Nothing here.", caption } = {}) {
  if (!rows.length) return h("div", { class: "empty" }, empty);
  return h(
    "div",
    { class: "table-wrap" },
    h(
      "table",
      { class: "cards-sm" },
      caption ? h("caption", { class: "sr-only" }, caption) : null,
      h("thead", null, h("tr", null, columns.map((c) => h("th", { class: c.class, scope: "col" }, c.label)))),
      h(
        "tbody",
        null,
        rows.map((row) =>
          h(
            "tr",
            null,
            columns.map((c) =>
              h(
                "td",
                {
                  class: [c.class, c.lead ? "lead" : "", c.hideSm ? "hide-sm" : ""].join(" ").trim() || null,
                  "data-label": c.label,
                },
                c.cell(row),
              ),
            ),
          ),
        ),
      ),
    ),
  );
}

/** "1–50 of 1,234" with Previous and Next. */
export function pager({ total, limit, offset }, go, key = "pager") {
  const first = total ? offset + 1 : 0;
  const last = Math.min(offset + limit, total);
  return h(
    "div",
    { class: "pager" },
    h("span", { class: "muted num" }, total ? `${int(first)}–${int(last)} of ${int(total)}` : "0 results"),
    h(
      "div",
      { class: "actions" },
      h("button", {
        class: "small", disabled: offset <= 0, "data-focus": `${key}:prev`,
        onclick: () => go(Math.max(0, offset - limit)),
      }, "Previous"),
      h("button", {
        class: "small", disabled: last >= total, "data-focus": `${key}:next`,
        onclick: () => go(offset + limit),
      }, "Next"),
    ),
  );
}

/** A short message in the corner (read out by screen readers). */
export function toast(message, { bad = false, link } = {}) {
  const box = document.getElementById("toasts");
  const item = h(
    "div",
    { class: `toast${bad ? " bad" : ""}` },
    icon(bad ? "alert" : "check"),
    h("div", null, message, link ? [" ", h("a", { href: link.href }, link.text)] : null),
  );
  box.append(item);
  setTimeout(() => item.remove(), bad ? 9000 : 5000);
}

/**
 * Ask before doing something that cannot be undone, saying exactly what will happen.
 * Resolves true when confirmed. Escape or "Keep" cancels; the safe button has focus.
 * The answer is the button that submitted this call's own form: the dialog's `close`
 * event arrives a task later, so a new question asked at once (Keep, then Enter on the
 * same button again) would otherwise be answered by the previous one's close.
 */
export function confirmAction({ title, what, confirm, danger = true }) {
  const dialog = document.getElementById("confirm");
  const keep = h("button", { type: "submit", value: "keep", "data-autofocus": "" }, "Keep it");
  const go = h("button", { type: "submit", value: "go", class: danger ? "danger solid" : "primary" }, confirm);
  const form = h(
    "form",
    { method: "dialog" },
    h("h2", { id: "confirm-title" }, danger ? icon("alert", "lg") : null, title),
    h("ul", { class: "what" }, what.map((line) => h("li", null, line))),
    h("div", { class: "foot" }, keep, go),
  );
  dialog.replaceChildren(form);
  dialog.setAttribute("aria-labelledby", "confirm-title");
  return new Promise((resolve) => {
    const settle = (answer) => {
      dialog.removeEventListener("close", onClose);
      resolve(answer);
    };
    const onClose = () => {
      if (!dialog.open) settle(false); // Escape; a stale close finds the next question open
    };
    form.addEventListener("submit", (event) => settle(event.submitter?.value === "go"), { once: true });
    dialog.addEventListener("close", onClose);
    dialog.returnValue = "";
    dialog.showModal();
    keep.focus();
  });
}

/** A panel: a header (title, optional note and actions) and a body. */
export function panel(title, { sub, actions, id } = {}, ...body) {
  return h(
    "section",
    { class: "panel", "aria-labelledby": id },
    h("header", null,
      h("div", null, h("h2", { id }, title), sub ? h("div", { class: "sub" }, sub) : null),
      actions ? h("div", { class: "actions" }, actions) : null),
    ...body,
  );
}

/** A page's title block. */
export function pageHead(title, { sub, actions, crumbs } = {}) {
  return h(
    "div",
    { class: "page-head" },
    h("div", null,
      crumbs ? h("div", { class: "crumbs" }, crumbs) : null,
      h("h1", { tabindex: "-1" }, title),
      sub ? h("div", { class: "sub" }, sub) : null),
    actions ? h("div", { class: "actions" }, actions) : null,
  );
}

/** A notice: problems with an icon and words. */
export function callout(kind, ...content) {
  const name = kind === "info" ? "activity" : "alert";
  return h("div", { class: `callout ${kind}`, role: kind === "bad" ? "alert" : null }, icon(name), h("div", null, ...content));
}

/** Say what went wrong with a call in words an operator can act on. */
export function explain(err) {
  if (!err) return "";
  if (err.status === 401) return "This node needs an API key for that. Enter it with the key button.";
  if (err.status === 0) return err.message;
  return `${err.message} (HTTP ${err.status})`;
}

/**
 * A view kept current: `read()` every `everyMs`, and `draw(answer)` only when the answer
 * changed. A failed read shows in `notice` until one succeeds. Returns the poll's
 * {stop, now} (`now()` after an action).
 */
export function liveView({ notice, read, draw, everyMs }) {
  let last = "";
  async function refresh() {
    let data;
    try {
      data = await read();
    } catch (err) {
      swap(notice, callout("bad", explain(err)));
      throw err;
    }
    swap(notice);
    const text = JSON.stringify(data);
    if (text === last) return;
    last = text;
    draw(data);
  }
  return poll(refresh, everyMs);
}

/** A table kept current (see `liveView`): the rows `rows(answer)` drawn into `body`. */
export function liveTable({ body, rows, columns, empty, caption, ...view }) {
  return liveView({ ...view, draw: (data) => swap(body, table(columns, rows(data), { empty, caption })) });
}
