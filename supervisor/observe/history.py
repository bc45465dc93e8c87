"""What happened on this node lately: jobs finished and attempts failed per 5 s over the
last hour (a ring buffer), queue depth where someone looked, and the last worker exits.

Nothing here is on a job's path: the counts are `Metrics`' own, sampled on the arbiter's
tick (every half second) and before every read, and the difference since the last sample
lands in the bucket of the sample's time. Buckets roll lazily when the clock has passed
the current one. Depth is not read on a timer either: it is noted whenever store counts
are read anyway (a dashboard's summary, a Prometheus scrape), so a node nobody watches
pays nothing for it.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

import msgspec
from goqueue.supervisor.common.jobs import AwareTime, utcnow
from goqueue.supervisor.workers.handle import Worker
from goqueue.supervisor.workers.pool import describe_exit

BUCKET_SECONDS = 5
BUCKETS = 720  # one hour of 5 s buckets
RECENT_EXITS = 50


class ExitReason(StrEnum):
    """Why a worker process went away."""

    CRASH = "crash"  # it died on its own (segfault, os._exit, OOM kill)
    TIMEOUT = "timeout"  # killed: its attempt overran its deadline
    CANCEL = "cancel"  # killed: its job was force-cancelled
    LEASE_LOST = "lease_lost"  # killed: another node took its job's lease
    RECYCLE = "recycle"  # replaced after N jobs or above the RSS limit
    RETIRED = "retired"  # replaced after a reload, or removed (SIGTTOU)
    SHUTDOWN = "shutdown"  # the node is stopping
    BOOT = "boot"  # could not import the actor modules
    MEMORY = "memory"  # killed: its job passed the memory limit


_REASONS: dict[str | None, ExitReason] = {
    None: ExitReason.CRASH,
    "timeout": ExitReason.TIMEOUT,
    "cancel": ExitReason.CANCEL,
    "lease_lost": ExitReason.LEASE_LOST,
    "recycle": ExitReason.RECYCLE,
    "stopped": ExitReason.RETIRED,
    "shutdown": ExitReason.SHUTDOWN,
    "boot": ExitReason.BOOT,
    "memory": ExitReason.MEMORY,
}


class WorkerExit(msgspec.Struct):
    """One worker that went away, and the job it was running then."""

    at: AwareTime
    pid: int
    slot: int
    reason: ExitReason
    exit: str  # the exit status in words: "killed by SIGKILL", "exited with code 0"
    job_id: str | None


class CountChange(msgspec.Struct):
    """The worker count aimed for changed to `target` at `at`."""

    at: AwareTime
    target: int


class WorkerCount(msgspec.Struct):
    """The node's worker count: what it aims for now (`target`) between its bounds, and
    its last changes, for a look at the count over time."""

    target: int
    min: int
    max: int
    changes: list[CountChange] = []


class Window(msgspec.Struct):
    """Buckets of the ring buffer as columns (what a chart library wants): bucket start
    times in unix seconds, jobs done, attempts failed (retried or dead-lettered), and the
    pending depth last noted in the bucket (null where nobody read it)."""

    start: list[int]
    done: list[int]
    failed: list[int]
    depth: list[int | None]


@dataclass(slots=True)
class Bucket:
    """One interval of the ring buffer."""

    start: int
    done: int = 0
    failed: int = 0
    depth: int | None = None


class History:
    """This node's recent past, kept in memory and bounded. `finished` gives the running
    totals of jobs done and of attempts failed (retried or dead-lettered)."""

    def __init__(
        self,
        finished: Callable[[], tuple[int, int]],
        *,
        bucket_seconds: int = BUCKET_SECONDS,
        size: int = BUCKETS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.bucket_seconds = bucket_seconds
        self.size = size
        self.clock = clock
        self.finished = finished
        self._seen = finished()
        self._buckets: deque[Bucket] = deque(maxlen=size)
        self._end = 0.0  # when the newest bucket ends
        self._exits: deque[WorkerExit] = deque(maxlen=RECENT_EXITS)
        self._exit_counts: Counter[ExitReason] = Counter()
        self._count = WorkerCount(0, 0, 0)
        self._count_changes: deque[CountChange] = deque(maxlen=RECENT_EXITS)
        self._current()  # the series starts when the node does: quiet time counts as zero

    # -- recording -------------------------------------------------------------------

    def sample(self) -> None:
        """Count what finished since the last sample in the current bucket."""
        done, failed = self.finished()
        seen_done, seen_failed = self._seen
        if done != seen_done or failed != seen_failed:
            bucket = self._current()
            bucket.done += done - seen_done
            bucket.failed += failed - seen_failed
            self._seen = (done, failed)

    def note_depth(self, pending: int) -> None:
        """Pending jobs in the store, as just read."""
        self._current().depth = pending

    def note_workers(self, target: int, minimum: int, maximum: int) -> None:
        """The worker count aimed for and its bounds (the arbiter, as they change)."""
        if target != self._count.target:
            self._count_changes.append(CountChange(utcnow(), target))
        self._count = WorkerCount(target, minimum, maximum)

    def worker_exited(self, worker: Worker) -> None:
        """Remember a worker that went away, and why."""
        reason = _REASONS.get(worker.kill_reason, ExitReason.CRASH)
        lease = worker.lease
        self._exit_counts[reason] += 1
        self._exits.append(
            WorkerExit(
                at=utcnow(),
                pid=worker.pid,
                slot=worker.slot,
                reason=reason,
                exit=describe_exit(worker.exitcode),
                job_id=lease.job.id if lease is not None else None,
            )
        )

    # -- reading ---------------------------------------------------------------------

    def worker_count(self) -> WorkerCount:
        """The worker count aimed for, its bounds and its recent changes."""
        count = self._count
        return WorkerCount(count.target, count.min, count.max, list(self._count_changes))

    def window(self, since: int = 0) -> Window:
        """The buckets that start at or after `since` (unix seconds), oldest first; the
        last one is still filling."""
        self.sample()
        self._current()
        picked: list[Bucket] = []
        for bucket in reversed(self._buckets):
            if bucket.start < since:
                break
            picked.append(bucket)
        picked.reverse()
        return Window(
            [b.start for b in picked],
            [b.done for b in picked],
            [b.failed for b in picked],
            [b.depth for b in picked],
        )

    def recent(self, seconds: int) -> tuple[int, int]:
        """Jobs done and attempts failed in the buckets of the last `seconds`."""
        window = self.window(int(self.clock()) - seconds)
        return sum(window.done), sum(window.failed)

    def exits(self) -> list[WorkerExit]:
        """The last worker exits, newest first."""
        return list(reversed(self._exits))

    def exit_counts(self) -> dict[str, int]:
        """Worker exits since the node started, by reason (every reason present)."""
        return {reason.value: self._exit_counts[reason] for reason in ExitReason}

    # -- the ring --------------------------------------------------------------------

    def _current(self) -> Bucket:
        now = self.clock()
        if now >= self._end:
            self._roll(now)
        return self._buckets[-1]

    def _roll(self, now: float) -> None:
        """Append the buckets from the newest one up to `now`, empty (zero jobs, depth
        unknown), so the series stays evenly spaced; at most a ring's worth."""
        width = self.bucket_seconds
        start = int(now // width) * width
        last = self._buckets[-1].start if self._buckets else start - width
        missing = min((start - last) // width, self.size)
        for step in range(missing - 1, -1, -1):
            self._buckets.append(Bucket(start - step * width))
        self._end = self._buckets[-1].start + width
