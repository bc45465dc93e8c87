"""The in-memory store: heaps for due and delayed jobs, dicts for everything else.

Single-threaded by design (it lives on the supervisor's event loop), so each method is
atomic simply because it never awaits. It implements leases too, with this node as the
only owner, so the same contract tests hold for both stores.
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta

import msgspec
from goqueue.supervisor.errors import (
    UNIQUE_HELD,
    DuplicateJob,
    IdempotencyMismatch,
    InvalidState,
    NotFound,
    StoreFull,
)
from goqueue.supervisor.jobs import (
    DEFAULT_MAX_RETRIES,
    OTHER_QUEUES,
    STATUSES,
    AttemptError,
    DeadLetter,
    Enqueued,
    Event,
    Job,
    JobFilter,
    JobSpec,
    Lease,
    Outcome,
    Page,
    Purged,
    QueueDepths,
    QueueStats,
    Replayed,
    Stats,
    new_id,
    utcnow,
)
from goqueue.supervisor.rates import Rate, StartWindows, Taken
from goqueue.supervisor.schedules import Fired, ScheduleState, fire_detail
from goqueue.supervisor.store.base import NewJob
from goqueue.supervisor.store.memory_dead import DeadLetters
from goqueue.supervisor.store.memory_heaps import OldestByQueue, PendingHeaps
from goqueue.supervisor.store.memory_schedules import ScheduleBook
from goqueue.supervisor.summaries import (
    DeadBrief,
    DeadFilter,
    JobBrief,
    NodeSummary,
    QueueSummary,
    preview,
    text_preview,
)
from goqueue.supervisor.vocab import TERMINAL, EventKind, Status


class MemoryStore:
    """A bounded, non-durable store for one node. `clock` says what time it is (tests
    give it one they move by hand, so leases and delays expire without waiting)."""

    claim_ahead = False  # a claim costs no round trip: claim for idle workers only

    def __init__(
        self,
        node_id: str = "local",
        *,
        lease_seconds: float = 30.0,
        max_pending: int = 100_000,
        idempotency_ttl: float = 86_400.0,
        max_finished: int = 100_000,
        max_events_per_job: int = 100,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.node_id = node_id
        self.clock = clock
        self.lease_seconds = lease_seconds
        self.max_pending = max_pending
        self.idempotency_ttl = idempotency_ttl
        self.max_finished = max_finished
        self.max_events_per_job = max_events_per_job
        self._jobs: dict[str, Job] = {}
        self._pending = PendingHeaps(self._jobs)
        self._ages = OldestByQueue(self._jobs)  # for the metrics' longest wait by queue
        self._tokens: dict[str, str] = {}  # job id -> lease token
        self._leases: dict[str, Lease] = {}  # token -> lease
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
        self._seq = itertools.count(1)
        self._wake: Callable[[], None] = lambda: None
        self._opened_at = self.clock()
        self._schedules = ScheduleBook()
        self._starts = StartWindows()

    # -- lifecycle -------------------------------------------------------------------

    async def open(self) -> None:
        """Nothing to connect to."""

    async def close(self) -> None:
        """Nothing to release."""

    async def ping(self) -> bool:
        """Always reachable."""
        return True

    def set_waker(self, wake: Callable[[], None]) -> None:
        """Remember the dispatcher's wake-up callable."""
        self._wake = wake

    async def register_node(self, limits: Mapping[str, int | None]) -> None:
        """Remember this node's job types and limits."""
        self._limits = dict(limits)

    async def known_types(self) -> frozenset[str]:
        """The types this node declared."""
        return frozenset(self._limits)

    # -- enqueue ---------------------------------------------------------------------

    async def enqueue(self, new: NewJob) -> Enqueued:
        """Store one job after the dedupe and idempotency checks."""
        return self._enqueue(new, self.clock())

    async def enqueue_many(self, news: Sequence[NewJob]) -> list[Enqueued | Exception]:
        """Store several jobs, each answered on its own."""
        now = self.clock()
        out: list[Enqueued | Exception] = []
        for new in news:
            try:
                out.append(self._enqueue(new, now))
            except (DuplicateJob, IdempotencyMismatch, StoreFull) as exc:
                out.append(exc)
        return out

    def _enqueue(self, new: NewJob, now: datetime) -> Enqueued:
        ts = now.timestamp()
        if new.idempotency_key is not None:
            seen = self._idempotency.get(new.idempotency_key)
            if seen is not None and seen[2] > ts:
                if seen[0] != new.request_hash:
                    raise IdempotencyMismatch(seen[1])
                job = self._jobs.get(seen[1])
                if job is not None:
                    return Enqueued(job, created=False)
        spec = new.spec
        if spec.dedupe_key is not None and spec.dedupe_window_seconds:
            held = self._dedupe.get(spec.dedupe_key)
            if held is not None and held[1] > ts:
                raise DuplicateJob(held[0])
        if spec.unique_key is not None and spec.unique_key in self._unique:
            raise DuplicateJob(self._unique[spec.unique_key], UNIQUE_HELD)
        if self._counts[Status.PENDING] >= self.max_pending:
            raise StoreFull(f"the queue is full ({self.max_pending} pending jobs)")
        job = self._insert(spec, now, new.max_retries, new.parent_id, start=new.start)
        if spec.dedupe_key is not None and spec.dedupe_window_seconds:
            self._dedupe[spec.dedupe_key] = (job.id, ts + spec.dedupe_window_seconds)
        if new.idempotency_key is not None:
            expires = ts + self.idempotency_ttl
            self._idempotency[new.idempotency_key] = (new.request_hash or "", job.id, expires)
        lease = self._leases[self._tokens[job.id]] if job.status == Status.RUNNING else None
        return Enqueued(job, created=True, lease=lease)

    def _insert(
        self,
        spec: JobSpec,
        now: datetime,
        max_retries: int,
        parent_id: str | None,
        *,
        start: bool = False,
    ) -> Job:
        """Store a new job, pending; or (`start`) running for this node, when it is due
        now, its queue is not paused and its type has no limit (a worker waits for it:
        no claim is woken)."""
        job = Job.from_spec(spec, now=now, max_retries=max_retries, parent_id=parent_id)
        job.seq = next(self._seq)
        self._jobs[job.id] = job
        if job.unique_key is not None:
            self._unique[job.unique_key] = job.id
        self._count(job.status, +1)
        self._event(job, EventKind.ENQUEUED, now)
        if (
            start
            and job.run_at <= now
            and job.queue not in self._paused
            and self._limits.get(job.type) is None
        ):
            self._depth_add(job, +1)  # pending for an instant, as a claim would find it
            self._lease(job, now, started=True)
        else:
            self._make_pending(job, now)
        return job

    def _follow_up(self, spec: JobSpec | None, parent: Job, now: datetime) -> list[Job]:
        """Chain a template; bypasses max_pending since the parent already had its place."""
        if spec is None:
            return []
        max_retries = spec.max_retries if spec.max_retries is not None else DEFAULT_MAX_RETRIES
        return [self._insert(spec, now, max_retries, parent.id)]

    # -- rate limits (this node's own) -----------------------------------------------

    async def take_starts(self, job_type: str, rate: Rate, want: int) -> Taken:
        """Take starts from the type's current window, on this node."""
        return self._starts.take(job_type, rate, want, self.clock().timestamp())

    async def return_starts(self, job_type: str, window: float, count: int) -> None:
        """Give back unused starts."""
        self._starts.give_back(job_type, window, count)

    # -- periodic jobs (this node's own) ---------------------------------------------

    async def schedule_states(self) -> dict[str, ScheduleState]:
        """Every schedule fired or switched since this node started."""
        return self._schedules.states()

    async def fire_schedule(
        self, name: str, tick: datetime, new: NewJob, *, missed: bool = False
    ) -> tuple[Fired, Job | None]:
        """Store `new` as the job of `name`'s `tick`, unless disabled or fired already."""
        refusal = self._schedules.refusal(name, tick)
        if refusal is not None:
            return refusal, None
        enqueued = self._enqueue(new, self.clock())
        job = enqueued.job
        self._events[job.id][-1].detail = fire_detail(name, tick, missed)
        self._schedules.fired(name, tick, job.id)
        return Fired.FIRED, job

    async def set_schedule_enabled(self, name: str, enabled: bool) -> ScheduleState:
        """Enable or disable a schedule (on this node only)."""
        return self._schedules.switch(name, enabled, self.clock())

    # -- claiming --------------------------------------------------------------------

    async def claim(
        self,
        limit: int,
        queues: frozenset[str] | None,
        slots: Mapping[str, int],
        start: int | None = None,
    ) -> list[Lease]:
        """Take up to `limit` due jobs, best first, within the per-type slots; the best
        `start` of them (all when None) start at once, the others are `claimed`."""
        now = self.clock()
        self._pending.promote(now.timestamp())
        free = dict(slots)
        leases: list[Lease] = []
        while len(leases) < limit:
            key = self._pending.best(queues, free, self._paused)
            if key is None:
                break
            job = self._pending.pop(key)
            free[job.type] -= 1
            leases.append(self._lease(job, now, start is None or len(leases) < start))
        return leases

    def _make_pending(self, job: Job, now: datetime) -> None:
        self._pending.add(job, now.timestamp())
        self._ages.add(job)
        self._depth_add(job, +1)
        self._wake()

    def _lease(self, job: Job, now: datetime, started: bool) -> Lease:
        token = new_id()
        lease = Lease(
            job=job,
            token=token,
            owner=self.node_id,
            expires_at=now + timedelta(seconds=self.lease_seconds),
        )
        self._tokens[job.id] = token
        self._leases[token] = lease
        if started:
            self._begin(job, now)
        else:
            self._set_status(job, Status.CLAIMED, now)
            job.started_at = None
        return lease

    def _begin(self, job: Job, now: datetime) -> None:
        """The attempt starts: it is charged, and the job is running."""
        self._set_status(job, Status.RUNNING, now)
        job.attempts += 1
        job.started_at = now
        self._event(job, EventKind.STARTED, now)

    async def start(self, lease: Lease) -> Lease | None:
        """Start the attempt of a `claimed` lease."""
        job = self._held(lease, Status.CLAIMED)
        if job is None:
            return None
        now = self.clock()
        self._begin(job, now)
        held = self._leases[lease.token]
        held.expires_at = now + timedelta(seconds=self.lease_seconds)
        return held

    def next_due_at(self) -> datetime | None:
        """When the earliest delayed job becomes due."""
        return self._pending.next_due()

    # -- leases and outcomes ---------------------------------------------------------

    async def heartbeat(self, leases: Sequence[Lease], lease_seconds: float) -> list[str]:
        """Extend held leases; report the tokens that are no longer held."""
        expires = self.clock() + timedelta(seconds=lease_seconds)
        lost: list[str] = []
        for lease in leases:
            held = self._leases.get(lease.token)
            if held is None:
                lost.append(lease.token)
            else:
                held.expires_at = expires
        return lost

    async def reap_expired(self, retry_delay: Callable[[int], float] | None = None) -> list[Job]:
        """Return jobs whose lease ran out to pending, or dead-letter them."""
        now = self.clock()
        touched: list[Job] = []
        for token, lease in list(self._leases.items()):
            if lease.expires_at > now:
                continue
            job = self._drop_lease(token)
            error = f"lease expired (holder {lease.owner} lost)"
            if job.status == Status.CLAIMED:  # never started: back in its place, at no cost
                self._set_status(job, Status.PENDING, now)
                self._make_pending(job, now)
                self._event(job, EventKind.RELEASED, now, error)
                touched.append(job)
                continue
            self._event(job, EventKind.LEASE_EXPIRED, now)
            if job.attempts > job.max_retries:
                self._dead_letter(job, error, now)
            else:
                self._record_error(job, error, now)
                self._set_status(job, Status.PENDING, now)
                delay = 0.0 if retry_delay is None else retry_delay(job.attempts)
                job.run_at = now + timedelta(seconds=delay)
                self._make_pending(job, now)
            touched.append(job)
        return touched

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

    async def complete(self, lease: Lease, result: msgspec.Raw | None) -> Outcome | None:
        """Record success, then chain `on_success`."""
        job = self._held(lease)
        if job is None:
            return None
        now = self.clock()
        self._drop_lease(lease.token)
        job.result = result
        job.finished_at = now
        self._set_status(job, Status.DONE, now)
        self._event(job, EventKind.SUCCEEDED, now)
        self._retire(job)
        return Outcome(job, self._follow_up(job.on_success, job, now))

    async def fail(self, lease: Lease, error: str, retry_at: datetime | None) -> Outcome | None:
        """Record a failed attempt: retry at `retry_at`, or dead-letter and chain."""
        job = self._held(lease)
        if job is None:
            return None
        now = self.clock()
        self._drop_lease(lease.token)
        if retry_at is None:
            dead = self._dead_letter(job, error, now)
            return Outcome(job, self._follow_up(job.on_failure, job, now), dead)
        self._record_error(job, error, now)
        self._event(job, EventKind.ATTEMPT_FAILED, now, error)
        self._set_status(job, Status.PENDING, now)
        job.run_at = retry_at
        self._make_pending(job, now)
        self._event(job, EventKind.RETRY_SCHEDULED, now, retry_at.isoformat())
        return Outcome(job, [])

    def _record_error(self, job: Job, error: str, now: datetime) -> None:
        job.errors = (*job.errors, AttemptError(attempt=job.attempts, error=error, at=now))
        job.last_error = error

    def _dead_letter(self, job: Job, error: str, now: datetime) -> DeadLetter:
        self._record_error(job, error, now)
        self._event(job, EventKind.ATTEMPT_FAILED, now, error)
        job.finished_at = now
        self._set_status(job, Status.FAILED, now)
        dead = DeadLetter(
            id=new_id(),
            job_id=job.id,
            job=msgspec.structs.replace(job),
            errors=job.errors,
            created_at=now,
        )
        self._dead.add(dead)
        self._event(job, EventKind.DEAD_LETTERED, now, dead.id)
        self._retire(job)
        return dead

    async def release(self, lease: Lease) -> bool:
        """Give the job back without counting the attempt."""
        job = self._held(lease, Status.RUNNING, Status.CLAIMED)
        if job is None:
            return False
        now = self.clock()
        self._drop_lease(lease.token)
        if job.status == Status.RUNNING:
            job.attempts -= 1
        self._event(job, EventKind.RELEASED, now)
        self._set_status(job, Status.PENDING, now)
        self._make_pending(job, now)
        return True

    async def cancel(self, job_id: str, force: bool) -> tuple[Job, str | None]:
        """Cancel a pending job, or a running one with `force`."""
        job = self._jobs.get(job_id)
        if job is None:
            raise NotFound(f"job {job_id} not found")
        if job.status in TERMINAL:
            raise InvalidState(f"job {job_id} is already {job.status}", job.status)
        if job.status == Status.RUNNING and not force:
            raise InvalidState(f"job {job_id} is running; use force=true to kill it", job.status)
        now = self.clock()
        token = self._tokens.get(job_id)
        if token is not None:
            self._drop_lease(token)
        if job.status == Status.PENDING:
            self._pending.discard(job, now.timestamp())
        job.finished_at = now
        self._set_status(job, Status.CANCELLED, now)
        self._event(job, EventKind.CANCELLED, now)
        self._retire(job)
        return job, token

    # -- reads -----------------------------------------------------------------------

    async def get(self, job_id: str) -> Job | None:
        """One job by id."""
        return self._jobs.get(job_id)

    async def list_jobs(self, filters: JobFilter, limit: int, offset: int) -> Page:
        """Jobs newest first (insertion order reversed)."""
        matches = [
            job
            for job in reversed(self._jobs.values())
            if (filters.type is None or job.type == filters.type)
            and (filters.status is None or job.status == filters.status)
            and (filters.queue is None or job.queue == filters.queue)
        ]
        return Page(matches[offset : offset + limit], len(matches))

    async def stats(self) -> Stats:
        """Counts by status and pending depth by queue and priority."""
        queues = {
            queue: {str(p): n for p, n in sorted(depth.items(), reverse=True) if n}
            for queue, depth in self._depth.items()
        }
        return Stats(dict(self._counts), queues, len(self._dead))

    async def queue_stats(self, queue: str) -> QueueStats:
        """One queue's counts by status and depth by priority."""
        counts: dict[str, int] = dict.fromkeys(STATUSES, 0)
        for job in self._jobs.values():
            if job.queue == queue:
                counts[job.status] += 1
        depth = self._depth.get(queue, {})
        by_priority = {str(p): n for p, n in sorted(depth.items(), reverse=True) if n}
        return QueueStats(queue, counts, by_priority, queue in self._paused)

    async def queue_depths(self, top: int) -> QueueDepths:
        """The `top` deepest queues by priority, the rest summed by priority: one pass over
        the per-queue totals, kept up to date as jobs come and go."""
        totals = self._queue_totals
        deepest = heapq.nsmallest(top, totals.items(), key=lambda item: (-item[1], item[0]))
        chosen = {q: {str(p): n for p, n in self._depth[q].items()} for q, _ in deepest}
        other = dict(self._priority_totals)
        for queue, _ in deepest:
            for priority, n in self._depth[queue].items():
                other[priority] -= n
        rest = {str(p): n for p, n in sorted(other.items()) if n}
        now_ts = self.clock().timestamp()
        due = {q: ts for q in totals if (ts := self._ages.oldest_due(q, now_ts)) is not None}
        waiting = {q: now_ts - due[q] if q in due else 0.0 for q in chosen}
        if len(totals) > len(chosen):
            others = [ts for q, ts in due.items() if q not in chosen]
            waiting[OTHER_QUEUES] = now_ts - min(others) if others else 0.0
        pending = sum(self._priority_totals.values())
        return QueueDepths(chosen, rest, len(totals), pending, waiting, len(self._dead))

    async def queue_names(self, limit: int) -> frozenset[str]:
        """Queues holding pending jobs, and paused queues (at most `limit`)."""
        return frozenset(itertools.islice(itertools.chain(self._depth, self._paused), limit))

    async def set_paused(self, queue: str, paused: bool) -> None:
        """Pause or resume a queue."""
        if paused:
            self._paused.add(queue)
        else:
            self._paused.discard(queue)
            self._wake()

    async def events(self, job_id: str) -> list[Event]:
        """A job's audit trail, oldest first."""
        return list(self._events.get(job_id, ()))

    async def prune(self, finished_before: datetime, limit: int) -> int:
        """Forget finished jobs older than `finished_before` (oldest first)."""
        pruned = 0
        while self._finished and pruned < limit:
            job = self._jobs.get(self._finished[0])
            if job is not None and (job.finished_at or job.updated_at) >= finished_before:
                break
            self._forget(self._finished.popleft())
            pruned += job is not None
        return pruned

    # -- dead letters ----------------------------------------------------------------

    async def list_dead(self, limit: int, offset: int, filters: DeadFilter | None = None) -> Page:
        """Dead letters newest first (those passing `filters`)."""
        return self._dead.page(limit, offset, filters)

    async def get_dead(self, dead_id: str) -> DeadLetter | None:
        """One dead letter, by its own id or its job's."""
        return self._dead.find(dead_id)

    async def replay_dead(self, dead_id: str, max_retries: int) -> Job:
        """Enqueue a fresh job from a dead letter, then drop the letter."""
        dead = self._dead.get(dead_id)
        if dead is None:
            raise NotFound(f"dead letter {dead_id} not found")
        if self._counts[Status.PENDING] >= self.max_pending:
            raise StoreFull(f"the queue is full ({self.max_pending} pending jobs)")
        return self._replay(dead, max_retries, self.clock())

    def _replay(self, dead: DeadLetter, max_retries: int, now: datetime) -> Job:
        job = self._insert(dead.job.replay_spec(), now, max_retries, None)
        self._dead.pop(dead.id)
        self._event(job, EventKind.REPLAYED, now, dead.job_id)
        return job

    async def replay_dead_many(self, filters: DeadFilter, limit: int) -> Replayed:
        """Replay up to `limit` matching letters, oldest first, each with its job's own
        retries; stops early (the rest remaining) once the store is full."""
        letters, more = self._dead.oldest_matching(filters, limit)
        now = self.clock()
        jobs: list[Job] = []
        for dead in letters:
            if self._counts[Status.PENDING] >= self.max_pending:
                if not jobs:
                    raise StoreFull(f"the queue is full ({self.max_pending} pending jobs)")
                break
            jobs.append(self._replay(dead, dead.job.max_retries, now))
        return Replayed(jobs, more + len(letters) - len(jobs))

    async def purge_dead(self, dead_id: str) -> bool:
        """Delete a dead letter."""
        return self._dead.pop(dead_id) is not None

    async def purge_dead_many(self, filters: DeadFilter, limit: int) -> Purged:
        """Delete up to `limit` matching letters, oldest first."""
        letters, more = self._dead.oldest_matching(filters, limit)
        for dead in letters:
            self._dead.pop(dead.id)
        return Purged(len(letters), more)

    # -- bookkeeping -----------------------------------------------------------------

    def _set_status(self, job: Job, status: Status, now: datetime) -> None:
        if job.status == Status.PENDING:
            self._depth_add(job, -1)
        self._count(job.status, -1)
        self._count(status, +1)
        job.status = status
        job.updated_at = now
        key = job.unique_key
        if key is not None and status in TERMINAL and self._unique.get(key) == job.id:
            del self._unique[key]  # the key is free again

    def _count(self, status: str, delta: int) -> None:
        self._counts[status] += delta

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

    def _event(self, job: Job, kind: EventKind, now: datetime, detail: str | None = None) -> None:
        trail = self._events.setdefault(job.id, [])
        if len(trail) < self.max_events_per_job:
            trail.append(
                Event(
                    job_id=job.id,
                    event=kind,
                    at=now,
                    node=self.node_id,
                    attempt=job.attempts,
                    detail=detail,
                )
            )

    def _retire(self, job: Job) -> None:
        """Forget the oldest finished jobs beyond `max_finished` (bounded memory)."""
        self._finished.append(job.id)
        while len(self._finished) > self.max_finished:
            self._forget(self._finished.popleft())
        self._expire_keys(job.updated_at.timestamp())

    def _forget(self, job_id: str) -> None:
        old = self._jobs.pop(job_id, None)
        if old is not None:
            self._count(old.status, -1)
            self._events.pop(old.id, None)

    def _expire_keys(self, now_ts: float) -> None:
        """Drop expired dedupe and idempotency keys, a few at a time (oldest first)."""
        for table in (self._dedupe, self._idempotency):
            for _ in range(4):
                key = next(iter(table), None)
                if key is None or table[key][-1] > now_ts:
                    break
                del table[key]

    # -- summaries for operators ---------------------------------------------------------

    async def queue_summaries(self) -> list[QueueSummary]:
        """Every queue with pending or running jobs, and every paused one. Due jobs are
        moved to their ready heaps first (as a claim would), so a queue's scheduled jobs
        are its pending ones less the live entries of its ready heaps. Finding the
        longest-waiting due job takes one pass over the ready entries, in C (about 25 ms
        for 75,000 due jobs): the engine asks at most every 2 s, for every viewer at once."""
        now_ts = self.clock().timestamp()
        ready, oldest = self._pending.ready_by_queue(now_ts)
        running = Counter(lease.job.queue for lease in self._leases.values())
        depths = {q: {p: n for p, n in d.items() if n} for q, d in self._depth.items()}
        names = {q for q, d in depths.items() if d} | set(running) | self._paused
        summaries = []
        for name in sorted(names):
            depth = depths.get(name, {})
            pending = sum(depth.values())
            summaries.append(
                QueueSummary(
                    name=name,
                    pending=pending,
                    scheduled=pending - ready[name],
                    running=running[name],
                    depth_by_priority={str(p): n for p, n in sorted(depth.items(), reverse=True)},
                    oldest_due_at=_from_ts(oldest.get(name)),
                    waiting_seconds=max(0.0, now_ts - oldest[name]) if name in oldest else None,
                    paused=name in self._paused,
                )
            )
        return summaries

    async def nodes(self) -> list[NodeSummary]:
        """This node alone: it is alive for as long as it answers."""
        types = sorted(self._limits)
        return [NodeSummary(self.node_id, self._opened_at, self.clock(), True, types)]

    async def job_briefs(self, filters: JobFilter, limit: int, offset: int, preview: int) -> Page:
        """A page of `list_jobs` as brief rows."""
        page = await self.list_jobs(filters, limit, offset)
        return Page([_job_brief(job, preview) for job in page.items], page.total)

    async def dead_briefs(self, filters: DeadFilter, limit: int, offset: int, preview: int) -> Page:
        """Dead letters newest first, filtered, as brief rows."""
        matches = list(self._dead.newest_first(filters))
        rows = [_dead_brief(dead, preview) for dead in matches[offset : offset + limit]]
        return Page(rows, len(matches))


def _from_ts(ts: float | None) -> datetime | None:
    return None if ts is None else datetime.fromtimestamp(ts, UTC)


def _job_brief(job: Job, limit: int) -> JobBrief:
    return JobBrief(
        id=job.id,
        type=job.type,
        queue=job.queue,
        priority=job.priority,
        status=job.status,
        attempts=job.attempts,
        max_retries=job.max_retries,
        run_at=job.run_at,
        created_at=job.created_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        updated_at=job.updated_at,
        parent_id=job.parent_id,
        payload=preview(job.payload, limit),
        result=None if job.result is None else preview(job.result, limit),
        last_error=text_preview(job.last_error, limit),
    )


def _dead_brief(dead: DeadLetter, limit: int) -> DeadBrief:
    job = dead.job
    return DeadBrief(
        id=dead.id,
        job_id=dead.job_id,
        type=job.type,
        queue=job.queue,
        priority=job.priority,
        attempts=job.attempts,
        max_retries=job.max_retries,
        created_at=dead.created_at,
        payload=preview(job.payload, limit),
        last_error=text_preview(job.last_error, limit),
    )
