"""The in-memory store's write path, the one every job takes: enqueue (with its dedupe,
idempotency and debounce checks), claims, leases and outcomes, each in one synchronous
step of the event loop."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta

import msgspec
from goqueue.supervisor.common.enums import EventKind, Status
from goqueue.supervisor.common.errors import (
    UNIQUE_HELD,
    DuplicateJob,
    IdempotencyMismatch,
    StoreFull,
)
from goqueue.supervisor.common.flow import KeyTurns, key_window
from goqueue.supervisor.common.jobs import (
    DeadLetter,
    Enqueued,
    Job,
    JobSpec,
    Lease,
    Outcome,
    debounced_run_at,
    new_id,
)
from goqueue.supervisor.store.base import LATE_OUTCOME, ClaimStarts, NewJob
from goqueue.supervisor.store.memory.workflows import MemoryWorkflows


class MemoryWrites(MemoryWorkflows):
    """Enqueue, claims, leases and outcomes over the state of `MemoryState`."""

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
        if spec.debounce_key is not None:
            replaced = self._debounce(spec, now)
            if replaced is not None:
                self._remember_idempotency(new, replaced.id, ts)
                return Enqueued(replaced, created=False)
        if spec.dedupe_key is not None and spec.dedupe_window_seconds:
            held = self._dedupe.get(spec.dedupe_key)
            if held is not None and held[1] > ts:
                raise DuplicateJob(held[0])
        if spec.unique_key is not None and spec.unique_key in self._unique:
            raise DuplicateJob(self._unique[spec.unique_key], UNIQUE_HELD)
        self._check_room()
        job = self._insert(spec, now, new.max_retries, new.parent_id, start=new.start is not None)
        job.trace_context = new.trace_context
        if spec.dedupe_key is not None and spec.dedupe_window_seconds:
            self._dedupe[spec.dedupe_key] = (job.id, ts + spec.dedupe_window_seconds)
        if spec.debounce_key is not None:
            self._debounced[(job.type, spec.debounce_key)] = job.id
        self._remember_idempotency(new, job.id, ts)
        lease = self._leases[self._tokens[job.id]] if job.status == Status.RUNNING else None
        return Enqueued(job, created=True, lease=lease)

    def _remember_idempotency(self, new: NewJob, job_id: str, ts: float) -> None:
        if new.idempotency_key is not None:
            expires = ts + self.idempotency_ttl
            self._idempotency[new.idempotency_key] = (new.request_hash or "", job_id, expires)

    def _debounce(self, spec: JobSpec, now: datetime) -> Job | None:
        """The job of `spec`'s type and debounce key that has not started, its payload
        replaced and put off (`debounced_run_at`); None when there is none."""
        key = (spec.type, spec.debounce_key or "")
        job = self._jobs.get(self._debounced.get(key, ""))
        if job is None or job.status != Status.PENDING or job.attempts:
            self._debounced.pop(key, None)
            return None
        job.payload = spec.payload
        job.run_at = debounced_run_at(spec, job.created_at, now)
        job.updated_at = now
        self._pending.add(job, now.timestamp())  # its old entry is stale: another run_at
        self._ages.add(job)
        self._event(job, EventKind.DEBOUNCED, now)
        return job

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
        self._counts[job.status] += 1
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
        child = self._insert(spec, now, spec.max_retries_value, parent.id)
        child.trace_context = parent.trace_context  # a chained job stays in its trace
        return [child]

    # -- claiming --------------------------------------------------------------------

    async def claim(
        self,
        limit: int,
        queues: frozenset[str] | None,
        slots: Mapping[str, int],
        start: int | None = None,
        start_types: frozenset[str] = frozenset(),
    ) -> list[Lease]:
        """Take up to `limit` due jobs, best first, within the per-type slots; the best
        `start` of them (all when None) start at once, and so do those that lead the claim
        with a type in `start_types`; the others are `claimed`."""
        now = self.clock()
        self._pending.promote(now.timestamp())
        free = dict(slots)
        # a copy of the keys' busy counts: a job claimed here is `take`n
        turns = KeyTurns(
            self._key_limits, dict(self._busy), self._key_rates, self._pace, now.timestamp()
        )
        leases: list[Lease] = []
        starts = ClaimStarts(start, start_types)
        pending = self._pending
        window = key_window(limit)
        best = pending.candidates(queues, free, self._paused, turns.turn, window)
        while best and len(leases) < limit:
            seen, key = heapq.heappop(best)
            if free.get(key[1], 0) <= 0:
                continue
            order = pending.next_of(key, turns.turn)  # its key may have moved on since
            if order != seen:
                if order is not None:
                    heapq.heappush(best, (order, key))
                continue
            job = pending.pop(key)
            pending.took(key)
            free[job.type] -= 1
            turns.take(job.type, job.concurrency_key)
            leases.append(self._lease(job, now, starts(job.type)))
            order = pending.next_of(key, turns.turn)
            if order is not None:
                heapq.heappush(best, (order, key))
        turns.settle()
        if len(leases) < limit:
            self._key_waits.extend(turns.held)
        return leases

    def key_waits(self) -> list[str]:
        """The types a short claim held jobs of back by key, since last asked."""
        waits, self._key_waits = self._key_waits, []
        return waits

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
        """When the earliest delayed job becomes due, or a key held back by its pace may
        start again, whichever comes first."""
        now = self.clock().timestamp()
        due = self._pending.next_due(now)
        paced = self._pace.due(now)
        if paced is None:
            return due
        at = datetime.fromtimestamp(paced, UTC)
        return at if due is None or at < due else due

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
            self._reaped[job.id] = token
            job.record_error(error, None, now)
            if job.attempts > job.max_retries:
                self._event(job, EventKind.ATTEMPT_FAILED, now, error)
                self._dead_letter(job, now)
            else:
                self._set_status(job, Status.PENDING, now)
                delay = 0.0 if retry_delay is None else retry_delay(job.attempts)
                job.run_at = now + timedelta(seconds=delay)
                self._make_pending(job, now)
            touched.append(job)
        return touched

    def _salvage(self, lease: Lease) -> Job | None:
        """The job of a fenced outcome that arrived late, reopened under its lease, if
        that attempt is the job's last one started and its lease was reaped: the
        reaping's retry (pending, or claimed) or its dead letter gives way and its error
        is dropped. None when refused: a later attempt started, or the reaping
        dead-lettered a job with an `on_failure` (already enqueued), or its letter is gone
        (replayed, purged), or its unique key is taken again (the PostgreSQL store's
        rules, in `Outcomes.salvage`)."""
        job = self._jobs.get(lease.job.id)
        if job is None or self._reaped.get(job.id) != lease.token:
            return None
        if job.attempts != lease.job.attempts:
            return None
        now = self.clock()
        was_failed = job.status == Status.FAILED
        if job.status == Status.FAILED:
            dead = self._dead.find(job.id)
            key = job.unique_key
            if job.on_failure is not None or dead is None or dead.job_id != job.id:
                return None
            if key is not None and self._unique.setdefault(key, job.id) != job.id:
                return None
            self._dead.pop(dead.id)
            self._finished.remove(job.id)
        elif job.status == Status.PENDING:
            self._pending.discard(job, now.timestamp())
        elif job.status == Status.CLAIMED:
            self._drop_lease(self._tokens[job.id])
        else:
            return None
        del self._reaped[job.id]
        if job.errors and job.errors[-1].attempt == job.attempts:
            job.errors = job.errors[:-1]
            job.last_error = job.errors[-1].error if job.errors else None
        job.finished_at = None
        self._set_status(job, Status.RUNNING, now)
        reopened = msgspec.structs.replace(lease, expires_at=now)
        self._tokens[job.id], self._leases[lease.token] = lease.token, reopened
        self._event(job, EventKind.LATE_OUTCOME, now, LATE_OUTCOME)
        if was_failed:  # a workflow step: the steps its dead letter cancelled wait again
            self._resume(job, job, now)
        return job

    async def complete(self, lease: Lease, result: msgspec.Raw | None) -> Outcome | None:
        """Record success, then chain `on_success`."""
        job = self._held(lease) or self._salvage(lease)
        if job is None:
            return None
        now = self.clock()
        self._drop_lease(lease.token)
        job.result = result
        job.finished_at = now
        self._set_status(job, Status.DONE, now)
        self._event(job, EventKind.SUCCEEDED, now)
        self._retire(job)
        released = self._release_children(job, now) if job.workflow_id is not None else []
        return Outcome(job, self._follow_up(job.on_success, job, now), released=released)

    async def fail(
        self, lease: Lease, error: str, retry_at: datetime | None, traceback: str | None = None
    ) -> Outcome | None:
        """Record a failed attempt: retry at `retry_at`, or dead-letter and chain."""
        job = self._held(lease) or self._salvage(lease)
        if job is None:
            return None
        now = self.clock()
        self._drop_lease(lease.token)
        job.record_error(error, traceback, now)
        self._event(job, EventKind.ATTEMPT_FAILED, now, error, traceback)
        if retry_at is None:
            dead = self._dead_letter(job, now)
            return Outcome(job, self._follow_up(job.on_failure, job, now), dead)
        self._set_status(job, Status.PENDING, now)
        job.run_at = retry_at
        self._make_pending(job, now)
        self._event(job, EventKind.RETRY_SCHEDULED, now, retry_at.isoformat())
        return Outcome(job, [])

    def _dead_letter(self, job: Job, now: datetime) -> DeadLetter:
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
        self._cancel_dependents(job, now)
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
