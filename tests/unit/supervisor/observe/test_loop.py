"""The loop watch: lag samples on a real event loop, busy time by kind of work."""

from __future__ import annotations

import asyncio
import time

import pytest
from goqueue.supervisor.observe.loop import PERIOD, Work
from goqueue.supervisor.observe.metrics import Metrics

pytestmark = pytest.mark.timeout(10)


async def test_a_blocked_loop_shows_as_lag_and_busy_time_adds_up_by_work() -> None:
    metrics = Metrics()
    watch = metrics.loop
    watch.start(asyncio.get_running_loop())
    try:
        await asyncio.sleep(PERIOD * 1.5)
        time.sleep(0.3)  # the loop is held: the next sample runs about 0.25 s late
        await asyncio.sleep(PERIOD * 1.5)
    finally:
        watch.stop()
    lag = metrics.loop_lag
    counts = lag.buckets[()]
    late = sum(counts[lag.bounds.index(0.1) + 1 :])  # samples later than 0.1 s
    assert sum(counts) >= 2 and late == 1, counts
    spent = watch.spent(Work.WORKERS)
    spent(0.25)
    spent(0.5)
    assert metrics.loop_busy.counts[(Work.WORKERS,)] == 0.75
    assert metrics.loop_busy.counts[(Work.HTTP,)] == 0  # declared: exported at zero
