"""The store's side of rate limits, on every store: starts are paced (GCRA), so in any
sliding window of one period at most the limit plus one are granted, however many nodes
take; unused ones can be given back, unless others were taken since."""

from __future__ import annotations

import asyncio

import pytest
from goqueue.supervisor.common.rates import Rate

pytestmark = pytest.mark.timeout(30)


def busiest(times: list[float], period: float) -> int:
    """The most of `times` in any window of `period` seconds, sliding."""
    times, most, first = sorted(times), 0, 0
    for last, at in enumerate(times):
        while at - times[first] > period:
            first += 1
        most = max(most, last - first + 1)
    return most


async def test_an_idle_type_may_start_up_to_its_limit_then_is_paced(open_store, clock) -> None:
    async with open_store() as store:
        rate = Rate(10, 1.0)  # one start every 0.1 s
        first = await store.take_starts("a", rate, 30)
        assert first.granted == 10 and first.seconds_left == pytest.approx(1.0, abs=0.05)
        again = await store.take_starts("a", rate, 3)
        assert again.granted == 0 and 0 < again.seconds_left <= 1.0
        assert (await store.take_starts("b", rate, 3)).granted == 3  # per type


async def test_unused_starts_go_back_unless_others_were_taken_since(open_store, clock) -> None:
    async with open_store() as store:
        rate = Rate(10, 3600.0)  # one start every 360 s: nothing comes due during the test
        taken = await store.take_starts("a", rate, 4)
        assert taken.granted == 4
        await store.return_starts("a", taken.tat, 3)  # as if one start had been taken
        after = await store.take_starts("a", rate, 1)
        assert after.granted == 0 and after.seconds_left == pytest.approx(360, abs=5)
        await store.return_starts("a", taken.tat, 1)  # that TAT is gone: nothing changes
        assert (await store.take_starts("a", rate, 1)).seconds_left == pytest.approx(360, abs=5)


async def test_starts_in_any_sliding_period_never_pass_the_limit_plus_one(
    open_store, clock
) -> None:
    async with open_store() as store:
        rate = Rate(10, 1.0)
        times: list[float] = []
        for _ in range(120):  # 1.2 s of takes, every 10 ms, each asking for more
            taken = await store.take_starts("a", rate, 4)
            times += [clock.now().timestamp()] * taken.granted
            await clock.advance(0.01)
        assert busiest(times, rate.period) <= rate.limit + 1, times
        assert len(times) >= 10 + 1  # the idle burst, then paced starts came due


async def test_two_nodes_take_turns_on_one_pace(open_store) -> None:
    async with open_store("node-a") as a, open_store("node-b") as b:
        rate = Rate(20, 3600.0)
        takes = [s.take_starts("t", rate, 3) for s in (a, b) * 8]
        granted = [taken.granted for taken in await asyncio.gather(*takes)]
        assert sorted(granted)[-2:] == [0, 3], granted  # one take got its 3, no other any
