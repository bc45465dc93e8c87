"""Dispatch: claim due jobs for idle workers within per-type slots, and record outcomes.

The dispatcher sleeps until woken (a job enqueued, a worker freed, a delayed job due)
and never polls. Outcomes are written through `_write`, which holds them and retries
while the store is unavailable, so a finished attempt is never forgotten.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from functools import partial

import msgspec
from goqueue.actors.protocol import JobDone, JobFailed
from goqueue.supervisor.catalog import Catalog
from goqueue.supervisor.errors import StoreUnavailable
from goqueue.supervisor.jobs import Job, Lease, Outcome, utcnow
from goqueue.supervisor.pool import Pool, Worker, describe_exit
from goqueue.supervisor.store.base import Store

log = logging.getLogger("goqueue.dispatch")

OutcomeHook = Callable[[Outcome], None]


def backoff(attempt: int, base: float, cap: float, rng: random.Random) -> float:
    """Seconds before retry number `attempt`: base * 2^(attempt-1), capped, ±25 % jitter."""
    delay = min(cap, base * 2 ** max(0, attempt - 1))
    return delay * rng.uniform(0.75, 1.25)


class Dispatcher:
    """Feeds idle workers and turns their reports into store writes."""

    def __init__(
        self,
        store: Store,
        pool: Pool,
        catalog: Catalog,
        *,
        queues: frozenset[str] | None,
        default_timeout: float,
        retry_base: float,
        retry_cap: float,
        on_outcome: OutcomeHook,
        on_attempt: Callable[[str, str, float], None],
        prefetch: int = 0,
    ) -> None:
        self.store = store
        self.pool = pool
        self.catalog = catalog
        self.queues = queues
        self.default_timeout = default_timeout
        self.retry_base = retry_base
        self.retry_cap = retry_cap
        self.on_outcome = on_outcome
        self.on_attempt = on_attempt
        self.prefetch = prefetch
        self.running: Counter[str] = Counter()
        self.buffer: deque[Lease] = deque()  # claimed, not yet started (prefetch)
        self.buffered: Counter[str] = Counter()
        self.dispatching = True
        self.rng = random.Random()
        self._wake = asyncio.Event()
        self._news = 1  # bumped by wake(): work may have arrived
        self._seen = 0  # the `_news` value as of the last claim that came back short
        self._due_timer: asyncio.TimerHandle | None = None
        self._writes: set[asyncio.Task[None]] = set()

    def reconfigure(
        self,
        catalog: Catalog,
        *,
        queues: frozenset[str] | None,
        default_timeout: float,
        retry_base: float,
        retry_cap: float,
    ) -> None:
        """Apply a reload: new actors and limits, queues, timeouts and backoff."""
        self.catalog = catalog
        self.queues = queues
        self.default_timeout = default_timeout
        self.retry_base = retry_base
        self.retry_cap = retry_cap
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
                asyncio.get_running_loop().call_later(1.0, self.wake)

    def _arm_due_timer(self) -> None:
        due = self.store.next_due_at()
        if self._due_timer is not None:
            self._due_timer.cancel()
            self._due_timer = None
        if due is not None:
            delay = max(0.0, (due - utcnow()).total_seconds())
            self._due_timer = asyncio.get_running_loop().call_later(delay + 0.001, self.wake)

    async def fill(self) -> None:
        """Hand buffered leases to idle workers, then claim for the rest (plus `prefetch`
        more to keep in hand, so a freed worker never waits on a store round trip)."""
        while self.dispatching:
            self._hand_out()
            idle = self.pool.idle()
            want = len(idle) + self.prefetch - len(self.buffer)
            if want <= 0:
                return
            types = self.catalog.types if self.prefetch else _types_of(idle)
            held = self.running + self.buffered
            slots = {t: n for t, n in self.catalog.free_slots(held, want).items() if t in types}
            if not slots or self._seen == self._news:
                return
            news = self._news
            try:
                leases = await self.store.claim(want, self.queues, slots)
            except StoreUnavailable as exc:
                log.warning("claim failed: store unavailable", extra={"err": str(exc)})
                asyncio.get_running_loop().call_later(1.0, self.wake)
                return
            self.buffer.extend(leases)
            self.buffered.update(lease.job.type for lease in leases)
            if len(leases) < want:
                self._seen = news  # drained as of then; a wake since means look again
                self._hand_out()
                return

    def _hand_out(self) -> None:
        """Start buffered leases on idle workers that know their type, best first."""
        for worker in self.pool.idle():
            lease = next((x for x in self.buffer if x.job.type in worker.types), None)
            if lease is None:
                continue
            self._unbuffer(lease)
            self._start(lease, worker)

    def _unbuffer(self, lease: Lease) -> None:
        self.buffer.remove(lease)
        self.buffered[lease.job.type] -= 1
        if self.buffered[lease.job.type] <= 0:
            del self.buffered[lease.job.type]

    def drop(self, token: str) -> bool:
        """Forget a buffered lease that is no longer ours (cancelled, taken over)."""
        lease = next((x for x in self.buffer if x.token == token), None)
        if lease is None:
            return False
        self._unbuffer(lease)
        return True

    def release_buffer(self) -> None:
        """Hand every buffered lease back to the store, uncounted (shutdown)."""
        while self.buffer:
            lease = self.buffer[0]
            self._unbuffer(lease)
            self._write(partial(self.store.release, lease))

    def _start(self, lease: Lease, worker: Worker) -> None:
        job = lease.job
        self.running[job.type] += 1
        log.debug(
            "attempt started",
            extra={"job_id": job.id, "type": job.type, "attempt": job.attempts},
        )
        self.pool.run(worker, lease, self.timeout_of(job))

    def timeout_of(self, job: Job) -> float:
        """The deadline in seconds that applies to one attempt of `job`."""
        return job.timeout_seconds or self.catalog.timeout(job.type, self.default_timeout)

    # -- outcomes --------------------------------------------------------------------

    def job_done(self, worker: Worker, message: JobDone) -> None:
        """Record a success."""
        lease = self._finish(worker, "succeeded", message.duration)
        if lease is not None:
            self._record(lease, self.store.complete, msgspec.Raw(message.result))

    def job_failed(self, worker: Worker, message: JobFailed) -> None:
        """Record a failed attempt; retry unless the handler said Fail or retries ran out."""
        lease = self._finish(worker, "failed", message.duration)
        if lease is None:
            return
        if message.traceback:
            log.info(
                "attempt failed",
                extra={**_job_fields(lease), "error": message.error, "exc": message.traceback},
            )
        retry_at = self._retry_at(lease, message.retry, message.delay)
        self._record(lease, self.store.fail, message.error, retry_at)

    def worker_lost(self, worker: Worker) -> None:
        """A worker died holding a lease: timeout, crash, cancellation or shutdown."""
        lease = worker.lease
        if lease is None:
            return
        reason = worker.kill_reason
        # an attempt we ended on purpose (cancel, shutdown, lost lease) is not a crash
        outcome = {"timeout": "timeout", None: "crashed"}.get(reason)
        lease = self._finish(worker, outcome, time.monotonic() - worker.attempt_started)
        if lease is None or reason in ("cancel", "lease_lost"):
            return  # the store already moved on; any write would be fenced anyway
        if reason == "shutdown":
            self._write(partial(self.store.release, lease))
            return
        exit_text = describe_exit(worker.exitcode)
        if reason == "timeout":
            limit = self.timeout_of(lease.job)
            error = f"timed out after {limit:g}s; worker {worker.pid} {exit_text}"
        else:
            error = f"worker {worker.pid} {exit_text} while running the job"
        log.warning(error, extra=_job_fields(lease))
        retry_at = self._retry_at(lease, True, None)
        self._record(lease, self.store.fail, error, retry_at)

    def _finish(self, worker: Worker, outcome: str | None, duration: float) -> Lease | None:
        lease = worker.lease
        if lease is None:
            return None
        job_type = lease.job.type
        self.running[job_type] -= 1
        if self.running[job_type] <= 0:
            del self.running[job_type]
        if outcome is not None:
            self.on_attempt(job_type, outcome, duration)
        if self.catalog.limit(job_type) is not None:
            self.wake()  # a limited slot opened: jobs of that type may now be claimable
        else:
            self.nudge()
        return lease

    def _retry_at(self, lease: Lease, retryable: bool, delay: float | None) -> datetime | None:
        attempt = lease.job.attempts
        if not retryable or attempt > lease.job.max_retries:
            return None
        if delay is None:
            delay = backoff(attempt, self.retry_base, self.retry_cap, self.rng)
        return utcnow() + timedelta(seconds=delay)

    def _record(
        self, lease: Lease, write: Callable[..., Awaitable[Outcome | None]], *args: object
    ) -> None:
        """Write an attempt's outcome (fenced by its lease), then run the follow-ups."""

        async def record() -> None:
            outcome = await write(lease, *args)
            if outcome is None:
                log.warning("lease lost before the outcome was recorded", extra=_job_fields(lease))
                return
            self.on_outcome(outcome)

        self._write(record)

    # -- writes that must not be lost -----------------------------------------------

    def _write(self, make: Callable[[], Awaitable[object]]) -> None:
        task = asyncio.ensure_future(self._persist(make))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def _persist(self, make: Callable[[], Awaitable[object]]) -> None:
        """Run a store write, retrying while the store is unavailable."""
        delay = 0.2
        while True:
            try:
                await make()
                return
            except StoreUnavailable as exc:
                log.warning("store unavailable; holding an outcome", extra={"err": str(exc)})
            except Exception:
                log.exception("recording an outcome failed")
                return
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)

    async def flush(self, timeout: float) -> None:
        """Wait for outstanding outcome writes (shutdown)."""
        if self._writes:
            await asyncio.wait(set(self._writes), timeout=timeout)


def _types_of(workers: list[Worker]) -> frozenset[str]:
    return frozenset().union(*(w.types for w in workers)) if workers else frozenset()


def _job_fields(lease: Lease) -> dict[str, object]:
    job = lease.job
    return {"job_id": job.id, "type": job.type, "attempt": job.attempts}
