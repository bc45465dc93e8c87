"""One turn's transaction of the SQLite file (`database.py`): the calls waiting for its
commit, and those waiting for an fsync of the WAL after it."""

from __future__ import annotations

import asyncio

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
        for future in self.on_commit:
            if not future.done():
                future.set_result(None)
        self.on_commit = []

    def fail(self, exc: StoreUnavailable) -> None:
        """The transaction is lost: every call of it hears why."""
        self.failure = exc
        for future in (*self.on_commit, *self.on_sync):
            if not future.done():
                future.set_exception(exc)
        self.on_commit, self.on_sync = [], []
