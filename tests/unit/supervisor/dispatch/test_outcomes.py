"""Outcomes' held writes on their own: retried while the store is unavailable."""

from __future__ import annotations

import asyncio

import pytest
from goqueue.supervisor.common.errors import StoreUnavailable
from goqueue.supervisor.dispatch.outcomes import Hooks, Outcomes
from goqueue.supervisor.store.memory.store import MemoryStore

from tests.conftest import wait_for_async

pytestmark = pytest.mark.timeout(10)


async def test_a_held_write_tries_again_as_soon_as_the_store_is_back() -> None:
    tries: list[float] = []
    loop = asyncio.get_running_loop()

    async def write() -> str:
        tries.append(loop.time())
        if len(tries) < 3:
            raise StoreUnavailable("database down")
        return "written"

    backoffs: list[float] = []

    async def never(seconds: float) -> None:  # a backoff that would outlast the test
        backoffs.append(seconds)
        await asyncio.Event().wait()

    ledger = Outcomes(MemoryStore(), Hooks([]), sleep=never)
    done = ledger.write(write)
    await wait_for_async(lambda: backoffs, timeout=1, what="the write asleep in its backoff")
    assert len(tries) == 1 and not done.done()  # held, asleep in its backoff
    ledger.store_back()
    await wait_for_async(lambda: len(backoffs) == 2, timeout=1, what="asleep again")
    assert len(tries) == 2 and not done.done()  # tried at once, still down: asleep again
    ledger.store_back()
    assert await asyncio.wait_for(done, 1) == "written"
