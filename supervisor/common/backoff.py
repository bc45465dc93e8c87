"""The one backoff formula: job retries, webhook retries and every reconnect loop use it."""

from __future__ import annotations

import random


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
