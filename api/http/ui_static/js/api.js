// The dashboard speaks to the node through its public HTTP API, the same routes as any
// client (described in /openapi.json): no private back door.

const KEY = "goqueue.apiKey";

/** The API's root: the parent of /ui/, so the dashboard also works behind a path prefix. */
export const API_BASE = new URL("../", document.baseURI);

export class ApiError extends Error {
  constructor(status, message, body) {
    super(message);
    this.status = status;
    this.body = body;
  }
}

/** The API key, kept in this tab only (session storage) and sent as X-API-Key. */
export const apiKey = {
  get: () => sessionStorage.getItem(KEY),
  set: (key) => sessionStorage.setItem(KEY, key),
  clear: () => sessionStorage.removeItem(KEY),
};

let askForKey = null; // set by the shell: async (reason) => true once a key was entered
let asking = null; // one prompt at a time, shared by every request that needs it
const refusedListeners = new Set();

export function onKeyNeeded(ask) {
  askForKey = ask;
}

/** Called with no argument when a quiet request (a live refresh) was refused for want of
 *  a key: the shell shows a way to enter one instead of prompting out of the blue. */
export function onRefused(listener) {
  refusedListeners.add(listener);
  return () => refusedListeners.delete(listener);
}

/**
 * One API call. `query` values that are empty are left out. A 401 brings the key prompt
 * (unless `quiet`) and the call is made again with the key entered.
 */
export async function api(path, { method = "GET", query, body, quiet = false } = {}) {
  const url = new URL(path.replace(/^\//, ""), API_BASE);
  for (const [name, value] of Object.entries(query || {})) {
    if (value !== undefined && value !== null && value !== "") url.searchParams.set(name, value);
  }
  for (let tries = 0; tries < 3; tries++) {
    const key = apiKey.get();
    const headers = { Accept: "application/json" };
    if (key) headers["X-API-Key"] = key;
    const init = { method, headers, cache: "no-store" };
    if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    let resp;
    try {
      resp = await fetch(url, init);
    } catch {
      throw new ApiError(0, "The node did not answer. Is it running?", null);
    }
    const data = await resp.json().catch(() => null);
    if (resp.status === 401) {
      if (quiet || !askForKey) {
        refusedListeners.forEach((listener) => listener());
      } else {
        asking ||= askForKey(key ? "The node refused that key." : "This node needs an API key.")
          .finally(() => { asking = null; });
        if (await asking) continue;
      }
    }
    if (!resp.ok) {
      throw new ApiError(resp.status, data?.error || `HTTP ${resp.status}`, data);
    }
    return data;
  }
  throw new ApiError(401, "The node refused the API key.", null);
}
