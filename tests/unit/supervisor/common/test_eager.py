"""A coroutine run at once up to its first wait (`supervisor/common/eager.py`): finished there,
or awaited on to the same end as if it had been awaited from the start."""

from __future__ import annotations

import asyncio

import pytest
from goqueue.supervisor.common import eager

pytestmark = pytest.mark.timeout(10)


async def test_a_coroutine_that_never_waits_is_done_in_the_callers_step() -> None:
    async def answer() -> int:
        return 42

    started = eager.step(answer())
    assert isinstance(started, eager.Done) and started.value == 42


async def test_a_coroutine_that_raises_before_waiting_raises_from_the_step() -> None:
    async def broken() -> int:
        raise ValueError("bad")

    with pytest.raises(ValueError, match="bad"):
        eager.step(broken())


async def test_a_waiting_coroutine_finishes_with_its_result_across_several_waits() -> None:
    seen: list[str] = []
    resume = asyncio.Event()  # the test, not a timer, decides when the first wait ends

    async def slow() -> str:
        seen.append("first part")
        await resume.wait()
        seen.append("second part")
        await asyncio.sleep(0)
        return "done"

    started = eager.step(slow())
    assert isinstance(started, eager.Waiting) and seen == ["first part"]
    resume.set()
    assert await started == "done"
    assert seen == ["first part", "second part"]


async def test_a_waiting_coroutine_raises_its_own_exception_when_awaited() -> None:
    async def fails_later() -> None:
        await asyncio.sleep(0)
        raise KeyError("late")

    started = eager.step(fails_later())
    assert isinstance(started, eager.Waiting)
    with pytest.raises(KeyError, match="late"):
        await started


async def test_cancelling_the_awaiting_task_cancels_the_coroutine_at_its_wait() -> None:
    cleaned: list[str] = []
    waiting = asyncio.Event()

    async def hangs() -> None:
        try:
            waiting.set()
            await asyncio.Event().wait()  # never set: only the cancellation ends it
        finally:
            cleaned.append("finally ran")

    async def run() -> None:
        started = eager.step(hangs())
        assert isinstance(started, eager.Waiting)
        await started

    task = asyncio.ensure_future(run())
    await asyncio.wait_for(waiting.wait(), 1)  # it stands at its wait
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cleaned == ["finally ran"]


async def test_a_coroutine_may_catch_the_cancellation_and_wait_again_before_it_ends() -> None:
    waiting = asyncio.Event()

    async def stubborn() -> str:
        try:
            waiting.set()
            await asyncio.Event().wait()  # never set: only the cancellation ends it
        except asyncio.CancelledError:
            loop = asyncio.get_running_loop()
            cleanup = loop.create_future()  # cleanup that itself waits, on a future
            loop.call_soon(cleanup.set_result, None)
            await cleanup
            return "cleaned up"
        return "never"

    async def run() -> str:
        started = eager.step(stubborn())
        assert isinstance(started, eager.Waiting)
        return await started

    task = asyncio.ensure_future(run())
    await asyncio.wait_for(waiting.wait(), 1)  # it stands at its wait
    task.cancel()
    assert await task == "cleaned up"
