"""The one backoff formula: job retries, webhook retries and every reconnect loop use it."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable

log = logging.getLogger("goqueue.arbiter")  # boot steps retried are the arbiter's


def backoff(attempt: int, base: float, cap: float, rng: random.Random) -> float:
    """Seconds before retry number `attempt` (from 1): base * 2^(attempt-1), capped at
    `cap`, then jittered ±25 % so that many waiters do not retry in step."""
    doublings = min(max(0, attempt - 1), 1000)  # far past any cap; 2.0**1024 would raise
    delay = min(cap, base * 2.0**doublings)
    return delay * rng.uniform(0.75, 1.25)


class Backoff:
    """The delays of one retry loop: `next()` after each failure, `reset()` after a success."""

    def __init__(self, base: float, cap: float, rng: random.Random | None = None) -> None:
        self.base = base
        self.cap = cap
        self.rng = rng or random.Random()
        self.failures = 0

    def next(self) -> float:
        """Count a failure; seconds to wait before trying again."""
        self.failures += 1
        return backoff(self.failures, self.base, self.cap, self.rng)

    def reset(self) -> None:
        """A success: the next failure waits `base` again."""
        self.failures = 0


async def retrying(
    what: str, attempt: Callable[[], Awaitable[None]], errors: type[Exception], delays: Backoff
) -> None:
    """Run `attempt` until it succeeds, waiting `delays` after each of `errors` (one log
    line per retry, naming `what`); other errors go to the caller."""
    while True:
        try:
            await attempt()
            return
        except errors as exc:
            delay = delays.next()
            log.warning(f"{what} failed; retrying in {delay:.2g}s: {exc}")
            await asyncio.sleep(delay)
