// Building the page: a tiny element helper (text is always set as text, never parsed as
// HTML, since payloads and errors are user data), icons, and formatting.

const SVG = "http://www.w3.org/2000/svg";

/** h("a", {href, class, onclick, dataset}, ...children): an element. */
export function h(tag, props, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") el.className = value;
    else if (key === "dataset") Object.assign(el.dataset, value);
    else if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else if (key === "text") el.textContent = value;
    else el.setAttribute(key, value === true ? "" : value);
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    if (Array.isArray(child)) append(el, child);
    else el.append(child instanceof Node ? child : String(child));
  }
}

// Icons: 24x24 strokes, drawn with paths (no icon font, no network).
const PATHS = {
  clock: ["c12,12,9", "M12 7v5l3 2"],
  play: ["M8 5.5v13l10.5-6.5z"],
  pause: ["M9 5v14", "M15 5v14"],
  spinner: ["M12 3a9 9 0 1 0 9 9"],
  check: ["M5 12.5l4.5 4.5L19 7.5"],
  x: ["c12,12,9", "M9 9l6 6", "M15 9l-6 6"],
  ban: ["c12,12,9", "M5.7 5.7l12.6 12.6"],
  alert: ["M12 3.5l9.5 16.5h-19z", "M12 10v4.5", "M12 17.4v.1"],
  activity: ["M3 12h4l3-8 4 16 3-8h4"],
  layers: ["M12 3l9 5-9 5-9-5z", "M3 13l9 5 9-5"],
  list: ["M9 6h12", "M9 12h12", "M9 18h12", "M4 6h.01", "M4 12h.01", "M4 18h.01"],
  inbox: ["M3 13h5l2 3h4l2-3h5", "M5.5 5h13l2.5 8v6H3v-6z"],
  cpu: ["M7 5h10a2 2 0 0 1 2 2v10a2 2 0 0 1-2 2H7a2 2 0 0 1-2-2V7a2 2 0 0 1 2-2z", "M10 10h4v4h-4z", "M9 2v3", "M15 2v3", "M9 19v3", "M15 19v3", "M2 9h3", "M2 15h3", "M19 9h3", "M19 15h3"],
  key: ["c8,15,4", "M11 12l9-9", "M17 6l3 3"],
  replay: ["M3.5 12a8.5 8.5 0 1 0 2.5-6", "M3 3.5v5h5"],
  trash: ["M4 7h16", "M9 7V4.5h6V7", "M6.5 7l1 13h9l1-13"],
  copy: ["M9 9h11v11H9z", "M5 15H4V4h11v1"],
  server: ["M4 4h16v7H4z", "M4 13h16v7H4z", "M8 7.5h.01", "M8 16.5h.01"],
  arrowLeft: ["M19 12H5", "M11 6l-6 6 6 6"],
  skull: ["M12 3a8 8 0 0 0-5 14.2V21h10v-3.8A8 8 0 0 0 12 3z", "M9 12h.01", "M15 12h.01"],
  bars: ["M5 20V11", "M12 20V4", "M19 20v-6", "M3 20h18"],
  calendar: ["M4 6h16v14H4z", "M4 10h16", "M8 3.5v4", "M16 3.5v4"],
  logo: ["M4 7.5h16", "M4 12h11", "M4 16.5h7", "c18.5,16.5,2.5"],
};

/** An inline SVG icon, hidden from assistive technology (a word always goes with it). */
export function icon(name, cls = "") {
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("viewBox", "0 0 24 24");
  svg.setAttribute("class", `icon ${cls}`.trim());
  svg.setAttribute("aria-hidden", "true");
  svg.setAttribute("fill", name === "play" ? "currentColor" : "none");
  svg.setAttribute("stroke", "currentColor");
  svg.setAttribute("stroke-width", "2");
  svg.setAttribute("stroke-linecap", "round");
  svg.setAttribute("stroke-linejoin", "round");
  for (const d of PATHS[name] || []) {
    let shape;
    if (d.startsWith("c")) {
      const [cx, cy, r] = d.slice(1).split(",");
      shape = document.createElementNS(SVG, "circle");
      shape.setAttribute("cx", cx);
      shape.setAttribute("cy", cy);
      shape.setAttribute("r", r);
    } else {
      shape = document.createElementNS(SVG, "path");
      shape.setAttribute("d", d);
    }
    svg.append(shape);
  }
  return svg;
}

// -- formatting ------------------------------------------------------------------------

const INT = new Intl.NumberFormat("en-US");
export const int = (n) => (n === null || n === undefined ? "—" : INT.format(n));

export function rate(perSecond) {
  if (!perSecond) return "0";
  if (perSecond >= 100) return INT.format(Math.round(perSecond));
  if (perSecond >= 10) return perSecond.toFixed(1);
  return perSecond.toFixed(2);
}

/** 0.4 s, 12 s, 3 min 5 s, 2 h 10 min, 3 d 4 h */
export function duration(seconds) {
  if (seconds === null || seconds === undefined || Number.isNaN(seconds)) return "—";
  const s = Math.max(0, seconds);
  if (s < 1) return `${(s * 1000).toFixed(0)} ms`;
  if (s < 10) return `${s.toFixed(1)} s`;
  if (s < 60) return `${Math.floor(s)} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return Math.floor(s % 60) ? `${m} min ${Math.floor(s % 60)} s` : `${m} min`;
  const hours = Math.floor(m / 60);
  if (hours < 48) return m % 60 ? `${hours} h ${m % 60} min` : `${hours} h`;
  return `${Math.floor(hours / 24)} d ${hours % 24} h`;
}

export function bytes(n) {
  if (n === null || n === undefined) return "—";
  if (n < 1024) return `${n} B`;
  if (n < 1024 * 1024) return `${(n / 1024).toFixed(1)} KiB`;
  return `${(n / 1024 / 1024).toFixed(1)} MiB`;
}

const ABSOLUTE = new Intl.DateTimeFormat(undefined, {
  year: "numeric", month: "short", day: "numeric",
  hour: "2-digit", minute: "2-digit", second: "2-digit",
});

export function absolute(iso) {
  return iso ? ABSOLUTE.format(new Date(iso)) : "—";
}

/** "12 s ago" / "in 3 min" */
export function relative(iso, now = Date.now()) {
  if (!iso) return "—";
  const delta = (now - new Date(iso).getTime()) / 1000;
  if (Math.abs(delta) < 1.5) return "just now";
  const abs = Math.abs(delta);
  const text = abs < 60 ? `${Math.round(abs)} s` : duration(abs).replace(/ \d+ (s|min|h)$/, "");
  return delta >= 0 ? `${text} ago` : `in ${text}`;
}

/** A <time> element: relative text, the exact time on hover and for screen readers. */
export function when(iso, now) {
  if (!iso) return h("span", { class: "faint" }, "—");
  return h("time", { datetime: iso, title: absolute(iso) }, relative(iso, now));
}

/** `n` and the noun for it: plural(1, "worker", "workers") is "1 worker". */
export function plural(n, one, many) {
  return `${int(n)} ${n === 1 ? one : many}`;
}

/** The part of an id that tells ids apart: its last 8 hex digits. An id is a UUIDv7, whose
 *  first digits are its creation time, the same for everything made in one burst. */
export function shortId(id) {
  return id ? `…${id.replace(/-/g, "").slice(-8)}` : "";
}

/** An id shown short: the full id on hover, and copying the text copies the full id. */
export function idText(id) {
  if (!id) return "";
  const copyFull = (event) => {
    event.clipboardData.setData("text/plain", id);
    event.preventDefault();
  };
  return h("span", { class: "mono", title: id, "data-id": id, oncopy: copyFull }, shortId(id));
}

/** Pretty-print JSON text when it parses; otherwise show it as it is. */
export function prettyJson(text) {
  try {
    return JSON.stringify(JSON.parse(text), null, 2);
  } catch {
    return text;
  }
}

/** Replace a container's children, keeping keyboard focus on the element with the same
 *  data-focus key (live refreshes must not throw a keyboard user out of a table). */
export function swap(container, ...children) {
  const active = document.activeElement;
  const key = active && container.contains(active) ? active.dataset.focus : undefined;
  container.replaceChildren();
  append(container, children);
  if (key) {
    const again = container.querySelector(`[data-focus="${CSS.escape(key)}"]`);
    if (again) again.focus({ preventScroll: true });
  }
}
