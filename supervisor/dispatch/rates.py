"""Rate limits: at most N starts of a job type per fixed window of time.

Declared on an actor (`@actor("email", rate_limit="20/s")`) or in the config's
`[rate_limits]` table (`email = "20/s"`; the config wins). Windows are fixed and aligned
on the Unix epoch (each second, minute or hour), so every node counts the same ones.
The dispatcher takes starts from the store before it claims (`Store.take_starts`: per
node in memory, across every node on PostgreSQL) and hands back those its claim did not
use; a throttled job stays pending, holding no worker, until its type's next window.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PERIODS = {"s": 1.0, "m": 60.0, "h": 3600.0}
_RATE = re.compile(r"\s*(\d+)\s*/\s*([smh])\s*")
MAX_STARTS = 1_000_000
GUARD = 0.05


@dataclass(frozen=True, slots=True)
class Rate:
    """At most `limit` starts per window of `period` seconds."""

    limit: int
    period: float

    @property
    def guard(self) -> float:
        """Seconds at the end of each window in which no start is granted: a job claimed
        then would start (on its worker, a few milliseconds later) in the next window and
        count twice there. A twentieth of the window, at most 50 ms."""
        return min(GUARD, self.period / 20)

    def __str__(self) -> str:
        unit = next(u for u, seconds in PERIODS.items() if seconds == self.period)
        return f"{self.limit}/{unit}"


def parse_rate(text: object) -> Rate:
    """`"100/s"`, `"6000/m"` or `"10/h"` as a `Rate`; ValueError saying what is wrong."""
    match = _RATE.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        raise ValueError(f'expected STARTS/s, /m or /h (as "100/s"), got {text!r}')
    limit = int(match[1])
    if not 1 <= limit <= MAX_STARTS:
        raise ValueError(f"the number of starts must be from 1 to {MAX_STARTS}, got {limit}")
    return Rate(limit, PERIODS[match[2]])


@dataclass(frozen=True, slots=True)
class Taken:
    """Starts a store granted from a type's current window: how many, which window
    (its start, in seconds since the epoch), and the seconds until it ends."""

    granted: int
    window: float
    seconds_left: float


class StartWindows:
    """The starts taken in each type's current window, in one process (the memory
    store's; PostgreSQL keeps them in a table)."""

    def __init__(self) -> None:
        self._used: dict[str, tuple[float, int]] = {}  # type -> (window start, starts)

    def take(self, job_type: str, rate: Rate, want: int, now: float) -> Taken:
        """Grant up to `want` starts from the window holding `now` (seconds since the
        epoch)."""
        window = (now // rate.period) * rate.period
        left = window + rate.period - now
        start, used = self._used.get(job_type, (window, 0))
        if start != window:
            used = 0
        granted = 0 if left < rate.guard else max(0, min(want, rate.limit - used))
        self._used[job_type] = (window, used + granted)
        return Taken(granted, window, left)

    def give_back(self, job_type: str, window: float, count: int) -> None:
        """Return starts taken from `window` and not used (nothing once it is over)."""
        start, used = self._used.get(job_type, (window, 0))
        if start == window and count > 0:
            self._used[job_type] = (window, max(0, used - count))
