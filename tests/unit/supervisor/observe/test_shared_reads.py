"""One store read shared by concurrent and closely following callers."""

from __future__ import annotations

import asyncio

import pytest
from goqueue.supervisor.observe.shared_reads import Coalesced

pytestmark = pytest.mark.timeout(10)


class Reader:
    """Counts reads; each read waits for `gate` and answers the read's number."""

    def __init__(self) -> None:
        self.reads = 0
        self.gate = asyncio.Event()
        self.fail = False

    async def __call__(self) -> int:
        self.reads += 1
        number = self.reads
        await self.gate.wait()
        if self.fail:
            raise RuntimeError("store down")
        return number


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_concurrent_callers_share_one_read_and_it_is_kept_for_ttl() -> None:
    reader, clock = Reader(), Clock()
    shared = Coalesced(reader, ttl=2.0, clock=clock)
    waiting = [asyncio.ensure_future(shared.get()) for _ in range(10)]
    await asyncio.sleep(0)
    reader.gate.set()
    assert await asyncio.gather(*waiting) == [1] * 10
    clock.now = 1.9
    assert await shared.get() == 1 and reader.reads == 1
    clock.now = 2.1
    assert await shared.get() == 2 and reader.reads == 2


async def test_a_caller_hanging_up_does_not_cancel_the_shared_read() -> None:
    reader = Reader()
    shared = Coalesced(reader, ttl=2.0)
    first = asyncio.ensure_future(shared.get())
    second = asyncio.ensure_future(shared.get())
    await asyncio.sleep(0)
    first.cancel()
    reader.gate.set()
    assert await second == 1 and reader.reads == 1


async def test_invalidate_forgets_the_value_and_a_read_in_flight() -> None:
    reader = Reader()
    shared = Coalesced(reader, ttl=60.0)
    reader.gate.set()
    assert await shared.get() == 1
    shared.invalidate()
    assert await shared.get() == 2
    reader.gate.clear()
    shared.invalidate()
    stale = asyncio.ensure_future(shared.get())  # read 3 starts
    await asyncio.sleep(0)
    shared.invalidate()  # ...and is not trusted: it may predate the change
    fresh = asyncio.ensure_future(shared.get())
    await asyncio.sleep(0)
    reader.gate.set()
    assert await stale == 3 and await fresh == 4
    assert await shared.get() == 4 and reader.reads == 4


async def test_a_failed_read_raises_to_every_waiter_and_the_next_call_reads_again() -> None:
    reader = Reader()
    shared = Coalesced(reader, ttl=60.0)
    reader.fail = True
    waiting = [asyncio.ensure_future(shared.get()) for _ in range(3)]
    await asyncio.sleep(0)
    reader.gate.set()
    results = await asyncio.gather(*waiting, return_exceptions=True)
    assert all(isinstance(r, RuntimeError) for r in results) and reader.reads == 1
    reader.fail = False
    assert await shared.get() == 2
