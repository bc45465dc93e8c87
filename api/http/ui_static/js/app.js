// The shell: navigation, the hash router (#/jobs?status=failed), the live indicator and
// the API key prompt. Each page is a module with `mount(root, route) -> cleanup`.

import { apiKey, onKeyNeeded, onRefused } from "./api.js";
import { h, icon } from "./dom.js";
import { onLiveChange } from "./live.js";
import dlq from "./pages/dlq.js";
import deadLetter from "./pages/dead.js";
import job from "./pages/job.js";
import jobs from "./pages/jobs.js";
import overview from "./pages/overview.js";
import queues from "./pages/queues.js";
import schedules from "./pages/schedules.js";
import types from "./pages/types.js";
import workers from "./pages/workers.js";
import workflow from "./pages/workflow.js";
import workflows from "./pages/workflows.js";

const UUID = "([0-9a-fA-F-]{36})";
const ROUTES = [
  [/^\/$/, overview],
  [/^\/queues$/, queues],
  [/^\/jobs$/, jobs],
  [new RegExp(`^/jobs/${UUID}$`), job],
  [/^\/dlq$/, dlq],
  [new RegExp(`^/dlq/${UUID}$`), deadLetter],
  [/^\/workers$/, workers],
  [/^\/schedules$/, schedules],
  [/^\/types$/, types],
  [/^\/workflows$/, workflows],
  [new RegExp(`^/workflows/${UUID}$`), workflow],
];
const NAV = [
  ["overview", "#/", "Overview", "activity"],
  ["queues", "#/queues", "Queues", "layers"],
  ["jobs", "#/jobs", "Jobs", "list"],
  ["workflows", "#/workflows", "Workflows", "layers"],
  ["dlq", "#/dlq", "Dead letters", "inbox"],
  ["types", "#/types", "Job types", "bars"],
  ["schedules", "#/schedules", "Schedules", "calendar"],
  ["workers", "#/workers", "Workers", "cpu"],
];

const main = document.getElementById("main");
let cleanup = null;

function parseHash() {
  const raw = location.hash.startsWith("#/") ? location.hash.slice(1) : "/";
  const [path, search = ""] = raw.split("?");
  return { path: path || "/", query: new URLSearchParams(search) };
}

/** Go to `path` with `query` (an object; empty values left out), as a new history entry
 *  unless `replace`. */
export function navigate(path, query = {}, { replace = false } = {}) {
  const params = new URLSearchParams();
  for (const [name, value] of Object.entries(query)) {
    if (value !== undefined && value !== null && value !== "") params.set(name, value);
  }
  const hash = `#${path}${params.toString() ? `?${params}` : ""}`;
  if (replace) history.replaceState(null, "", hash);
  else history.pushState(null, "", hash);
  render();
}

let shown = null; // the hash on screen: back/forward fire both popstate and hashchange

function render({ force = false } = {}) {
  if (!force && shown === location.hash) return;
  shown = location.hash;
  const route = parseHash();
  let page = null;
  let params = [];
  for (const [pattern, candidate] of ROUTES) {
    const match = route.path.match(pattern);
    if (match) {
      page = candidate;
      params = match.slice(1);
      break;
    }
  }
  if (cleanup) cleanup();
  cleanup = null;
  main.replaceChildren();
  if (!page) {
    main.append(h("div", { class: "loading" }, "No such page. ", h("a", { href: "#/" }, "Go to the overview")));
    return;
  }
  document.title = `${page.title} · GoQueue`;
  for (const link of document.querySelectorAll("nav.main a")) {
    if (link.dataset.nav === page.nav) {
      link.setAttribute("aria-current", "page");
      // on a phone the nav scrolls sideways: keep the current page's tab in sight
      link.scrollIntoView({ block: "nearest", inline: "nearest" });
    } else link.removeAttribute("aria-current");
  }
  cleanup = page.mount(main, { params, query: route.query, navigate }) || null;
  // move focus to the new page's title, as a page load would (for keyboards and readers)
  const title = main.querySelector("h1");
  if (title && shell.moved) title.focus({ preventScroll: true });
  shell.moved = true;
}

const shell = { moved: false, keyWanted: false, showKey: null, prompted: false };

function buildShell() {
  const nav = document.querySelector("nav.main");
  nav.replaceChildren(
    ...NAV.map(([key, href, label, name]) => h("a", { href, "data-nav": key }, icon(name, "lg"), h("span", null, label))),
  );
  document.querySelector(".brand").prepend(icon("logo", "logo"));
  document.querySelector(".skip").addEventListener("click", (event) => {
    event.preventDefault();
    (main.querySelector("h1") || main).focus();
  });
  const live = document.getElementById("live");
  onLiveChange((state) => {
    live.dataset.state = state.state;
    const text = {
      connecting: "Connecting…",
      live: "Live",
      paused: "Paused (tab hidden)",
      error: "Node not answering, retrying",
      key: "API key needed",
    }[state.state];
    live.querySelector(".text").textContent = text;
    live.title = state.error ? state.error.message : text;
  });
  const keyButton = document.getElementById("key-button");
  // shown once a key is kept, or once the node asked for one: a node without a key
  // needs no button for it
  const showKey = () => {
    const set = Boolean(apiKey.get());
    keyButton.hidden = !set && !shell.keyWanted;
    keyButton.replaceChildren(icon("key"), set ? "Forget API key" : "Enter API key");
    keyButton.setAttribute("aria-label", set ? "Forget the API key kept in this tab" : "Enter an API key");
  };
  keyButton.addEventListener("click", async () => {
    if (apiKey.get()) {
      apiKey.clear();
      showKey();
    } else if (await askKey("Enter this node's API key.")) {
      render({ force: true });
    }
  });
  showKey();
  onKeyNeeded(async (reason) => {
    shell.keyWanted = true;
    const ok = await askKey(reason);
    showKey();
    return ok;
  });
  onRefused(() => {
    shell.keyWanted = true;
    keyButton.classList.add("primary");
    showKey();
    // the node shows nothing without a key: ask at once (once per load), rather than
    // leave the page on "Loading…" until the key button is found
    if (!shell.prompted && !apiKey.get() && !document.getElementById("key-dialog").open) {
      shell.prompted = true;
      askKey("This node needs an API key to show anything.").then((ok) => ok && render({ force: true }));
    }
  });
  shell.showKey = showKey;
}

/**
 * The key prompt: resolves true once a key is entered and kept for this tab. Answered
 * by its own submit, Enter or Escape, never by a close event left over from the prompt
 * before (it arrives a task later, when this one may already be open).
 */
function askKey(reason) {
  const dialog = document.getElementById("key-dialog");
  const form = dialog.querySelector("form");
  const input = dialog.querySelector("input");
  dialog.querySelector(".reason").textContent = reason;
  input.value = "";
  return new Promise((resolve) => {
    const finish = (answer) => {
      form.removeEventListener("submit", onSubmit);
      dialog.removeEventListener("close", onClose);
      input.onkeydown = null;
      const key = input.value.trim();
      const ok = answer === "use" && key.length > 0;
      if (ok) {
        apiKey.set(key);
        document.getElementById("key-button").classList.remove("primary");
      }
      input.value = "";
      shell.showKey?.();
      resolve(ok);
    };
    const onSubmit = (event) => finish(event.submitter?.value ?? "");
    const onClose = () => {
      if (!dialog.open) finish(dialog.returnValue); // Escape
    };
    input.onkeydown = (event) => {
      if (event.key === "Enter") {
        event.preventDefault(); // the form's first button is Cancel; Enter means "use it"
        finish("use");
        dialog.close("use");
      }
    };
    form.addEventListener("submit", onSubmit);
    dialog.addEventListener("close", onClose);
    dialog.returnValue = "";
    dialog.showModal();
    input.focus();
  });
}

buildShell();
window.addEventListener("hashchange", () => render());
window.addEventListener("popstate", () => render());
render();
