// Live updates without loading the node: each page polls one compact summary route at a
// fixed pace (a request at most every second), never overlapping, and stops polling
// while its tab is hidden.

const listeners = new Set();
export const liveState = { state: "connecting", at: 0, error: null };

export function onLiveChange(listener) {
  listeners.add(listener);
  listener(liveState);
}

function set(state, error = null) {
  liveState.state = state;
  liveState.error = error;
  if (state === "live") liveState.at = Date.now();
  listeners.forEach((listener) => listener(liveState));
}

/**
 * Run `refresh` now and then `everyMs` after each run ends. Returns {stop, now}: `now()`
 * refreshes at once (after an action), keeping the pace from there.
 */
export function poll(refresh, everyMs) {
  let timer = null;
  let running = false;
  let stopped = false;
  let again = false; // now() was asked while a refresh ran: run once more right after

  async function tick() {
    timer = null;
    if (stopped) return;
    if (document.hidden) {
      set("paused");
      return; // visibilitychange starts it again
    }
    running = true;
    try {
      await refresh();
      set("live");
    } catch (err) {
      set(err && err.status === 401 ? "key" : err && (err.status === 0 || err.status >= 500) ? "error" : "live", err);
    } finally {
      running = false;
    }
    if (!stopped && timer === null) timer = setTimeout(tick, again ? 0 : everyMs);
    again = false;
  }

  function onVisibility() {
    if (!document.hidden && timer === null && !running && !stopped) tick();
  }
  document.addEventListener("visibilitychange", onVisibility);
  tick();
  return {
    stop() {
      stopped = true;
      clearTimeout(timer);
      document.removeEventListener("visibilitychange", onVisibility);
    },
    now() {
      if (stopped) return;
      if (running) {
        again = true;
        return;
      }
      clearTimeout(timer);
      timer = null;
      tick();
    },
  };
}

/** Show which node answers (every page learns it from its summary route). */
export function setNode(nodeId) {
  const el = document.getElementById("node");
  if (el && nodeId && el.dataset.node !== nodeId) {
    el.dataset.node = nodeId;
    el.textContent = `node ${nodeId}`;
    el.title = `This dashboard is served by node ${nodeId}`;
  }
}

/** The dead-letter count beside "Dead letters" in the navigation. */
export function setDeadCount(count) {
  const link = document.querySelector('nav.main a[data-nav="dlq"]');
  if (!link) return;
  let badge = link.querySelector(".count");
  if (!count) {
    badge?.remove();
    return;
  }
  if (!badge) {
    badge = document.createElement("span");
    badge.className = "count num";
    link.append(badge);
  }
  badge.textContent = count > 999 ? "999+" : String(count);
  badge.title = `${count} dead letters`;
}
