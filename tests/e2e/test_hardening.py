"""Issue 24: a frozen node never runs a job beside its new holder, an outcome held up past
its lease survives when no one else took the job, and start-up faults are named. Real
nodes on a real PostgreSQL with short leases; the jobs log their own runs
(tests/fixtures/faultactors.py), and every verdict on execution comes from those lines.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import NodeSet
from tests.e2e.support import (
    Run,
    describe_runs,
    events_by_id,
    jobs_by_id,
    read_runs,
    started_on,
    wait_job,
    wait_until,
)

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(60)]

LEASE = "2"  # seconds: short, so reaping happens within the test


def logged(tmp_path: Path, seconds: float, **fields: object) -> dict[str, object]:
    """A job of the `logged` actor that records its runs in `tmp_path`."""
    return {"type": "logged", "payload": {"dir": str(tmp_path), "seconds": seconds}, **fields}


def overlapping(runs: list[Run]) -> list[tuple[Run, Run]]:
    """Pairs of runs of one job that executed at the same time, as their own lines show:
    a run that logged its end after another run of the job logged its start. (A run
    with no end line was interrupted; the lines cannot place its last instruction.)"""
    return [
        (first, second)
        for first in runs
        for second in runs
        if first is not second and first.end is not None and first.start <= second.start < first.end
    ]


# -- 1. a frozen node ------------------------------------------------------------------


def test_a_frozen_node_runs_no_job_beside_its_new_holder(pg_nodes: NodeSet, tmp_path: Path) -> None:
    """Scenario: node A (lease 2 s) runs two 6.5 s jobs; 1 s into them its whole process
    group is SIGSTOPped for 6 s (as `docker pause` or a suspended VM); node B starts,
    reaps the leases and starts attempt 2 of each; then A is SIGCONTed. A's handlers'
    sleeps ended while A was stopped: all they have left is to log their end.
    Invariant: no job's executions overlap, judged from the handlers' start and end
    lines: A's workers die at the resume (their lease alarm, SIGALRM, is pending) before
    running another instruction of the job; each job is `done` once, by B."""
    a = pg_nodes.start("--lease-seconds", LEASE)
    ids = [a.enqueue(**logged(tmp_path, 6.5))["id"] for _ in range(2)]
    wait_until(lambda: started_on(tmp_path, a.proc.pid)[1:], 15, "both jobs started on A")
    # 1 s into the runs: their handlers' sleeps are over before the resume, so a worker
    # that lives through the resume would log an end at once
    due = max(r.start for r in started_on(tmp_path, a.proc.pid)) + 1.0
    wait_until(lambda: time.monotonic() > due, 5, "the runs are 1 s in")
    stopped = time.monotonic()
    os.killpg(a.proc.pid, signal.SIGSTOP)
    try:
        b = pg_nodes.start("--lease-seconds", LEASE)
        wait_until(lambda: len(started_on(tmp_path, b.proc.pid)) == 2, 15, "B took both jobs")
        wait_until(lambda: time.monotonic() > stopped + 6, 10, "6 s of the stop passed")
    finally:
        os.killpg(a.proc.pid, signal.SIGCONT)
    resumed = time.monotonic()
    for job_id in ids:
        wait_job(b, job_id, "done", timeout=20)
    runs = read_runs(tmp_path)
    for job_id in ids:
        both = overlapping(runs[job_id])
        assert not both, f"job {job_id} ran twice at once: " + describe_runs(runs[job_id], stopped)
        on_a = [r for r in runs[job_id] if r.pgid == a.proc.pid]
        assert on_a and all(r.end is None for r in on_a), describe_runs(runs[job_id], stopped)
    assert all(r.start < stopped for r in started_on(tmp_path, a.proc.pid))
    assert "killed by SIGALRM, its lease alarm" in a.logs(), a.logs()[-3000:]
    jobs = jobs_by_id(b, ids)
    assert all(job["attempts"] == 2 for job in jobs.values()), jobs
    assert resumed - stopped >= 6


# -- 2. late outcomes ------------------------------------------------------------------


def test_successes_held_up_by_a_frozen_supervisor_survive(
    pg_nodes: NodeSet, tmp_path: Path
) -> None:
    """Scenario: node A (lease 2 s) starts two 0.6 s `max_retries: 0` jobs; its
    supervisor alone is SIGSTOPped for 6 s (3 leases) while its workers finish them, so
    their outcomes wait in its pipes; node B reaps the leases (dead-lettering both:
    their last attempt's lease expired); then A is SIGCONTed.
    Invariant: the late successes are written (no later attempt started): both jobs end
    `done`, with no dead letter left, each ran once, and the trail says why."""
    a = pg_nodes.start("--lease-seconds", LEASE)
    ids = [a.enqueue(**logged(tmp_path, 0.6, max_retries=0))["id"] for _ in range(2)]
    wait_until(lambda: started_on(tmp_path, a.proc.pid)[1:], 15, "both jobs started on A")
    stopped = time.monotonic()
    os.kill(a.proc.pid, signal.SIGSTOP)
    try:
        b = pg_nodes.start("--lease-seconds", LEASE)
        for job_id in ids:
            wait_job(b, job_id, "failed", timeout=15)  # reaped: the lease ran out
        wait_until(lambda: time.monotonic() > stopped + 6, 10, "6 s of the stop passed")
    finally:
        os.kill(a.proc.pid, signal.SIGCONT)
    for job_id in ids:
        wait_job(b, job_id, "done", timeout=15)
    runs = read_runs(tmp_path)
    for job_id in ids:
        assert len(runs[job_id]) == 1 and runs[job_id][0].completed, describe_runs(
            runs[job_id], stopped
        )
    assert b.get("/dlq").body["total"] == 0
    trails = events_by_id(b, ids)
    for job_id in ids:
        kinds = [e["event"] for e in trails[job_id]]
        assert kinds[-2:] == ["late_outcome", "succeeded"], kinds
        assert "lease_expired" in kinds and "dead_lettered" in kinds
