"""The PostgreSQL store's audit trail, written behind in batches.

`EventLog` buffers the events of every commit without blocking it and writes them in
batches (one statement each, columns as arrays), every fraction of a second or as soon
as a batch is full. While the database is down the events stay buffered, up to a cap
beyond which the oldest are dropped with a warning; reading a job's trail flushes first.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Sequence
from contextlib import suppress
from typing import Any

import psycopg
from goqueue.supervisor.errors import StoreUnavailable
from goqueue.supervisor.jobs import Event

# The store's logger: these records keep the name operators already filter on.
log = logging.getLogger("goqueue.store.postgres")


class EventLog:
    """The audit trail's write-behind buffer: `add` never blocks; `run` writes batches.

    While the database is down events stay buffered, up to `capacity`; beyond it the
    oldest are dropped with a warning.
    """

    def __init__(
        self,
        insert_sql: str,
        connect: Callable[[], Any],
        *,
        capacity: int = 100_000,
        batch: int = 500,
        interval: float = 0.2,
    ) -> None:
        self._insert_sql = insert_sql
        self._connect = connect
        self.capacity = capacity
        self.batch = batch
        self.interval = interval
        self._buffer: deque[Event] = deque()
        self._kick = asyncio.Event()
        self._lock = asyncio.Lock()
        self.dropped = 0

    def __len__(self) -> int:
        return len(self._buffer)

    def add(self, events: Sequence[Event]) -> None:
        """Buffer events for the next batch."""
        self._buffer.extend(events)
        self._trim()
        if len(self._buffer) >= self.batch:
            self._kick.set()

    def _trim(self) -> None:
        excess = len(self._buffer) - self.capacity
        if excess <= 0:
            return
        for _ in range(excess):
            self._buffer.popleft()
        if self.dropped == 0:
            log.warning("audit event buffer full: dropping the oldest events")
        self.dropped += excess

    async def run(self) -> None:
        """Write batches every `interval` (sooner when a batch is full), forever."""
        delay = self.interval
        while True:
            with suppress(TimeoutError):
                await asyncio.wait_for(self._kick.wait(), timeout=delay)
            self._kick.clear()
            try:
                await self.flush()
                delay = self.interval
            except StoreUnavailable as exc:
                delay = min(max(delay * 2, 0.5), 5.0)
                log.warning(
                    "audit events held: store unavailable",
                    extra={"err": str(exc), "held": len(self._buffer)},
                )
            except Exception:
                delay = min(max(delay * 2, 0.5), 5.0)
                log.exception("audit events held: writing them failed")

    async def flush(self) -> None:
        """Write the events buffered so far, not those arriving meanwhile (they wait for
        the next batch, rather than each costing a commit); on failure they are put back
        and re-raised."""
        async with self._lock:
            left = len(self._buffer)
            while left > 0 and self._buffer:
                n = min(self.batch * 10, left, len(self._buffer))
                left -= n
                chunk = [self._buffer.popleft() for _ in range(n)]
                try:
                    await self._write(chunk)
                except psycopg.DataError:
                    # A row the database refuses would block every later one: drop it.
                    log.exception("audit events refused by the database: %d dropped", n)
                except BaseException:
                    self._buffer.extendleft(reversed(chunk))
                    self._trim()
                    raise
            if self.dropped:
                log.warning(
                    "audit events dropped while the store was unavailable: %d", self.dropped
                )
                self.dropped = 0

    async def _write(self, chunk: list[Event]) -> None:
        """One statement for the chunk: its columns as arrays (cheaper here than COPY's
        row by row formatting, which held up the event loop for a large batch)."""
        columns = {
            "job_id": [e.job_id for e in chunk],
            "event": [e.event for e in chunk],
            "at": [e.at for e in chunk],
            "node": [e.node for e in chunk],
            "attempt": [e.attempt for e in chunk],
            "detail": [e.detail for e in chunk],
        }
        async with self._connect() as conn:
            await conn.execute(self._insert_sql, columns)
