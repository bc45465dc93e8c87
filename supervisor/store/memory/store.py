"""The in-memory store: heaps for due and delayed jobs, dicts for everything else.

Single-threaded by design (it lives on the supervisor's event loop), so each method is
atomic simply because it never awaits. It implements leases too, with this node as the
only owner, so the same contract tests hold for both stores.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from goqueue.supervisor.common.bulk import BULK_CANCEL, CancelFilter, Cancelled, Purged, Replayed
from goqueue.supervisor.common.enums import TERMINAL, EventKind, Status
from goqueue.supervisor.common.errors import InvalidState, NotFound, StoreFull
from goqueue.supervisor.common.jobs import DeadLetter, Job
from goqueue.supervisor.common.rates import Rate
from goqueue.supervisor.common.schedule import Fired, ScheduleState, fire_detail
from goqueue.supervisor.common.summaries import DeadFilter
from goqueue.supervisor.store.base import IN_PROCESS, NewJob, NodeLinks, Upkeep
from goqueue.supervisor.store.memory.writes import MemoryWrites


class MemoryStore(MemoryWrites):
    """A bounded, non-durable store for one node: the write path of `MemoryWrites`, and
    what a node and its operators do besides (start-up, schedules, cancels, pauses,
    pruning, dead-letter replays)."""

    traits = IN_PROCESS

    # -- lifecycle -------------------------------------------------------------------

    async def reserve(self) -> None:
        """Nothing to hold: a node may share this store."""

    async def open(self, links: NodeLinks | None = None) -> None:
        """Nothing to connect to: keep `links`."""
        if links is not None:
            self._links = links

    async def close(self) -> None:
        """Nothing to release."""

    def upkeep(self) -> Upkeep:
        """Nothing to look after: the defaults."""
        return Upkeep()

    async def ping(self) -> bool:
        """Always reachable."""
        return True

    async def cancel_elsewhere(self, job_id: str, token: str) -> None:
        """Nothing to tell: every lease of this store is held on this node."""

    async def register_node(
        self,
        limits: Mapping[str, int | None],
        *,
        key_limits: Mapping[str, int] | None = None,
        key_rates: Mapping[str, Rate] | None = None,
    ) -> None:
        """Remember this node's job types and limits, and its per-key limits and rates."""
        self._limits = dict(limits)
        self._key_limits = dict(key_limits or {})
        self._key_rates = dict(key_rates or {})

    async def known_types(self) -> frozenset[str]:
        """The types this node declared."""
        return frozenset(self._limits)

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

    # -- cancels ---------------------------------------------------------------------

    async def cancel(self, job_id: str, force: bool) -> tuple[Job, str | None]:
        """Cancel a pending job, or a running one with `force`."""
        job = self._jobs.get(job_id)
        if job is None:
            raise NotFound(f"job {job_id} not found")
        if job.status in TERMINAL:
            raise InvalidState(f"job {job_id} is already {job.status}", job.status)
        if job.status == Status.RUNNING and not force:
            raise InvalidState(f"job {job_id} is running; use force=true to kill it", job.status)
        return job, self._cancel(job, self.clock())

    async def cancel_many(self, filters: CancelFilter, limit: int) -> Cancelled:
        """Cancel up to `limit` unfinished jobs passing `filters`, oldest first."""
        matching = [j for j in self._jobs.values() if filters.matches(j)]
        left_alone = () if Status.RUNNING in filters.statuses else (Status.RUNNING,)
        running = sum(1 for j in matching if j.status in left_alone)
        taken = sorted(
            (j for j in matching if j.status in filters.statuses),
            key=lambda j: (j.created_at, j.seq),
        )
        taken, remaining = taken[:limit], max(0, len(taken) - limit)
        killed = sum(1 for j in taken if j.status == Status.RUNNING)
        now = self.clock()
        cancelled = [self._cancel(job, now, BULK_CANCEL) for job in taken]
        tokens = [token for token in cancelled if token is not None]
        return Cancelled(taken, tokens, remaining, running, killed)

    def _cancel(self, job: Job, now: datetime, detail: str | None = None) -> str | None:
        """Cancel an unfinished job; the token of the lease it had, if any."""
        token = self._tokens.get(job.id)
        if token is not None:
            self._drop_lease(token)
        if job.status == Status.PENDING:
            self._pending.discard(job, now.timestamp())
        job.finished_at = now
        self._set_status(job, Status.CANCELLED, now)
        self._event(job, EventKind.CANCELLED, now, detail)
        self._retire(job)
        self._cancel_dependents(job, now)
        return token

    # -- queues and pruning ----------------------------------------------------------

    async def set_paused(self, queue: str, paused: bool) -> None:
        """Pause or resume a queue."""
        if paused:
            self._paused.add(queue)
        else:
            self._paused.discard(queue)
            self._wake()

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

    async def replay_dead(self, dead_id: str, max_retries: int) -> Job:
        """Enqueue a fresh job from a dead letter, then drop the letter."""
        dead = self._dead.get(dead_id)
        if dead is None:
            raise NotFound(f"dead letter {dead_id} not found")
        self._check_room()
        return self._replay(dead, max_retries, self.clock())

    def _replay(self, dead: DeadLetter, max_retries: int, now: datetime) -> Job:
        job = self._insert(dead.job.replay_spec(), now, max_retries, None)
        self._resume(dead.job, job, now)
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
            try:
                self._check_room()
            except StoreFull:
                if not jobs:
                    raise
                break
            jobs.append(self._replay(dead, dead.job.max_retries, now))
        return Replayed(jobs, more + len(letters) - len(jobs))

    async def purge_dead(self, dead_id: str) -> bool:
        """Delete a dead letter."""
        return self._dead.pop(dead_id) is not None

    async def purge_dead_many(self, filters: DeadFilter, limit: int) -> Purged:
        """Delete up to `limit` matching letters, oldest first."""
        return self._dead.purge_matching(filters, limit)
