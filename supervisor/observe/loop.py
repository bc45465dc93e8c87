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

from goqueue.supervisor.observe.tallies import Tally, TallyHistogram

PERIOD = 0.1  # seconds between two lag samples
LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


class Work(StrEnum):
    """The kinds of work the loop's time is split into."""

    HTTP = "http"  # request handlers, from the request's arrival to its answer
    WORKERS = "workers"  # reading the workers' pipes: their outcomes, starts, requests
    DISPATCH = "dispatch"  # dispatch passes: claims, handing jobs to the workers


class LoopWatch:
    """The loop's lag (sampled) and its busy time by kind of work (tallied), as Prometheus
    series: `goqueue_loop_lag_seconds` and `goqueue_loop_busy_seconds_total{work}`."""

    def __init__(self) -> None:
        self.lag = TallyHistogram(
            "goqueue_loop_lag_seconds",
            "How late the supervisor's event loop ran a timer due every 0.1 s.",
            [],
            LAG_BUCKETS,
        )
        self.busy = Tally(
            "goqueue_loop_busy_seconds",
            "Seconds the supervisor's event loop spent in each kind of work (HTTP: wall time "
            "of request handlers, which may include waits on the store).",
            ["work"],
        )
        for work in Work:
            self.busy.declare((work,))
        self.lag.declare(())
        self._timer: asyncio.TimerHandle | None = None

    def spent(self, work: Work) -> Callable[[float], None]:
        """What to call with the seconds the loop spent on `work` each time (the tally's
        own count: a call on every job's path)."""
        return partial(self.busy.inc, (work,))

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
        self.lag.observe((), max(0.0, now - due))
        self._timer = loop.call_later(PERIOD, self._sample, loop, now + PERIOD)
