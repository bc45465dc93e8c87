"""The node's ring buffer and worker-exit log, driven by a controllable clock and fed
by the counts a real `Metrics` keeps."""

from __future__ import annotations

from typing import Any

import msgspec
from goqueue.supervisor.common.jobs import Job, JobSpec, Lease, Outcome, utcnow
from goqueue.supervisor.observe.history import ExitReason, History
from goqueue.supervisor.observe.metrics import Metrics
from goqueue.supervisor.workers.pool import Worker


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def outcome(status: str) -> Outcome:
    spec = msgspec.json.decode(b'{"type": "t"}', type=JobSpec)
    job = Job.from_spec(spec, now=utcnow(), max_retries=3)
    job.status = status  # type: ignore[assignment]
    return Outcome(job, [])


def recorder(clock: Clock, **kwargs: Any) -> tuple[Metrics, History]:
    metrics = Metrics()
    return metrics, History(metrics.finished, clock=clock, **kwargs)


def worker(pid: int, kill_reason: str | None, exitcode: int, job_id: str | None = None) -> Any:
    w = Worker(slot=pid % 10, generation=0, pid=pid, pidfd=-1, channel=None)  # type: ignore[arg-type]
    w.kill_reason = kill_reason
    w.exitcode = exitcode
    if job_id is not None:
        job = outcome("running").job
        job.id = job_id
        w.lease = Lease(job=job, token="t", owner="n", expires_at=utcnow())
    return w


def test_outcomes_are_counted_in_the_bucket_of_their_time() -> None:
    clock = Clock(1000.0)
    metrics, history = recorder(clock, bucket_seconds=5, size=10)
    for status in ("done", "done", "pending", "failed", "cancelled", "running"):
        metrics.after_outcome(outcome(status))
    metrics.after_cancel(outcome("cancelled").job, force=False)
    history.sample()  # the arbiter's tick
    clock.now = 1007.0  # next bucket
    metrics.after_outcome(outcome("done"))
    window = history.window()  # a read samples first
    assert window.start == [1000, 1005]
    assert window.done == [2, 1]
    assert window.failed == [2, 0]  # a retried attempt and a dead-lettered one
    assert window.depth == [None, None]


def test_quiet_time_becomes_empty_buckets_and_the_ring_keeps_its_size() -> None:
    clock = Clock(1000.0)
    metrics, history = recorder(clock, bucket_seconds=5, size=10)
    metrics.after_outcome(outcome("done"))
    history.sample()
    clock.now = 1022.0
    history.note_depth(7)
    window = history.window()
    assert window.start == [1000, 1005, 1010, 1015, 1020]
    assert window.done == [1, 0, 0, 0, 0]
    assert window.depth == [None, None, None, None, 7]
    clock.now = 1000.0 + 5 * 100  # far beyond the ring: only its last 10 buckets remain
    window = history.window()
    assert window.start == list(range(1455, 1501, 5)) and len(window.start) == 10
    assert sum(window.done) == 0


def test_window_since_answers_only_newer_buckets() -> None:
    clock = Clock(1000.0)
    metrics, history = recorder(clock, bucket_seconds=5, size=720)
    clock.now = 1031.0
    metrics.after_outcome(outcome("done"))
    assert history.window(1025).start == [1025, 1030]
    assert history.window(1030).done == [1]
    assert history.window(2000).start == []
    assert len(history.window(0).start) == 7


def test_a_clock_going_back_does_not_break_the_ring() -> None:
    clock = Clock(1000.0)
    metrics, history = recorder(clock, bucket_seconds=5, size=10)
    metrics.after_outcome(outcome("done"))
    history.sample()
    clock.now = 990.0
    metrics.after_outcome(outcome("done"))
    assert history.window().done == [2]


def test_what_finished_before_the_history_began_is_not_counted_in_it() -> None:
    metrics = Metrics()
    metrics.after_outcome(outcome("done"))  # before a reload made a new history, say
    history = History(metrics.finished, bucket_seconds=5, size=10, clock=Clock(1000.0))
    metrics.after_outcome(outcome("failed"))
    assert history.window().done == [0]
    assert history.window().failed == [1]


def test_worker_exits_are_named_and_counted() -> None:
    history = History(Metrics().finished)
    history.worker_exited(worker(101, None, -11))
    history.worker_exited(worker(102, "cancel", -9, job_id="j-1"))
    history.worker_exited(worker(103, "stopped", 0))
    history.worker_exited(worker(104, "timeout", -9))
    history.worker_exited(worker(105, "memory", -9, job_id="j-2"))
    exits = history.exits()
    assert [e.pid for e in exits] == [105, 104, 103, 102, 101]  # newest first
    assert [e.reason for e in exits] == [
        ExitReason.MEMORY,
        ExitReason.TIMEOUT,
        ExitReason.RETIRED,
        ExitReason.CANCEL,
        ExitReason.CRASH,
    ]
    assert exits[4].exit == "killed by SIGSEGV" and exits[3].job_id == "j-1"
    assert exits[0].job_id == "j-2"
    counts = history.exit_counts()
    assert set(counts) == {r.value for r in ExitReason}
    assert counts["crash"] == counts["cancel"] == counts["retired"] == counts["timeout"] == 1
    assert counts["recycle"] == 0
