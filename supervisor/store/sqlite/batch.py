"""One turn's transaction of the SQLite file (`database.py`): the calls waiting for its
commit, those waiting for an fsync of the WAL after it, and what its calls changed in
memory that a failed commit must undo."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from goqueue.supervisor.common.errors import StoreUnavailable
from goqueue.supervisor.store.sqlite.rows import Group, add_count


class Batch:
    """The transaction of one turn of the loop: the calls waiting for its commit, and
    those waiting for an fsync after it. Each call waits on a future of its own, resolved
    by the commit or the fsync itself: one that is cancelled leaves the others be, and the
    caller wakes on the next turn (a future shared through `asyncio.shield` took two)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.committed = False
        self.failure: StoreUnavailable | None = None
        self.on_commit: list[asyncio.Future[None]] = []
        self.on_sync: list[asyncio.Future[None]] = []  # moved to the fsync once committed
        self.counts: dict[Group, int] = {}  # the jobs its calls moved, by group
        self.undo: list[Callable[[], None]] = []  # its calls' changes in memory, undone

    def commit_waiter(self) -> asyncio.Future[None]:
        """A future resolved once the batch is committed (at once if it was)."""
        future = self.loop.create_future()
        if self.failure is not None:
            future.set_exception(self.failure)
        elif self.committed:
            future.set_result(None)
        else:
            self.on_commit.append(future)
        return future

    def sync_waiter(self) -> asyncio.Future[None]:
        """A future resolved once the batch is committed and the WAL fsynced after it
        (the batch must not be committed yet)."""
        future = self.loop.create_future()
        if self.failure is not None:
            future.set_exception(self.failure)
        else:
            self.on_sync.append(future)
        return future

    def count(self, counts: dict[Group, int]) -> None:
        """Add a call's moves to what the commit writes to `job_counts`."""
        for group, delta in counts.items():
            add_count(self.counts, group, delta)

    def commit_done(self) -> None:
        """The transaction is committed: its calls that wait for no fsync go on."""
        self.committed = True
        self.undo = []
        for future in self.on_commit:
            if not future.done():
                future.set_result(None)
        self.on_commit = []

    def undo_since(self, mark: int) -> None:
        """Undo, latest first, what the calls since the `mark`th undo changed in memory
        (a call whose savepoint was rolled back)."""
        undone, self.undo = self.undo[mark:], self.undo[:mark]
        for undo in reversed(undone):
            undo()

    def fail(self, exc: StoreUnavailable) -> None:
        """The transaction is lost: what its calls changed in memory is undone, latest
        first, and every call of it hears why."""
        self.failure = exc
        self.undo_since(0)
        for future in (*self.on_commit, *self.on_sync):
            if not future.done():
                future.set_exception(exc)
        self.on_commit, self.on_sync = [], []
