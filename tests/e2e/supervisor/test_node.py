"""End to end: a real `goqueue serve`, real worker processes, real HTTP on loopback."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Node, Response, stays_true, wait_for

pytestmark = pytest.mark.timeout(60)


def pid_alive(pid: int) -> bool:
    """True while a process exists (and is not a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def test_a_job_runs_and_stores_its_result(node: Node) -> None:
    first = node.enqueue(type="noop", payload=0)
    assert node.wait_status(first["id"], "done")["result"] == 0

    def started_at_enqueue() -> dict[str, Any] | None:
        job = node.enqueue(type="noop", payload={"hello": "world"})
        return job if job["status"] == "running" else None

    # Once the node has settled (its last claim found nothing more), an idle worker
    # waits: a job starts in the enqueue's own commit, and the answer says so. A node
    # under load may still be claiming when the first asks, so each try is a new job.
    job = wait_for(started_at_enqueue, timeout=10, interval=0.05, what="a start at enqueue")
    assert job["attempts"] == 1 and job["started_at"], job
    events = [e["event"] for e in node.get(f"/jobs/{job['id']}/events").body["events"]]
    assert events[:2] == ["enqueued", "started"], events
    done = node.wait_status(job["id"], "done")
    assert done["result"] == {"hello": "world"}
    assert done["attempts"] == 1
    assert done["started_at"] and done["finished_at"]


def test_async_handlers_see_their_context(node: Node) -> None:
    job = node.enqueue(type="echo_async", payload=[1, 2])
    done = node.wait_status(job["id"], "done")
    assert done["result"] == {"payload": [1, 2], "attempt": 1, "job_id": job["id"]}


def test_hung_handler_ignoring_sigterm_is_killed_and_the_next_job_runs(
    node: Node, tmp_path: Path
) -> None:
    job = node.enqueue(type="spin", payload={"dir": str(tmp_path)}, timeout_seconds=0.5)
    marker = wait_for(lambda: list(tmp_path.glob("spin-*")), timeout=10)[0]
    pid = int(marker.read_text())
    failed = node.wait_status(job["id"], "failed", timeout=10)
    assert "timed out after 0.5s" in failed["last_error"]
    assert "SIGKILL" in failed["last_error"]
    wait_for(lambda: not pid_alive(pid), timeout=2)
    after = node.enqueue(type="noop", payload=1)
    assert node.wait_status(after["id"], "done")["result"] == 1


def test_worker_that_exits_is_retried_with_its_exit_code_named(node: Node) -> None:
    job = node.enqueue(type="crash", payload={"crashes": 1, "code": 3}, max_retries=2)
    done = node.wait_status(job["id"], "done", timeout=20)
    assert done["attempts"] == 2
    assert done["result"] == {"attempt": 2}
    assert "exited with code 3" in done["errors"][0]["error"]


def test_priority_10_runs_before_priority_0_with_one_busy_worker(make_node, tmp_path: Path) -> None:
    node = make_node("--workers", "1")
    blocker = node.enqueue(type="sleep", payload={"seconds": 1.0})
    wait_for(lambda: node.get(f"/jobs/{blocker['id']}").body["status"] == "running")
    low = [
        node.enqueue(type="record", priority=0, payload={"dir": str(tmp_path), "label": f"low{i}"})
        for i in range(20)
    ]
    high = [
        node.enqueue(
            type="record", priority=10, payload={"dir": str(tmp_path), "label": f"high{i}"}
        )
        for i in range(5)
    ]
    for job in low + high:
        node.wait_status(job["id"], "done", timeout=30)
    order = (tmp_path / "order.log").read_text().split()
    assert order[:5] == [f"high{i}" for i in range(5)]
    assert order[5:] == [f"low{i}" for i in range(20)]  # FIFO within a priority


def test_per_type_limit_of_two_holds_with_four_workers(make_node, tmp_path: Path) -> None:
    node = make_node("--workers", "4")
    jobs = [
        node.enqueue(type="limited", payload={"dir": str(tmp_path), "seconds": 0.3})
        for _ in range(8)
    ]
    others = [node.enqueue(type="noop", payload=i) for i in range(4)]
    for job in others:  # other types are not blocked behind the limited ones
        node.wait_status(job["id"], "done", timeout=5)
    for job in jobs:
        node.wait_status(job["id"], "done", timeout=30)
    seen = [int(x) for x in (tmp_path / "seen.log").read_text().split()]
    assert len(seen) == 8
    assert max(seen) == 2


def test_retries_with_backoff_then_success(make_node) -> None:
    node = make_node("--retry-base", "0.1")
    job = node.enqueue(type="flaky", payload={"failures": 2}, max_retries=3)
    done = node.wait_status(job["id"], "done", timeout=20)
    assert done["attempts"] == 3
    assert [e["attempt"] for e in done["errors"]] == [1, 2]
    assert done["errors"][0]["error"] == "ValueError: flaky failure on attempt 1"


def test_retry_later_and_fail_now(node: Node) -> None:
    later = node.enqueue(type="later", payload={"delay": 0.2})
    now = node.enqueue(type="failnow")
    assert node.wait_status(later["id"], "done")["attempts"] == 2
    failed = node.wait_status(now["id"], "failed")
    assert failed["attempts"] == 1
    assert "do not retry" in failed["last_error"]


def test_exhausted_retries_go_to_the_dead_letter_queue_and_replay(make_node) -> None:
    node = make_node("--retry-base", "0.05")
    job = node.enqueue(type="flaky", payload={"failures": 2}, max_retries=1)
    failed = node.wait_status(job["id"], "failed", timeout=20)
    assert failed["attempts"] == 2
    letters = node.get("/dlq").body["dead_letters"]
    letter = next(d for d in letters if d["job_id"] == job["id"])
    assert letter["id"] != job["id"]
    assert len(letter["errors"]) == 2
    replay = node.post(f"/dlq/{letter['id']}/replay")
    assert replay.status == 201
    assert node.get(f"/dlq/{letter['id']}").status == 404
    # the replay starts afresh: 2 more failures allowed by max_retries=1 -> fails again
    node.wait_status(replay.body["id"], "failed", timeout=20)


def test_delayed_job_holds_no_worker(make_node) -> None:
    node = make_node("--workers", "1")
    delayed = node.enqueue(type="noop", payload="late", delay_seconds=1.0)
    quick = node.enqueue(type="noop", payload="now")
    node.wait_status(quick["id"], "done", timeout=5)
    assert node.get(f"/jobs/{delayed['id']}").body["status"] == "pending"
    done = node.wait_status(delayed["id"], "done", timeout=10)
    assert done["started_at"] >= delayed["run_at"]


def test_chaining_sets_parent_id(node: Node) -> None:
    job = node.enqueue(
        type="noop",
        payload=1,
        on_success={"type": "noop", "payload": "after-success"},
        on_failure={"type": "noop", "payload": "after-failure"},
    )
    node.wait_status(job["id"], "done")
    children = wait_for(
        lambda: [j for j in node.get("/jobs?limit=100").body["jobs"] if j["parent_id"] == job["id"]]
    )
    assert [c["payload"] for c in children] == ["after-success"]
    node.wait_status(children[0]["id"], "done")


def test_on_failure_chain_runs_after_dead_letter(node: Node) -> None:
    job = node.enqueue(type="failnow", on_failure={"type": "noop", "payload": "cleanup"})
    node.wait_status(job["id"], "failed")
    child = wait_for(
        lambda: [j for j in node.get("/jobs?limit=100").body["jobs"] if j["parent_id"] == job["id"]]
    )[0]
    assert child["payload"] == "cleanup"


def test_cancel_pending_and_force_cancel_running(node: Node, tmp_path: Path) -> None:
    later = node.enqueue(type="noop", delay_seconds=60)
    resp = node.delete(f"/jobs/{later['id']}")
    assert resp.status == 200 and resp.body["status"] == "cancelled"
    assert node.delete(f"/jobs/{later['id']}").status == 409

    hung = node.enqueue(type="spin", payload={"dir": str(tmp_path)}, timeout_seconds=60)
    marker = wait_for(lambda: list(tmp_path.glob("spin-*")), timeout=10)[0]
    pid = int(marker.read_text())
    assert node.delete(f"/jobs/{hung['id']}").status == 409  # running, no force
    resp = node.delete(f"/jobs/{hung['id']}?force=true")
    assert resp.status == 200 and resp.body["status"] == "cancelled"
    wait_for(lambda: not pid_alive(pid), timeout=3)

    def still_cancelled() -> bool:
        job = node.get(f"/jobs/{hung['id']}").body
        return job["status"] == "cancelled" and job["attempts"] == 1

    # give a wrong retry the chance to show itself, watching all the while
    stays_true(still_cancelled, for_seconds=0.3, what="a force-cancelled job ran again")
    job = node.get(f"/jobs/{hung['id']}").body
    assert job["status"] == "cancelled" and job["attempts"] == 1
    after = node.enqueue(type="noop", payload=2)
    assert node.wait_status(after["id"], "done")["result"] == 2


def test_dedupe_window_rejects_then_accepts(node: Node) -> None:
    first = node.enqueue(type="noop", dedupe_key="k1", dedupe_window_seconds=0.5)
    dup = node.post("/jobs", {"type": "noop", "dedupe_key": "k1", "dedupe_window_seconds": 0.5})
    assert dup.status == 409
    assert first["id"] in str(dup.body)

    def enqueued_again() -> Response | None:
        body = {"type": "noop", "dedupe_key": "k1", "dedupe_window_seconds": 0.5}
        resp = node.post("/jobs", body)
        return resp if resp.status != 409 else None  # still inside the window: refused

    again = wait_for(enqueued_again, timeout=2, what="the key free once its 0.5 s window ended")
    assert again.status == 201


def test_workers_recycle_after_n_jobs(make_node, tmp_path: Path) -> None:
    node = make_node("--workers", "1", "--max-jobs-per-worker", "2")
    jobs = [node.enqueue(type="counted", payload={"dir": str(tmp_path)}) for _ in range(6)]
    for job in jobs:
        node.wait_status(job["id"], "done")
    pids = [line.split()[1] for line in (tmp_path / "runs.log").read_text().splitlines()]
    assert len(pids) == 6
    assert len(set(pids)) == 3  # a fresh process every two jobs


def test_bad_actor_module_stops_the_node_with_a_clear_error(tmp_path: Path) -> None:
    import subprocess
    import sys

    from tests.conftest import FIXTURES, free_port

    env = {**os.environ, "PYTHONPATH": str(FIXTURES)}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "goqueue.api.cli.main",
            "serve",
            "--port",
            str(free_port()),
            "--actors",
            "no_such_module_here",
            "--workers",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 3
    assert "no_such_module_here" in proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr.split("\n")[0]


def test_a_segfaulting_worker_fails_its_attempt_naming_the_signal(node: Node) -> None:
    job = node.enqueue(type="segfault")
    failed = node.wait_status(job["id"], "failed", timeout=20)
    assert "killed by SIGSEGV" in failed["last_error"]
    after = node.enqueue(type="noop", payload="still here")
    assert node.wait_status(after["id"], "done")["result"] == "still here"
