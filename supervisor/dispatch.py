"""Dispatch: claim due jobs for idle workers within per-type slots, and record outcomes.

The dispatcher sleeps until woken (a job enqueued, a worker freed, a delayed job due)
and never polls. It hears the pool's job events directly and writes each outcome to the
store, then tells the hooks. Writes go through `_write`, which holds them and retries
while the store is unavailable, so a finished attempt is never forgotten.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING

import msgspec
from goqueue.actors.protocol import JobDone, JobFailed
from goqueue.supervisor.backoff import Backoff, backoff
from goqueue.supervisor.catalog import Catalog
from goqueue.supervisor.errors import StoreUnavailable
from goqueue.supervisor.hooks import Hook
from goqueue.supervisor.jobs import Job, Lease, Outcome, utcnow
from goqueue.supervisor.pool import Pool, describe_exit
from goqueue.supervisor.store.base import Store
from goqueue.supervisor.vocab import AttemptOutcome, KillReason
from goqueue.supervisor.worker import Worker

if TYPE_CHECKING:
    from goqueue.supervisor.config import Settings

log = logging.getLogger("goqueue.dispatch")

RETRY_CLAIM = 1.0  # seconds before claiming again after a failed pass
WRITE_RETRY_BASE = 0.2  # a held outcome write is retried after 0.2 s, 0.4 s, ... 5 s
WRITE_RETRY_CAP = 5.0


@dataclass(frozen=True, slots=True)
class Policy:
    """What the operator decides about dispatch; replaced whole on a reload."""

    queues: frozenset[str] | None = None  # None: every queue
    default_timeout: float = 300.0
    retry_base: float = 1.0
    retry_cap: float = 3600.0

    @classmethod
    def of(cls, settings: Settings) -> Policy:
        """The policy `settings` ask for."""
        queues = frozenset(settings.queues) if settings.queues else None
        return cls(queues, settings.default_timeout, settings.retry_base, settings.retry_cap)


class Dispatcher:
    """Feeds idle workers and turns their reports into store writes, then hook calls."""

    def __init__(
        self,
        store: Store,
        pool: Pool,
        catalog: Catalog,
        hooks: Hook,
        *,
        policy: Policy = Policy(),
        prefetch: int = 0,
        clock: Callable[[], datetime] = utcnow,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.store = store
        self.pool = pool
        self.catalog = catalog
        self.hooks = hooks
        self.policy = policy
        self.prefetch = prefetch
        self.clock = clock
        self.sleep = sleep
        self._running: Counter[str] = Counter()
        self._started: dict[str, Lease] = {}  # token -> lease of each attempt on a worker
        self._buffer: deque[Lease] = deque()  # claimed, not yet started (prefetch)
        self._buffered: Counter[str] = Counter()
        self.dispatching = True
        self.rng = random.Random()
        self._wake = asyncio.Event()
        self._news = 1  # bumped by wake(): work may have arrived
        self._seen = 0  # the `_news` value as of the last claim that came back short
        self._due_timer: asyncio.TimerHandle | None = None
        self._writes: set[asyncio.Task[None]] = set()

    def reconfigure(self, catalog: Catalog, policy: Policy) -> None:
        """Apply new actors and limits (boot, reload) and a new policy (reload)."""
        self.catalog = catalog
        self.policy = policy
        self.wake()

    def wake(self) -> None:
        """New work may be claimable (enqueued, due, a slot freed): claim on the next pass."""
        self._news += 1
        self._wake.set()

    def nudge(self) -> None:
        """A worker freed up: hand it a held lease, but only go to the store if the last
        claim did not already come back short (an empty queue costs no round trips)."""
        self._wake.set()

    async def run(self) -> None:
        """The dispatch loop; cancel the task to stop it."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            if not self.dispatching:
                continue
            try:
                await self.fill()
                self._arm_due_timer()
            except Exception:  # a bug must not stop dispatching for good
                log.exception("dispatch pass failed; retrying in 1 s")
                asyncio.get_running_loop().call_later(RETRY_CLAIM, self.wake)

    def _arm_due_timer(self) -> None:
        due = self.store.next_due_at()
        if self._due_timer is not None:
            self._due_timer.cancel()
            self._due_timer = None
        if due is not None:
            delay = max(0.0, (due - self.clock()).total_seconds())
            self._due_timer = asyncio.get_running_loop().call_later(delay + 0.001, self.wake)

    async def fill(self) -> None:
        """Hand buffered leases to idle workers, then claim for the rest (plus `prefetch`
        more to keep in hand, so a freed worker never waits on a store round trip)."""
        while self.dispatching:
            self._hand_out()
            idle = self.pool.idle()
            want = len(idle) + self.prefetch - len(self._buffer)
            if want <= 0:
                return
            types = self.catalog.types if self.prefetch else _types_of(idle)
            held = self._running + self._buffered
            slots = {t: n for t, n in self.catalog.free_slots(held, want).items() if t in types}
            if not slots or self._seen == self._news:
                return
            news = self._news
            try:
                leases = await self.store.claim(want, self.policy.queues, slots)
            except StoreUnavailable as exc:
                log.warning("claim failed: store unavailable", extra={"err": str(exc)})
                asyncio.get_running_loop().call_later(RETRY_CLAIM, self.wake)
                return
            self._buffer.extend(leases)
            self._buffered.update(lease.job.type for lease in leases)
            if len(leases) < want:
                self._seen = news  # drained as of then; a wake since means look again
                self._hand_out()
                return

    def _hand_out(self) -> None:
        """Start buffered leases on idle workers that know their type, best first."""
        if not self._buffer:  # nothing in hand (the usual case): no need to list workers
            return
        for worker in self.pool.idle():
            lease = next((x for x in self._buffer if x.job.type in worker.types), None)
            if lease is None:
                continue
            self._unbuffer(lease)
            self._start(lease, worker)

    def _unbuffer(self, lease: Lease) -> None:
        self._buffer.remove(lease)
        self._buffered[lease.job.type] -= 1
        if self._buffered[lease.job.type] <= 0:
            del self._buffered[lease.job.type]

    def _start(self, lease: Lease, worker: Worker) -> None:
        job = lease.job
        self._running[job.type] += 1
        self._started[lease.token] = lease
        self.hooks.after_start(job)
        self.pool.run(worker, lease, self.timeout_of(job))

    def timeout_of(self, job: Job) -> float:
        """The deadline in seconds that applies to one attempt of `job`."""
        return job.timeout_seconds or self.catalog.timeout(job.type, self.policy.default_timeout)

    # -- leases held -----------------------------------------------------------------

    def held_leases(self) -> list[Lease]:
        """Every lease this node holds: attempts on workers, then those in hand."""
        return [*self._started.values(), *self._buffer]

    def drop(self, token: str) -> bool:
        """Forget a buffered lease that is no longer ours (cancelled, taken over)."""
        lease = next((x for x in self._buffer if x.token == token), None)
        if lease is None:
            return False
        self._unbuffer(lease)
        return True

    def stop_lease(self, token: str, reason: KillReason) -> bool:
        """End the attempt holding `token`: kill its worker, or drop it from the buffer.
        False if this node holds no such lease."""
        worker = self.pool.holding(token)
        if worker is None:
            return self.drop(token)
        self.pool.kill(worker, reason)
        return True

    def cancel_lease(self, token: str) -> bool:
        """Stop a cancelled job's attempt (the engine's `kill`)."""
        return self.stop_lease(token, KillReason.CANCEL)

    def release_buffer(self) -> None:
        """Hand every buffered lease back to the store, uncounted (shutdown)."""
        while self._buffer:
            lease = self._buffer[0]
            self._unbuffer(lease)
            self._write(partial(self.store.release, lease))

    # -- outcomes (the pool's JobEvents) ---------------------------------------------

    def job_done(self, lease: Lease, message: JobDone) -> None:
        """Record a success."""
        self._finish(lease, AttemptOutcome.SUCCEEDED, message.duration)
        self._record(lease, partial(self.store.complete, lease, msgspec.Raw(message.result)))

    def job_failed(self, lease: Lease, message: JobFailed) -> None:
        """Record a failed attempt; retry unless the handler said Fail or retries ran out."""
        self._finish(lease, AttemptOutcome.FAILED, message.duration)
        if message.traceback:
            self.hooks.after_error(lease.job, message.error, message.traceback)
        retry_at = self._retry_at(lease, message.retry, message.delay)
        self._record(lease, partial(self.store.fail, lease, message.error, retry_at))

    def job_lost(self, lease: Lease, worker: Worker) -> None:
        """A worker died holding `lease`: timeout, crash, cancellation or shutdown."""
        reason = worker.kill_reason
        duration = time.monotonic() - worker.attempt_started
        if reason == KillReason.TIMEOUT:
            self._finish(lease, AttemptOutcome.TIMEOUT, duration)
        elif reason is None:
            self._finish(lease, AttemptOutcome.CRASHED, duration)
        else:  # an attempt we ended on purpose is not counted as an attempt outcome
            self._finish(lease, None, duration)
        if reason in (KillReason.CANCEL, KillReason.LEASE_LOST):
            return  # the store already moved on; any write would be fenced anyway
        if reason == KillReason.SHUTDOWN:
            self._write(partial(self.store.release, lease))
            return
        exit_text = describe_exit(worker.exitcode)
        if reason == KillReason.TIMEOUT:
            limit = self.timeout_of(lease.job)
            error = f"timed out after {limit:g}s; worker {worker.pid} {exit_text}"
        else:
            error = f"worker {worker.pid} {exit_text} while running the job"
        self.hooks.after_error(lease.job, error, "")
        retry_at = self._retry_at(lease, True, None)
        self._record(lease, partial(self.store.fail, lease, error, retry_at))

    def _finish(self, lease: Lease, outcome: AttemptOutcome | None, duration: float) -> None:
        job_type = lease.job.type
        self._started.pop(lease.token, None)
        self._running[job_type] -= 1
        if self._running[job_type] <= 0:
            del self._running[job_type]
        if outcome is not None:
            self.hooks.after_attempt(job_type, outcome, duration)
        if self.catalog.limit(job_type) is not None:
            self.wake()  # a limited slot opened: jobs of that type may now be claimable
        else:
            self.nudge()

    def _retry_at(self, lease: Lease, retryable: bool, delay: float | None) -> datetime | None:
        attempt = lease.job.attempts
        if not retryable or attempt > lease.job.max_retries:
            return None
        if delay is None:
            delay = backoff(attempt, self.policy.retry_base, self.policy.retry_cap, self.rng)
        return self.clock() + timedelta(seconds=delay)

    def _record(self, lease: Lease, write: Callable[[], Awaitable[Outcome | None]]) -> None:
        """Write an attempt's outcome (fenced by its lease), then tell the hooks."""

        async def record() -> None:
            outcome = await write()
            if outcome is None:
                job = lease.job
                fields = {"job_id": job.id, "type": job.type, "attempt": job.attempts}
                log.warning("lease lost before the outcome was recorded", extra=fields)
                return
            self.hooks.after_outcome(outcome)

        self._write(record)

    # -- writes that must not be lost -----------------------------------------------

    def _write(self, make: Callable[[], Awaitable[object]]) -> None:
        task = asyncio.ensure_future(self._persist(make))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def _persist(self, make: Callable[[], Awaitable[object]]) -> None:
        """Run a store write, retrying while the store is unavailable."""
        delays = Backoff(WRITE_RETRY_BASE, WRITE_RETRY_CAP, self.rng)
        while True:
            try:
                await make()
                return
            except StoreUnavailable as exc:
                log.warning("store unavailable; holding an outcome", extra={"err": str(exc)})
            except Exception:
                log.exception("recording an outcome failed")
                return
            await self.sleep(delays.next())

    async def flush(self, timeout: float) -> None:
        """Wait for outstanding outcome writes (shutdown)."""
        if self._writes:
            await asyncio.wait(set(self._writes), timeout=timeout)


def _types_of(workers: list[Worker]) -> frozenset[str]:
    return frozenset().union(*(w.types for w in workers)) if workers else frozenset()
