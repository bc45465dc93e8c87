"""The store's side of rate limits, on both stores: starts taken from a type's current
window never pass its limit (however many nodes take), unused ones can be given back,
and the next window starts afresh."""

from __future__ import annotations

import asyncio

import pytest
from goqueue.supervisor.dispatch.rates import Rate

pytestmark = pytest.mark.timeout(30)


async def test_starts_per_window_never_pass_the_limit(open_store, clock) -> None:
    async with open_store() as store:
        rate = Rate(5, 3600.0)  # one window for the whole test, whatever the clock
        first = await store.take_starts("a", rate, 3)
        assert first.granted == 3 and 0 < first.seconds_left <= 3600
        assert (await store.take_starts("a", rate, 3)).granted == 2
        assert (await store.take_starts("a", rate, 3)).granted == 0
        assert (await store.take_starts("b", rate, 3)).granted == 3  # per type
        await store.return_starts("a", first.window, 2)
        assert (await store.take_starts("a", rate, 9)).granted == 2


async def test_nothing_is_granted_in_a_windows_last_moments(open_store, clock) -> None:
    async with open_store() as store:
        rate = Rate(100, 1.0)  # guard: 50 ms
        taken = await store.take_starts("a", rate, 1)
        await clock.advance(max(0.0, taken.seconds_left - 0.03))  # 30 ms before its end
        late = await store.take_starts("a", rate, 5)
        if late.window == taken.window:  # PostgreSQL's clock may have run past it
            assert late.granted == 0 and late.seconds_left < 0.05


async def test_two_nodes_share_a_window(open_store) -> None:
    async with open_store("node-a") as a, open_store("node-b") as b:
        rate = Rate(20, 3600.0)
        takes = [s.take_starts("t", rate, 3) for s in (a, b) * 8]
        granted = [taken.granted for taken in await asyncio.gather(*takes)]
        assert sum(granted) == 20, granted


async def test_a_new_window_starts_afresh(open_store, clock) -> None:
    async with open_store() as store:
        rate = Rate(2, 1.0)
        taken = await store.take_starts("a", rate, 5)
        if taken.seconds_left < 0.2:  # too near the end (PostgreSQL's real clock): next one
            await clock.advance(taken.seconds_left + 0.01)
            taken = await store.take_starts("a", rate, 5)
        assert taken.granted == 2
        await clock.advance(taken.seconds_left + 0.01)
        again = await store.take_starts("a", rate, 5)
        assert again.granted == 2 and again.window == taken.window + 1
        await store.return_starts("a", taken.window, 2)  # an old window: nothing changes
        assert (await store.take_starts("a", rate, 5)).granted == 0
