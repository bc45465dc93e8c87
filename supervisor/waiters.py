"""Requests waiting for jobs to finish (`GET /jobs/{id}?wait=SECONDS`), as a hook.

A waiter is a future in a registry keyed by job id: it holds no worker and no database
connection. An outcome recorded on this node (a terminal `after_outcome`, a cancel)
resolves the job's waiters at once. Outcomes recorded elsewhere (another node sharing a
PostgreSQL store, or the lease reaper) are noticed by a poll that runs only while someone
waits: every `poll` seconds it reads each waited-for job once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager, suppress

from goqueue.supervisor.common.enums import TERMINAL
from goqueue.supervisor.common.errors import StoreError
from goqueue.supervisor.common.hooks import Hook
from goqueue.supervisor.common.jobs import Job, Outcome

log = logging.getLogger("goqueue.waiters")

POLL_SECONDS = 0.5
POLL_READS = 4  # store reads in flight at once during a poll
READ_TIMEOUT = 5.0


class Waiters(Hook):
    """Futures waiting for jobs to reach a terminal status; `quiet` (told of no outcome)
    while nobody waits."""

    def __init__(
        self, read: Callable[[str], Awaitable[Job | None]], *, poll: float = POLL_SECONDS
    ) -> None:
        self._read = read
        self.poll = poll
        self._waiting: dict[str, set[asyncio.Future[Job | None]]] = {}
        self._poller: asyncio.Task[None] | None = None
        self.closed = False
        self.quiet = True

    def __len__(self) -> int:
        """How many jobs are waited for."""
        return len(self._waiting)

    # -- the hook ----------------------------------------------------------------------

    def after_outcome(self, outcome: Outcome) -> None:
        self.finished(outcome.job)

    def after_cancel(self, job: Job, force: bool) -> None:
        self.finished(job)

    def finished(self, job: Job) -> None:
        """Resolve the waiters of `job` if it is terminal."""
        if job.status not in TERMINAL:
            return
        for future in self._waiting.pop(job.id, ()):
            if not future.done():
                future.set_result(job)
        self.quiet = not self._waiting

    # -- waiting -----------------------------------------------------------------------

    @contextmanager
    def watching(self, job_id: str) -> Iterator[asyncio.Future[Job | None]]:
        """A future resolved with the job once it is terminal, or with None when waiting
        ends early (the node is draining); registered until the block ends. Read the job
        inside the block: an outcome recorded after registering is never missed."""
        future: asyncio.Future[Job | None] = asyncio.get_running_loop().create_future()
        if self.closed:
            future.set_result(None)
        else:
            self._waiting.setdefault(job_id, set()).add(future)
            self.quiet = False
            if self._poller is None or self._poller.done():
                self._poller = asyncio.create_task(self._poll(), name="goqueue-waiters-poll")
        try:
            yield future
        finally:
            self._forget(job_id, future)

    def release_all(self) -> None:
        """End every wait now and refuse new ones (the node is draining: a long wait must
        not hold its HTTP server open)."""
        self.closed = True
        waiting, self._waiting = self._waiting, {}
        self.quiet = True
        for futures in waiting.values():
            for future in futures:
                if not future.done():
                    future.set_result(None)
        if self._poller is not None:
            self._poller.cancel()

    def _forget(self, job_id: str, future: asyncio.Future[Job | None]) -> None:
        futures = self._waiting.get(job_id)
        if futures is not None:
            futures.discard(future)
            if not futures:
                del self._waiting[job_id]
                self.quiet = not self._waiting

    async def _poll(self) -> None:
        """While anyone waits: read each waited-for job every `poll` seconds."""
        gate = asyncio.Semaphore(POLL_READS)
        while self._waiting:
            await asyncio.sleep(self.poll)
            await asyncio.gather(*(self._check(job_id, gate) for job_id in list(self._waiting)))

    async def _check(self, job_id: str, gate: asyncio.Semaphore) -> None:
        async with gate:
            if job_id not in self._waiting:
                return
            try:
                async with asyncio.timeout(READ_TIMEOUT):
                    job = await self._read(job_id)
            except (StoreError, TimeoutError) as exc:
                log.debug("wait poll skipped", extra={"job_id": job_id, "err": str(exc)})
                return
        if job is not None:
            self.finished(job)

    async def close(self) -> None:
        """End every wait and the poll, and wait for the poll to stop."""
        self.release_all()
        if self._poller is not None:
            with suppress(asyncio.CancelledError):
                await self._poller
