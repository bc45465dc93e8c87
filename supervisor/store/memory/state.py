"""The in-memory store's state and the bookkeeping that keeps it consistent.

Every dict, heap and counter the store keeps, and the few steps that change them together
(status counts, pending depths, events, retiring finished jobs). The reads in
`reads.py` and the write path in `store.py` build on it.
"""

from __future__ import annotations

import itertools
from collections import Counter, deque
from collections.abc import Callable
from datetime import datetime

from goqueue.supervisor.common.enums import TERMINAL, EventKind, Status
from goqueue.supervisor.common.errors import StoreFull
from goqueue.supervisor.common.flow import KeyOf, KeyPace
from goqueue.supervisor.common.jobs import STATUSES, Event, Job, Lease, utcnow
from goqueue.supervisor.common.rates import Rate, StartTimes, Taken
from goqueue.supervisor.settings.config import DEFAULTS
from goqueue.supervisor.store.base import EVENTS_KEPT, NodeLinks
from goqueue.supervisor.store.memory.dead import DeadLetters
from goqueue.supervisor.store.memory.flows import FlowBook
from goqueue.supervisor.store.memory.heaps import OldestByQueue, PendingHeaps
from goqueue.supervisor.store.memory.schedules import ScheduleBook

BUSY = (Status.CLAIMED, Status.RUNNING)  # a key's jobs counted against its limit
MEMORY_MAX_PENDING = 100_000  # what `--max-pending` is in memory when it is not set


class MemoryState:
    """What the in-memory store holds. `clock` says what time it is (tests give it one
    they move by hand, so leases and delays expire without waiting)."""

    def __init__(
        self,
        node_id: str = "local",
        *,
        lease_seconds: float = DEFAULTS.lease_seconds,
        max_pending: int | None = None,
        idempotency_ttl: float = DEFAULTS.idempotency_ttl,
        max_finished: int = 100_000,
        max_events_per_job: int = EVENTS_KEPT,
        clock: Callable[[], datetime] = utcnow,
        wake: Callable[[], None] = lambda: None,
    ) -> None:
        self.node_id = node_id
        self._links = NodeLinks()  # what it publishes of this node (`nodes`), from `open`
        self.clock = clock
        self.lease_seconds = lease_seconds
        self.max_pending = MEMORY_MAX_PENDING if max_pending is None else max_pending
        self.idempotency_ttl = idempotency_ttl
        self.max_finished = max_finished
        self.max_events_per_job = max_events_per_job
        self._jobs: dict[str, Job] = {}
        self._pending = PendingHeaps(self._jobs)
        self._ages = OldestByQueue(self._jobs)  # for the metrics' longest wait by queue
        self._tokens: dict[str, str] = {}  # job id -> lease token
        self._leases: dict[str, Lease] = {}  # token -> lease
        self._reaped: dict[str, str] = {}  # job id -> token of its attempt last reaped
        self._dedupe: dict[str, tuple[str, float]] = {}
        self._idempotency: dict[str, tuple[str, str, float]] = {}
        self._dead = DeadLetters()
        self._unique: dict[str, str] = {}  # unique key -> the job holding it (not terminal)
        self._events: dict[str, list[Event]] = {}
        self._finished: deque[str] = deque()
        self._paused: set[str] = set()
        self._counts: dict[str, int] = dict.fromkeys(STATUSES, 0)
        self._depth: dict[str, dict[int, int]] = {}  # pending by queue, then priority
        self._queue_totals: dict[str, int] = {}  # pending by queue
        self._priority_totals: dict[int, int] = {}  # pending by priority, every queue
        self._limits: dict[str, int | None] = {}
        self._key_limits: dict[str, int] = {}  # per-key limits by type (`common/flow.py`)
        self._busy: Counter[KeyOf] = Counter()  # claimed and running jobs by (type, key)
        self._debounced: dict[tuple[str, str], str] = {}  # (type, debounce key) -> job id
        self._key_rates: dict[str, Rate] = {}  # per-key rates by type
        self._pace = KeyPace()  # the paced keys' TATs
        self._key_waits: list[str] = []  # (`key_waits`)
        self._seq = itertools.count(1)
        self._wake = wake  # the dispatcher's: work may be claimable
        self._opened_at = self.clock()
        self._schedules = ScheduleBook()
        self._starts = StartTimes()
        self._flows = FlowBook()

    # -- bookkeeping -----------------------------------------------------------------

    def _make_pending(self, job: Job, now: datetime) -> None:
        self._pending.add(job, now.timestamp())
        self._ages.add(job)
        self._depth_add(job, +1)
        self._wake()

    def _held(self, lease: Lease, *statuses: Status) -> Job | None:
        """The job, if `lease` still holds it in one of `statuses` (running if none)."""
        job = self._jobs.get(lease.job.id)
        if job is None or self._tokens.get(job.id) != lease.token:
            return None
        return job if job.status in (statuses or (Status.RUNNING,)) else None

    def _drop_lease(self, token: str) -> Job:
        lease = self._leases.pop(token)
        del self._tokens[lease.job.id]
        return self._jobs[lease.job.id]

    def _set_status(self, job: Job, status: Status, now: datetime) -> None:
        if job.status == Status.PENDING:
            self._depth_add(job, -1)
        counts = self._counts
        counts[job.status] -= 1
        counts[status] += 1
        if job.concurrency_key is not None:
            self._count_busy(job, status)
        job.status = status
        job.updated_at = now
        key = job.unique_key
        if key is not None and status in TERMINAL and self._unique.get(key) == job.id:
            del self._unique[key]  # the key is free again

    def _count_busy(self, job: Job, status: Status) -> None:
        """A keyed job moves to `status`: count it in or out of its key's busy jobs."""
        was, now = job.status in BUSY, status in BUSY
        if was != now:
            key = (job.type, job.concurrency_key or "")
            left = self._busy[key] + (1 if now else -1)
            if left > 0:
                self._busy[key] = left
            else:
                del self._busy[key]

    def _depth_add(self, job: Job, delta: int) -> None:
        """Pending jobs by queue and priority, by queue and by priority; an emptied queue is
        forgotten, so 100k queues used once cost nothing once they are empty."""
        queue, priority = job.queue, job.priority
        self._priority_totals[priority] = self._priority_totals.get(priority, 0) + delta
        total = self._queue_totals.get(queue, 0) + delta
        depth = self._depth.setdefault(queue, {})
        count = depth.get(priority, 0) + delta
        if count > 0:
            depth[priority] = count
        else:
            depth.pop(priority, None)
        if total > 0:
            self._queue_totals[queue] = total
        else:
            self._queue_totals.pop(queue, None)
            del self._depth[queue]
            self._ages.forget(queue)

    # -- rate limits (this node's own) -----------------------------------------------

    async def take_starts(self, job_type: str, rate: Rate, want: int) -> Taken:
        """Take the starts due now, on this node."""
        return self._starts.take(job_type, rate, want, self.clock().timestamp())

    async def return_starts(self, job_type: str, tat: float, count: int) -> None:
        """Give back unused starts."""
        self._starts.give_back(job_type, tat, count)

    def _check_room(self, adding: int = 1) -> None:
        """Raise StoreFull unless `adding` more pending jobs fit under `max_pending`."""
        if self._counts[Status.PENDING] + adding > self.max_pending:
            raise StoreFull(f"the queue is full ({self.max_pending} pending jobs)")

    def _event(
        self,
        job: Job,
        kind: EventKind,
        now: datetime,
        detail: str | None = None,
        traceback: str | None = None,
    ) -> None:
        trail = self._events.get(job.id)
        if trail is not None and len(trail) >= self.max_events_per_job:
            return
        event = Event(
            job_id=job.id,
            event=kind,
            at=now,
            node=self.node_id,
            attempt=job.attempts,
            detail=detail,
            traceback=traceback,
        )
        if trail is None:
            self._events[job.id] = [event]
        else:
            trail.append(event)

    def _retire(self, job: Job) -> None:
        """Forget the oldest finished jobs beyond `max_finished` (bounded memory)."""
        self._finished.append(job.id)
        while len(self._finished) > self.max_finished:
            self._forget(self._finished.popleft())
        self._expire_keys(job.updated_at.timestamp())

    def _forget(self, job_id: str) -> None:
        old = self._jobs.get(job_id)
        # a workflow step cancelled, then made to wait again by a replay, is not finished
        if old is not None and old.status in TERMINAL:
            del self._jobs[job_id]
            self._reaped.pop(job_id, None)
            self._counts[old.status] -= 1
            self._events.pop(old.id, None)

    def _expire_keys(self, now_ts: float) -> None:
        """Drop expired dedupe and idempotency keys, a few at a time (oldest first)."""
        for table in (self._dedupe, self._idempotency):
            if not table:
                continue
            for _ in range(4):
                key = next(iter(table), None)
                if key is None or table[key][-1] > now_ts:
                    break
                del table[key]
