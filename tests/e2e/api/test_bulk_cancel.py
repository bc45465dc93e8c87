"""`POST /jobs/cancel`, `goqueue jobs cancel` and `goqueue queues clear` against live
nodes on both stores: filtered, bounded, counted, audited; running jobs killed only when
forced; bad bodies answered 400 naming the field."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Node, wait_for

pytestmark = pytest.mark.timeout(90)

LATER = 3600  # seconds: these jobs wait, pending, for the test to cancel them


def pending(node: Node, n: int, **job: Any) -> list[str]:
    """`n` jobs that stay pending (due in an hour)."""
    body = {"type": "noop", "delay_seconds": LATER, **job}
    return [node.enqueue(**body)["id"] for _ in range(n)]


def statuses(node: Node, ids: list[str]) -> list[str]:
    return [node.get(f"/jobs/{i}").body["status"] for i in ids]


def goqueue(node: Node, *argv: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GOQUEUE_")}
    return subprocess.run(
        [sys.executable, "-m", "goqueue.api.cli.main", *argv, "--url", node.url],
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
    )


def test_cancel_by_queue_and_type_counts_and_audits(make_store_node: Callable[..., Node]) -> None:
    node = make_store_node()
    mine = pending(node, 5, queue="bulk")
    other_type = pending(node, 1, queue="bulk", type="echo_async")
    other_queue = pending(node, 1, queue="elsewhere")
    resp = node.post("/jobs/cancel", {"queue": "bulk", "type": "noop", "limit": 3})
    assert resp.status == 200, resp
    assert resp.body == {"cancelled": 3, "killed": 0, "remaining": 2, "running": 0}
    assert statuses(node, mine) == ["cancelled"] * 3 + ["pending"] * 2  # oldest first
    trail = node.get(f"/jobs/{mine[0]}/events").body["events"]
    assert (trail[-1]["event"], trail[-1]["detail"]) == ("cancelled", "bulk cancel")
    rest = node.post("/jobs/cancel", {"queue": "bulk", "type": "noop", "status": "pending"})
    assert rest.body == {"cancelled": 2, "killed": 0, "remaining": 0, "running": 0}
    assert statuses(node, other_type + other_queue) == ["pending", "pending"]
    stats = node.get("/stats").body
    assert stats["counts"]["cancelled"] == 5 and stats["queues"]["bulk"] == {"5": 1}


def test_running_jobs_are_killed_only_when_forced(
    make_store_node: Callable[..., Node], tmp_path: Path
) -> None:
    node = make_store_node()
    spinning = node.enqueue(type="spin", queue="busy", payload={"dir": str(tmp_path)})["id"]
    marker = wait_for(lambda: next(tmp_path.glob("spin-*"), None), what="the job spinning")
    pid = int(marker.read_text())
    waiting = pending(node, 2, queue="busy")
    gentle = node.post("/jobs/cancel", {"queue": "busy"}).body
    assert gentle == {"cancelled": 2, "killed": 0, "remaining": 0, "running": 1}
    assert node.get(f"/jobs/{spinning}").body["status"] == "running"
    forced = node.post("/jobs/cancel", {"queue": "busy", "force": True}).body
    assert forced == {"cancelled": 1, "killed": 1, "remaining": 0, "running": 0}
    assert statuses(node, [spinning, *waiting]) == ["cancelled"] * 3

    def gone() -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False

    wait_for(gone, timeout=5, what="the spinning worker killed")
    exits = node.get("/workers").body["recent_exits"]
    assert (exits[0]["pid"], exits[0]["reason"]) == (pid, "cancel")


def test_created_before_and_all(make_node: Callable[..., Node]) -> None:
    node = make_node()
    old = pending(node, 2)
    cut = node.get(f"/jobs/{old[-1]}").body["created_at"]
    young = pending(node, 1)
    resp = node.post("/jobs/cancel", {"created_before": cut})
    assert resp.body["cancelled"] == 1 and statuses(node, old) == ["cancelled", "pending"]
    every = node.post("/jobs/cancel", {"all": True}).body
    assert every["cancelled"] == 2 and statuses(node, [old[1], *young]) == ["cancelled"] * 2


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "all"),
        ({"limit": 0, "queue": "q"}, "limit"),
        ({"limit": 1001, "queue": "q"}, "limit"),
        ({"status": "running", "queue": "q"}, "status"),
        ({"status": "waiting"}, "status"),
        ({"queue": "bad queue"}, "queue"),
        ({"created_before": "yesterday"}, "created_before"),
        ({"created_before": "2025-01-01T00:00:00"}, "created_before"),  # no offset
        ({"queue": "q", "nope": 1}, "nope"),
        ({"status": "pending", "force": True}, "force"),
        ({"force": "yes", "queue": "q"}, "force"),
    ],
)
def test_bad_bodies_are_400_naming_the_field(node: Node, body: Any, field: str) -> None:
    before = pending(node, 1, queue="q")
    resp = node.post("/jobs/cancel", body)
    assert resp.status == 400, resp
    assert resp.body["details"]["field"] == field, resp.body
    assert statuses(node, before) == ["pending"]
    assert node.post("/jobs/cancel", b"[1, 2]").status == 400
    assert node.post("/jobs/cancel", b"{").status == 400


def test_goqueue_jobs_cancel_and_queues_clear(node: Node, tmp_path: Path) -> None:
    emails = pending(node, 3, queue="mail")
    others = pending(node, 2, queue="mail", type="echo_async")
    done = goqueue(node, "jobs", "cancel", "--queue", "mail", "--type", "noop")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "cancelled 3 jobs\n"
    assert statuses(node, emails) == ["cancelled"] * 3
    refused = goqueue(node, "jobs", "cancel")
    assert refused.returncode == 2 and "give a filter" in refused.stderr
    kept = goqueue(node, "queues", "clear", "mail", stdin="n\n")
    # declined: nothing done, and not a usage error (2)
    assert kept.returncode == 1 and "cancel every pending job in queue mail?" in kept.stdout
    assert statuses(node, others) == ["pending"] * 2
    spinning = node.enqueue(type="spin", queue="mail", payload={"dir": str(tmp_path)})["id"]
    wait_for(lambda: next(tmp_path.glob("spin-*"), None), what="the job spinning")
    cleared = goqueue(node, "queues", "clear", "mail", stdin="y\n")
    assert cleared.returncode == 0, cleared.stderr
    assert cleared.stdout == (
        "cancel every pending job in queue mail? [y/N] \n"
        "queue mail: cancelled 2 jobs\n1 running left alone: add --force to kill them\n"
    )
    spinning_too = node.enqueue(type="spin", queue="mail", payload={"dir": str(tmp_path)})["id"]
    wait_for(lambda: len(list(tmp_path.glob("spin-*"))) == 2, what="a second job spinning")
    forced = goqueue(node, "queues", "clear", "mail", "--yes", "--force")
    assert forced.returncode == 0, forced.stderr
    assert (
        forced.stdout
        == "queue mail: cancelled 2 jobs (2 running: their workers are being killed)\n"
    )
    assert statuses(node, [spinning, spinning_too]) == ["cancelled"] * 2
    again = goqueue(node, "jobs", "cancel", "--queue", "mail", "--force", "--json")
    assert again.returncode == 0 and '"cancelled": 0' in again.stdout
    listed = goqueue(node, "queues", "list")
    assert listed.returncode == 0 and "mail" not in listed.stdout
