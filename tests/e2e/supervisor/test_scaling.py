"""`--workers MIN:MAX`: a real node grows its pool while jobs wait and shrinks it when
its workers have stayed idle, never below MIN or above MAX."""

from __future__ import annotations

import signal
import time
from typing import Any

import pytest

from tests.conftest import Node, stays_true, wait_for

pytestmark = pytest.mark.timeout(90)


def live_workers(node: Node) -> int:
    """Worker processes up (idle or busy), from /workers."""
    body = node.get("/workers").body
    return sum(1 for w in body["workers"] if w["state"] in ("idle", "busy"))


def count(node: Node) -> dict[str, Any]:
    return node.get("/workers").body["count"]


def test_grows_to_max_under_load_and_back_to_min_when_idle(make_node: Any) -> None:
    node = make_node("--workers", "1:4", "--scale-down-after", "2")
    assert count(node)["min"] == 1 and count(node)["max"] == 4
    wait_for(lambda: live_workers(node) == 1, what="one worker at start")
    started = time.monotonic()
    jobs = [node.enqueue(type="sleep", payload={"seconds": 3}) for _ in range(8)]
    seen: list[tuple[float, int]] = []

    def at_four() -> bool:
        n = live_workers(node)
        seen.append((round(time.monotonic() - started, 1), n))
        assert n <= 4, f"above MAX: {seen}"
        return n == 4

    wait_for(at_four, timeout=8, interval=0.1, what="four workers")
    for job in jobs:
        node.wait_status(job["id"], "done", timeout=30)
    wait_for(lambda: live_workers(node) == 1, timeout=8, what="back to one worker")
    changes = [change["target"] for change in count(node)["changes"]]
    assert changes[-1] == 1 and max(changes) == 4, changes
    stays_true(lambda: live_workers(node) == 1, 1.0, what="one worker stays")


def test_never_retires_a_busy_worker_to_shrink(make_node: Any) -> None:
    node = make_node("--workers", "1:3", "--scale-down-after", "1")
    long = [node.enqueue(type="sleep", payload={"seconds": 4}) for _ in range(3)]
    wait_for(lambda: live_workers(node) == 3, timeout=8, what="three workers")
    # all three busy; nothing is idle, so nothing may go until the jobs end
    for job in long:
        assert node.wait_status(job["id"], "done", timeout=20)["attempts"] == 1


def test_signals_move_the_bounds(make_node: Any) -> None:
    node = make_node("--workers", "2:3", "--scale-down-after", "30")
    node.signal(signal.SIGTTIN)
    wait_for(lambda: count(node)["min"] == 3 and live_workers(node) == 3, what="3:4")
    assert count(node)["max"] == 4
    node.signal(signal.SIGTTOU)
    wait_for(lambda: (count(node)["min"], count(node)["max"]) == (2, 3), what="back to 2:3")
    metrics = node.get("/metrics").body
    assert 'goqueue_worker_bounds{bound="max"} 3.0' in metrics
