"""Run a coroutine at once, up to the first time it waits.

A store call on the memory store never waits, yet wrapping it in a deadline costs a timer
(and its cancellation) on every request. `step` runs the call's synchronous part in the
caller's own task: when it finishes there, no deadline was ever needed, since nothing
can hang without waiting; when it waits, the `Waiting` it returns is awaited (under the
deadline) to finish it exactly as if it had been awaited from the start. What it saves is
measured in the performance docs ("Running a store call at once").
"""

from __future__ import annotations

from collections.abc import Coroutine, Generator
from typing import Any, Generic, TypeVar

import msgspec

T = TypeVar("T")


class Done(msgspec.Struct, Generic[T]):
    """A coroutine that finished without waiting, and what it returned (a Struct: made
    without a Python-level call, on every request and every outcome)."""

    value: T


class Waiting(Generic[T]):
    """A coroutine stopped at its first wait. Awaiting this hands what it waits on to the
    awaiting task, then drives it to its end: results, exceptions and cancellation pass
    through to it as they would to the coroutine awaited directly."""

    __slots__ = ("_coro", "_pending")

    def __init__(self, coro: Coroutine[Any, Any, T], pending: Any) -> None:
        self._coro = coro
        self._pending = pending

    def __await__(self) -> Generator[Any, None, T]:
        coro, pending = self._coro, self._pending
        while True:
            try:
                yield pending
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # thrown in by the task (a cancellation)
                try:
                    pending = coro.throw(exc)
                except StopIteration as stop:
                    return stop.value  # type: ignore[no-any-return]
            else:
                try:
                    pending = coro.send(None)
                except StopIteration as stop:
                    return stop.value  # type: ignore[no-any-return]


def step(coro: Coroutine[Any, Any, T]) -> Done[T] | Waiting[T]:
    """Run `coro` until it returns (`Done`) or first waits (`Waiting`, to be awaited);
    an exception it raises before either propagates. Call it from within a task, as the
    coroutine would have been awaited."""
    try:
        pending = coro.send(None)
    except StopIteration as stop:
        return Done(stop.value)
    return Waiting(coro, pending)
