"""One read shared by every caller for a short while: ten dashboards polling a summary
cost the store what one does."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Coalesced(Generic[T]):
    """`get()` answers the last value read less than `ttl` seconds ago, or reads afresh;
    callers arriving while a read is in flight wait for that same read."""

    def __init__(
        self,
        read: Callable[[], Awaitable[T]],
        ttl: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.read = read
        self.ttl = ttl
        self.clock = clock
        self._value: T | None = None
        self._at = float("-inf")
        self._reading: asyncio.Future[T] | None = None
        self._generation = 0

    async def get(self) -> T:
        """The shared value, at most `ttl` seconds old."""
        if self._value is not None and self.clock() - self._at < self.ttl:
            return self._value
        if self._reading is None:
            self._reading = asyncio.ensure_future(self._refresh(self._generation))
            self._reading.add_done_callback(_retrieve)
        # shielded: a client hanging up must not cancel the read the others wait for
        return await asyncio.shield(self._reading)

    def invalidate(self) -> None:
        """Forget the value (it changed): the next `get` reads afresh, and a read already in
        flight is not kept (it may predate the change)."""
        self._value = None
        self._at = float("-inf")
        self._generation += 1
        self._reading = None

    async def _refresh(self, generation: int) -> T:
        try:
            value = await self.read()
        finally:
            if generation == self._generation:
                self._reading = None
        if generation == self._generation:
            self._value, self._at = value, self.clock()
        return value


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Mark a failed read's error as seen even if every caller hung up (each waiting
    caller still gets it raised)."""
    if not future.cancelled():
        future.exception()
