"""How the supervisor's one event loop spends its time, and how late it runs.

Everything a node does passes through one loop: answering HTTP, reading the workers'
pipes, dispatching. A turn of it handles what is ready (each connection's next request,
each worker's outcomes) and moves on, so neither kind of work can hold the other back for
long: a turn takes at most one request per connection, and at most what each worker holds
(the job it ran and its queue) from each pipe. This measures that it holds: the loop's lag
(how late a timer that should fire every `PERIOD` seconds runs) and the time spent in each
kind of work.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from enum import StrEnum
from functools import partial

PERIOD = 0.1  # seconds between two lag samples


class Work(StrEnum):
    """The kinds of work the loop's time is split into."""

    HTTP = "http"  # request handlers, from the request's arrival to its answer
    WORKERS = "workers"  # reading the workers' pipes: their outcomes, starts, requests
    DISPATCH = "dispatch"  # dispatch passes: claims, handing jobs to the workers


class LoopWatch:
    """Samples the loop's lag into `lag` (seconds late) and hands out what to call with
    the loop's busy time by kind of work (`busy(key, seconds)`); `Metrics` keeps both as
    `goqueue_loop_lag_seconds` and `goqueue_loop_busy_seconds_total{work}`."""

    def __init__(
        self, lag: Callable[[float], None], busy: Callable[[tuple[str, ...], float], None]
    ) -> None:
        self._lag = lag
        self._busy = busy
        self._timer: asyncio.TimerHandle | None = None

    def spent(self, work: Work) -> Callable[[float], None]:
        """What to call with the seconds the loop spent on `work` each time (the tally's
        own count: a call on every job's path)."""
        return partial(self._busy, (work,))

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Sample the lag from now on."""
        self._timer = loop.call_later(PERIOD, self._sample, loop, time.monotonic() + PERIOD)

    def stop(self) -> None:
        """Stop sampling."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _sample(self, loop: asyncio.AbstractEventLoop, due: float) -> None:
        now = time.monotonic()
        self._lag(max(0.0, now - due))
        self._timer = loop.call_later(PERIOD, self._sample, loop, now + PERIOD)
