"""The gauges a scrape shows, refreshed from the store without ever making /metrics slow."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

log = logging.getLogger("goqueue.api")


class GaugeRefresh:
    """The gauges' store read, bounded for a scrape: one read at a time, and a scrape
    waits for it at most `wait` seconds, and only while reads have been that quick. Past
    that it answers the last values (the read goes on, and the next scrape has it): a slow
    store makes the queue depths one scrape old, never /metrics slow."""

    def __init__(self, refresh: Callable[[], Awaitable[None]]) -> None:
        self._refresh = refresh
        self._task: asyncio.Task[None] | None = None
        self._took = 0.0  # seconds the last finished read took

    async def fresh(self, wait: float) -> None:
        """Start a read unless one runs, and wait for it (see the class)."""
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._run())
        if self._took > wait:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._task), wait)

    async def close(self) -> None:
        """Stop a read still running (the app is shutting down)."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        started = time.monotonic()
        try:
            await self._refresh()
        except Exception:
            log.exception("refreshing the gauges failed")
        self._took = time.monotonic() - started
