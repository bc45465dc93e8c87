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

from goqueue.supervisor.backoff import Backoff
from goqueue.supervisor.errors import StoreUnavailable
from goqueue.supervisor.hooks import Hook
from goqueue.supervisor.jobs import Lease, Outcome

log = logging.getLogger("goqueue.dispatch")

WRITE_RETRY_BASE = 0.2  # a held outcome write is retried after 0.2 s, 0.4 s, ... 5 s
WRITE_RETRY_CAP = 5.0


class Ledger:
    """Runs the dispatcher's store writes to the end, and tells the hooks of outcomes."""

    def __init__(
        self,
        hooks: Hook,
        *,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        rng: random.Random | None = None,
    ) -> None:
        self.hooks = hooks
        self.sleep = sleep
        self.rng = rng or random.Random()
        self.recording: dict[str, Lease] = {}  # finished attempts whose outcome is held
        self._writes: set[asyncio.Future[None]] = set()

    def record(self, lease: Lease, write: Callable[[], Awaitable[Outcome | None]]) -> None:
        """Write an attempt's outcome (fenced by its lease), then tell the hooks."""

        async def record() -> None:
            outcome = await write()
            if outcome is None:
                job = lease.job
                fields = {"job_id": job.id, "type": job.type, "attempt": job.attempts}
                log.warning("lease lost before the outcome was recorded", extra=fields)
                return
            self.hooks.after_outcome(outcome)

        self.recording[lease.token] = lease  # heartbeated until the write is done
        done = self.write(record)
        done.add_done_callback(lambda _: self.recording.pop(lease.token, None))

    def write(self, make: Callable[[], Awaitable[object]]) -> asyncio.Future[None]:
        """Run the store write `make` makes, retrying while the store is unavailable."""
        return self.track(self._persist(make))

    def track(self, work: Awaitable[None]) -> asyncio.Future[None]:
        """Run `work` as a task that `flush` waits for."""
        task = asyncio.ensure_future(work)
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)
        return task

    async def _persist(self, make: Callable[[], Awaitable[object]]) -> None:
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
        """Wait for outstanding writes (shutdown)."""
        if self._writes:
            await asyncio.wait(set(self._writes), timeout=timeout)
