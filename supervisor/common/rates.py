"""Rate limits: starts of a job type spread evenly, at most N in any sliding window.

Declared on an actor (`@actor("email", rate_limit="20/s")`) or in the config's
`[rate_limits]` table (`email = "20/s"`; the config wins). The limiter is GCRA (the
generic cell rate algorithm): a type has a theoretical arrival time (TAT), the moment
its next start is due if starts came one every `period / limit` seconds. A start is
granted when the TAT is not in the future; a type idle for a while may start up to
`limit` at once (the starts it missed, never more), and the TAT moves past them. So in
any window of one period, sliding, at most `limit + 1` starts are granted, never the
`2 * limit` a fixed window lets through at its boundary.

The dispatcher takes starts from the store before it claims (`Store.take_starts`: per
node in memory, across every node on PostgreSQL, where the TAT is a row advanced in the
function's own statement) and hands back those its claim did not use; a throttled job
stays pending, holding no worker, until its type's TAT comes.
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
    """At most `limit` starts per `period` seconds, spread evenly."""

    limit: int
    period: float

    @property
    def interval(self) -> float:
        """Seconds between starts at the steady rate."""
        return self.period / self.limit

    @property
    def guard(self) -> float:
        """How much sooner than its TAT a granted start must have begun: one that waited
        longer would crowd the next one. A fifth of the interval, at most 50 ms."""
        return min(GUARD, self.interval / 5)

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
    """Starts a store granted: how many, the type's TAT after the grant (seconds since the
    epoch; giving starts back names it, so starts others took since are never undone),
    and the seconds until the next start may be granted."""

    granted: int
    tat: float
    seconds_left: float


def grant(tat: float, rate: Rate, want: int, now: float) -> Taken:
    """GCRA: the starts due by `now` for a type whose TAT is `tat`, at most `want`."""
    if tat > now or want <= 0:
        return Taken(0, tat, max(0.0, tat - now))
    granted = int(min(want, rate.limit, 1 + (now - tat) // rate.interval))
    after = now + granted * rate.interval
    return Taken(granted, after, after - now)


class StartTimes:
    """Each rate-limited type's TAT, in one process (the memory store's; PostgreSQL
    keeps them in a table)."""

    def __init__(self) -> None:
        self._tat: dict[str, tuple[float, float]] = {}  # type -> (TAT, interval)

    def take(self, job_type: str, rate: Rate, want: int, now: float) -> Taken:
        """Grant up to `want` starts due by `now` (seconds since the epoch)."""
        tat, _ = self._tat.get(job_type, (0.0, rate.interval))
        taken = grant(tat, rate, want, now)
        if taken.granted:
            self._tat[job_type] = (taken.tat, rate.interval)
        return taken

    def give_back(self, job_type: str, tat: float, count: int) -> None:
        """Return starts granted with TAT `tat` and not used, unless more were granted
        since (their TAT moved on)."""
        current, interval = self._tat.get(job_type, (None, 0.0))
        if current == tat and count > 0:
            self._tat[job_type] = (tat - count * interval, interval)
