"""The pool's watch timers (`Watch`): armed when attempts start, stopped when nothing is
left to watch, and armed again by the next attempt; a pool with nothing to watch for
arms nothing and is not asked again."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from goqueue.actors.protocol import SupervisorCodec
from goqueue.supervisor.workers.handle import Worker
from goqueue.supervisor.workers.watch import Watch

pytestmark = pytest.mark.timeout(10)


async def until(condition: Callable[[], bool], what: str) -> None:
    """Wait (bounded) for `condition()` to hold."""
    deadline = asyncio.get_running_loop().time() + 5
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, what
        await asyncio.sleep(0.005)


async def test_the_timers_stop_when_nothing_is_busy_and_the_next_attempt_arms_them() -> None:
    workers: dict[int, Worker] = {}
    watch = Watch(
        asyncio.get_running_loop(),
        workers,
        SupervisorCodec(),
        lease_allowance=0.04,  # an Extend every 10 ms
        memory_limit_mb=None,
    )
    assert not watch.armed
    watch.arm()
    assert watch.armed
    await until(lambda: not watch.armed, "the Extend timer stops with no busy worker")
    watch.arm()  # the pool's next attempt
    assert watch.armed
    watch.limit_memory(100)  # a reload: the memory timer is needed now
    assert not watch.armed
    watch.arm()
    assert watch.armed
    watch.stop()
    assert not watch.armed


async def test_a_pool_with_nothing_to_watch_for_is_armed_once_for_good() -> None:
    watch = Watch(
        asyncio.get_running_loop(),
        {},
        SupervisorCodec(),
        lease_allowance=None,
        memory_limit_mb=None,
    )
    watch.arm()
    await asyncio.sleep(0.05)
    assert watch.armed  # no timer ran to stop: the pool never calls `arm` again
