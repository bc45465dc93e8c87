"""The dispatcher's writes that must not be lost: each attempt's outcome (then the
after-outcome hooks) and each lease handed back, retried while the store is unavailable.

A finished attempt keeps its lease, heartbeated like a running one, until its outcome is
written: `recording` holds those leases meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

from goqueue.supervisor.dispatch import eager
from goqueue.supervisor.dispatch.backoff import Backoff
from goqueue.supervisor.dispatch.hooks import Hook
from goqueue.supervisor.errors import StoreUnavailable
from goqueue.supervisor.jobs import Lease, Outcome

log = logging.getLogger("goqueue.dispatch")

WRITE_RETRY_BASE = 0.2  # a held outcome write is retried after 0.2 s, 0.4 s, ... 5 s
WRITE_RETRY_CAP = 5.0

T = TypeVar("T")


class _Failed:
    """What `_persist` returns for a write that failed for good (logged)."""


FAILED = _Failed()


class Ledger:
    """Runs the dispatcher's store writes to the end, and tells the hooks of outcomes.

    With `at_once` (a store whose calls never wait: in memory) an outcome is written in
    the step that hears of it, without a task; should the write wait after all (the
    store is unavailable and it sleeps before retrying), the rest goes on in a task."""

    def __init__(
        self,
        hooks: Hook,
        *,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        rng: random.Random | None = None,
        at_once: bool = False,
    ) -> None:
        self.hooks = hooks
        self.sleep = sleep
        self.rng = rng or random.Random()
        self.at_once = at_once
        self.recording: dict[str, Lease] = {}  # finished attempts whose outcome is held
        self._writes: set[asyncio.Future[object]] = set()
        self._back = asyncio.Event()  # set (and replaced) when the store answers again

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
