"""What happens when an attempt starts and ends, in one place (as dramatiq's middleware):
the attempt hooks, the retry or dead-letter decision, the outcome's fenced store write
(held and retried while the store is unavailable), then the after-outcome hooks, in that
order; `Hooks` fans each event out to the hooks that care (the engine reports jobs
enqueued and cancelled through it too). The dispatcher's other writes that must not be
lost (leases handed back) are held here the same way.

A finished attempt keeps its lease, heartbeated like a running one, until its outcome is
written: `recording` holds those leases meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timedelta
from functools import partial
from typing import TypeVar

import msgspec
from goqueue.actors.protocol import JobFailed
from goqueue.supervisor.common import eager
from goqueue.supervisor.common.backoff import Backoff, backoff
from goqueue.supervisor.common.enums import AttemptOutcome, KillReason
from goqueue.supervisor.common.errors import StoreUnavailable
from goqueue.supervisor.common.hooks import Hook
from goqueue.supervisor.common.jobs import Job, Lease, Outcome, utcnow
from goqueue.supervisor.dispatch.policy import DEFAULT_POLICY, Policy
from goqueue.supervisor.store.base import Store
from goqueue.supervisor.workers.handle import Worker, death_notice

log = logging.getLogger("goqueue.dispatch")
hook_log = logging.getLogger("goqueue.hooks")

WRITE_RETRY_BASE = 0.2  # a held outcome write is retried after 0.2 s, 0.4 s, ... 5 s
WRITE_RETRY_CAP = 5.0

T = TypeVar("T")


class _Failed:
    """What `_persist` returns for a write that failed for good (logged)."""


FAILED = _Failed()


class Outcomes:
    """What becomes of each attempt: hooks told, retry decided, outcome written.

    With `at_once` (a store whose calls never wait: in memory) an outcome is written in
    the step that hears of it, without a task; should the write wait after all (the
    store is unavailable and it sleeps before retrying), the rest goes on in a task.
    `policy` (the retry backoff) is replaced whole on a reload."""

    def __init__(
        self,
        store: Store,
        hooks: Hook,
        *,
        policy: Policy = DEFAULT_POLICY,
        clock: Callable[[], datetime] = utcnow,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        rng: random.Random | None = None,
        at_once: bool = False,
    ) -> None:
        self.store = store
        self.hooks = hooks
        self.policy = policy
        self.clock = clock
        self.sleep = sleep
        self.rng = rng or random.Random()
        self.at_once = at_once
        self.recording: dict[str, Lease] = {}  # finished attempts whose outcome is held
        self._writes: set[asyncio.Future[object]] = set()
        self._back = asyncio.Event()  # set (and replaced) when the store answers again

    # -- an attempt's life, in order -------------------------------------------------

    def started(self, job: Job) -> None:
        """An attempt of `job` was handed to a worker."""
        self.hooks.after_start(job)

    def succeeded(self, lease: Lease, result: bytes, duration: float) -> None:
        """An attempt succeeded: counted, then its result written."""
        self.hooks.after_attempt(lease.job.type, AttemptOutcome.SUCCEEDED, duration)
        self.record(lease, partial(self.store.complete, lease, msgspec.Raw(result)))

    def failed(self, lease: Lease, message: JobFailed) -> None:
        """An attempt raised (or the supervisor failed it): counted, an unexpected error
        told (one with a traceback), then the job retried (after the handler's delay,
        else the policy's backoff) or dead-lettered when the handler said Fail or
        retries ran out."""
        job = lease.job
        self.hooks.after_attempt(job.type, AttemptOutcome.FAILED, message.duration)
        if message.traceback:
            self.hooks.after_error(job, message.error, message.traceback)
        retry_at = self.retry_at(job, message.retry, message.delay)
        traceback = message.traceback or None
        self.record(lease, partial(self.store.fail, lease, message.error, retry_at, traceback))

    def died(
        self, lease: Lease, error: str, counted: AttemptOutcome | None, duration: float
    ) -> None:
        """The worker running the attempt died (timeout, crash, memory): counted as
        `counted` (None: ended on purpose, not counted), told as an error, then the job
        retried with the backoff or dead-lettered."""
        if counted is not None:
            self.hooks.after_attempt(lease.job.type, counted, duration)
        self.hooks.after_error(lease.job, error, "")
        retry_at = self.retry_at(lease.job, True, None)
        self.record(lease, partial(self.store.fail, lease, error, retry_at))

    def lost(self, lease: Lease, worker: Worker, timeout: float) -> None:
        """`worker` died running `lease`'s attempt (its deadline `timeout` seconds): as
        its kill reason says, nothing (cancelled, lost: the store moved on), handed back
        uncounted (shutdown), or `died`, counted unless it was ended on purpose."""
        reason = worker.kill_reason
        if reason in (KillReason.CANCEL, KillReason.LEASE_LOST):
            return  # the store already moved on; any write would be fenced anyway
        if reason == KillReason.SHUTDOWN:
            self.released(lease)
            return
        counted = {KillReason.TIMEOUT: AttemptOutcome.TIMEOUT, None: AttemptOutcome.CRASHED}
        error = death_notice(worker, timeout)
        duration = time.monotonic() - worker.attempt_started
        self.died(lease, error, counted.get(reason), duration)

    def released(self, lease: Lease) -> asyncio.Future[object]:
        """Hand `lease` back to the store uncounted (shutdown, a stale or unstarted lease)."""
        return self.write(partial(self.store.release, lease))

    def retry_at(self, job: Job, retryable: bool, delay: float | None) -> datetime | None:
        """When a failed attempt of `job` is tried again; None: dead-lettered."""
        attempt = job.attempts
        if not retryable or attempt > job.max_retries:
            return None
        if delay is None:
            delay = self.retry_delay(attempt)
        return self.clock() + timedelta(seconds=delay)

    def retry_delay(self, attempt: int) -> float:
        """Seconds before retry number `attempt` of a job, with the policy's backoff."""
        return backoff(attempt, self.policy.retry_base, self.policy.retry_cap, self.rng)

    # -- the writes ------------------------------------------------------------------

    def record(self, lease: Lease, write: Callable[[], Awaitable[Outcome | None]]) -> None:
        """Write an attempt's outcome (fenced by its lease), then tell the hooks."""
        self.recording[lease.token] = lease  # heartbeated until the write is done
        work = self._record(lease, write)
        if not self.at_once:
            self.track(work)
            return
        started = eager.step(work)
        if isinstance(started, eager.Waiting):
            self.track(_finish(started))

    async def _record(self, lease: Lease, write: Callable[[], Awaitable[Outcome | None]]) -> None:
        try:
            outcome = await self._persist(write)
            if outcome is None:
                job = lease.job
                fields = {"job_id": job.id, "type": job.type, "attempt": job.attempts}
                log.warning("lease lost before the outcome was recorded", extra=fields)
            elif not isinstance(outcome, _Failed):
                self.hooks.after_outcome(outcome)
        finally:
            self.recording.pop(lease.token, None)

    def write(self, make: Callable[[], Awaitable[object]]) -> asyncio.Future[object]:
        """Run the store write `make` makes, retrying while the store is unavailable."""
        return self.track(self._persist(make))

    def track(self, work: Awaitable[object]) -> asyncio.Future[object]:
        """Run `work` as a task that `flush` waits for."""
        task = asyncio.ensure_future(work)
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)
        return task

    async def _persist(self, make: Callable[[], Awaitable[T]]) -> T | _Failed:
        delays: Backoff | None = None
        while True:
            try:
                return await make()
            except StoreUnavailable as exc:
                log.warning("store unavailable; holding an outcome", extra={"err": str(exc)})
            except Exception:
                log.exception("recording an outcome failed")
                return FAILED
            delays = delays or Backoff(WRITE_RETRY_BASE, WRITE_RETRY_CAP, self.rng)
            await self._pause(delays.next())

    async def _pause(self, seconds: float) -> None:
        """Sleep `seconds` before a held write's next try, or less if the store answers
        again meanwhile (`store_back`)."""
        sleeping = asyncio.ensure_future(self.sleep(seconds))
        waking = asyncio.ensure_future(self._back.wait())
        try:
            await asyncio.wait({sleeping, waking}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeping.cancel()
            waking.cancel()

    def store_back(self) -> None:
        """The store answers again: held writes try at once, not after their backoff
        (a node that dies soon after an outage must not die holding outcomes it could
        have written)."""
        self._back.set()
        self._back = asyncio.Event()

    async def flush(self, timeout: float) -> None:
        """Wait for outstanding writes (shutdown)."""
        if self._writes:
            await asyncio.wait(set(self._writes), timeout=timeout)


async def _finish(waiting: eager.Waiting[None]) -> None:
    await waiting


class Hooks(Hook):
    """Every hook of a node, called in a fixed order; a hook that raises is logged.

    Each event is fanned out only to the hooks that override its method: the calls sit
    on every job's path, and most hooks care about few events."""

    def __init__(self, hooks: Sequence[Hook]) -> None:
        self.hooks = tuple(hooks)
        hs = self.hooks
        self._enqueue = [h for h in hs if type(h).after_enqueue is not Hook.after_enqueue]
        self._start = [h for h in hs if type(h).after_start is not Hook.after_start]
        self._attempt = [h for h in hs if type(h).after_attempt is not Hook.after_attempt]
        self._error = [h for h in hs if type(h).after_error is not Hook.after_error]
        self._outcome = [h for h in hs if type(h).after_outcome is not Hook.after_outcome]
        self._cancel = [h for h in hs if type(h).after_cancel is not Hook.after_cancel]

    def after_enqueue(self, job: Job) -> None:
        for hook in self._enqueue:
            try:
                hook.after_enqueue(job)
            except Exception:
                _failed(hook, "after_enqueue")

    def after_start(self, job: Job) -> None:
        for hook in self._start:
            try:
                hook.after_start(job)
            except Exception:
                _failed(hook, "after_start")

    def after_attempt(self, job_type: str, outcome: AttemptOutcome, duration: float) -> None:
        for hook in self._attempt:
            try:
                hook.after_attempt(job_type, outcome, duration)
            except Exception:
                _failed(hook, "after_attempt")

    def after_error(self, job: Job, error: str, traceback: str) -> None:
        for hook in self._error:
            try:
                hook.after_error(job, error, traceback)
            except Exception:
                _failed(hook, "after_error")

    def after_outcome(self, outcome: Outcome) -> None:
        job = outcome.job
        for hook in self._outcome:
            if hook.quiet or (hook.needs is not None and not getattr(job, hook.needs)):
                continue
            try:
                hook.after_outcome(outcome)
            except Exception:
                _failed(hook, "after_outcome")

    def after_cancel(self, job: Job, force: bool) -> None:
        for hook in self._cancel:
            if hook.quiet:
                continue
            try:
                hook.after_cancel(job, force)
            except Exception:
                _failed(hook, "after_cancel")


def _failed(hook: Hook, event: str) -> None:
    hook_log.exception("hook failed", extra={"hook": type(hook).__name__, "event": event})
