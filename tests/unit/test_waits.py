"""The tests' own waits (tests/conftest.py): a negative check fails at the first sign of
what must not happen, not at the end of its window; a wait ends as soon as it may."""

from __future__ import annotations

import time

import pytest

from tests.conftest import stays_true, stays_true_async, wait_for, wait_for_async

pytestmark = pytest.mark.timeout(10)


def test_stays_true_fails_as_soon_as_the_predicate_turns_false() -> None:
    turns = iter([True, True, False])
    started = time.monotonic()
    with pytest.raises(AssertionError, match=r"stopped holding after .*: it broke"):
        stays_true(lambda: next(turns), for_seconds=5, interval=0.01, what=lambda: "it broke")
    assert time.monotonic() - started < 1  # not the whole 5 s window


def test_stays_true_watches_the_whole_window_and_past_its_end() -> None:
    checked: list[float] = []
    started = time.monotonic()
    stays_true(lambda: checked.append(time.monotonic()) or True, for_seconds=0.1, interval=0.02)
    assert len(checked) >= 4 and checked[-1] - started >= 0.1


def test_wait_for_returns_the_value_and_says_what_it_waited_for() -> None:
    assert wait_for(lambda: 42, timeout=1) == 42
    with pytest.raises(AssertionError, match=r"not within 0\.05s: the answer"):
        wait_for(lambda: None, timeout=0.05, what="the answer")


async def test_the_async_waits_await_their_predicates_and_let_the_loop_run() -> None:
    seen: list[int] = []

    async def read() -> list[int]:
        seen.append(1)
        return seen if len(seen) >= 3 else []

    assert await wait_for_async(read, timeout=1) == [1, 1, 1]
    await stays_true_async(lambda: len(seen) == 3, for_seconds=0.05)
    with pytest.raises(AssertionError, match=r"stopped holding after .*: never empty"):
        await stays_true_async(lambda: seen and seen.pop(), for_seconds=5, what="never empty")
    assert seen == []
