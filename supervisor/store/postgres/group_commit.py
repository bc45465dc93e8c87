"""Group commit for the PostgreSQL store's enqueues and completes.

`Batcher` lets the calls that arrive while one write is in flight go together in the
next write (one transaction), each answered on its own once that transaction committed;
an idle store writes at once. `group_or_each` writes a group, falling back to one item
at a time when the database refuses the group as a whole, and `WriteAgain` marks an item
to write again in a later group (named apart from the user-facing `goqueue.Retry`).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from contextlib import suppress
from typing import Generic, TypeVar

import psycopg
from goqueue.supervisor.common.errors import StoreUnavailable

T = TypeVar("T")
R = TypeVar("R")


async def group_or_each(
    write: Callable[[list[T]], Awaitable[Sequence[R]]], items: list[T]
) -> list[R | Exception]:
    """`write(items)` as one group. Should the database refuse the group as a whole (a
    value it rejects), each item is written again alone, so only that one fails."""
    try:
        return list(await write(items))
    except psycopg.Error:
        if len(items) == 1:
            raise
    answers: list[R | Exception] = []
    for item in items:
        try:
            answers.extend(await write([item]))
        except psycopg.Error as exc:
            answers.append(exc)
    return answers


class WriteAgain(Exception):
    """An item to write again in a later group (its statement lost a deadlock)."""


class Batcher(Generic[T, R]):
    """Group commit: calls arriving while a write is in flight wait for it to end, then
    go together in the next write (one transaction); each gets its own answer, after
    that transaction committed. A call finding no write in flight writes at once, so an
    idle store adds no delay.

    `write(items)` answers every item (a result, or an exception for that item alone) or
    raises for all of them. With `gather`, a call finding no write in flight lets the
    event loop turn twice first, so the calls made in the same few turns share its group
    (a worker's outcome and its next job's start).
    """

    def __init__(
        self,
        write: Callable[[list[T]], Awaitable[Sequence[R | Exception]]],
        *,
        limit: int,
        gather: bool = False,
    ) -> None:
        self._write = write
        self.limit = limit
        self.gather = gather
        self._waiting: deque[tuple[T, asyncio.Future[R]]] = deque()
        self._busy = False
        self._drain_task: asyncio.Task[None] | None = None

    async def submit(self, item: T) -> R:
        """Write `item` (now, or with the next group) and return its answer."""
        if self._busy or self.gather:
            future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
            self._waiting.append((item, future))
            if not self._busy:
                self._busy = True
                self._drain_task = asyncio.create_task(self._drain(2), name="goqueue-pg-group")
            return await future
        self._busy = True
        try:
            (answer,) = await self._write([item])
        finally:
            self._hand_over()
        if isinstance(answer, Exception):
            raise answer
        return answer

    def _hand_over(self) -> None:
        if self._waiting:
            self._drain_task = asyncio.create_task(self._drain(), name="goqueue-pg-group")
        else:
            self._busy = False

    async def _drain(self, turns: int = 0) -> None:
        """Write the waiting calls, a group at a time, until none is left (after letting
        the loop turn `turns` times)."""
        try:
            for _ in range(turns):
                await asyncio.sleep(0)
            while self._waiting:
                group: list[tuple[T, asyncio.Future[R]]] = []
                while self._waiting and len(group) < self.limit:
                    entry = self._waiting.popleft()
                    if not entry[1].done():  # a caller gone (timed out) is not written
                        group.append(entry)
                if group:
                    await self._answer(group)
        finally:
            self._busy = False
            for _, future in self._waiting:  # only when cancelled (closing)
                if not future.done():
                    future.set_exception(StoreUnavailable("the PostgreSQL store is closed"))
            self._waiting.clear()

    async def _answer(self, group: list[tuple[T, asyncio.Future[R]]]) -> None:
        try:
            answers: Sequence[R | Exception] = await self._write([item for item, _ in group])
        except Exception as exc:
            answers = [exc] * len(group)
        for (_, future), answer in zip(group, answers, strict=True):
            if future.done():
                continue
            if isinstance(answer, Exception):
                future.set_exception(answer)
            else:
                future.set_result(answer)

    async def idle(self, timeout: float) -> None:
        """Wait (up to `timeout`) for the groups under way to be written."""
        task = self._drain_task
        if task is not None and not task.done():
            with suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(task), timeout=timeout)

    def cancel(self) -> None:
        """Stop writing groups (the store is closing)."""
        if self._drain_task is not None:
            self._drain_task.cancel()
