"""Group commit: the writes of one turn of the loop go together in one transaction, and
the durable ones that commit while an fsync is in flight share the next fsync, so a busy
node pays one transaction and one fsync for many calls.

A call changes the store's memory, then awaits `commit`: the marks of everything changed
so far go into the next transaction, and the call returns once it is committed (in the
WAL) and, when any call of it asked (`durable`: an enqueue, whose `201` means the job is
on disk), once an fsync after it is done. The fsync runs beside the writer: claims and
outcomes (only written to the WAL, see `store.py` for why they may be) never wait behind
an enqueue's flush.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from goqueue.supervisor.errors import StoreUnavailable
from goqueue.supervisor.store.sqlite.changes import Changes, Rows
from goqueue.supervisor.store.sqlite.database import Database

log = logging.getLogger("goqueue.store.sqlite")


class GroupCommit:
    """Commits the store's marks: one transaction for the calls of a loop turn, one fsync
    for the durable transactions committed while the last one ran."""

    def __init__(
        self,
        db: Database,
        take: Callable[[], Changes],
        encode: Callable[[Changes], Rows],
        give_back: Callable[[Changes], None],
    ) -> None:
        self._db = db
        self._take = take
        self._encode = encode
        self._give_back = give_back
        self._next: asyncio.Future[None] | None = None
        self._durable = False
        self._task: asyncio.Task[None] | None = None
        self._unsynced: list[asyncio.Future[None]] = []  # committed, awaiting an fsync
        self._sync_task: asyncio.Task[None] | None = None

    async def commit(self, durable: bool) -> None:
        """Return once everything changed so far is committed; with `durable`, on disk.
        Raises StoreUnavailable when the transaction failed (nothing of it was written;
        its changes go into the next one)."""
        if self._next is None:
            self._next = asyncio.get_running_loop().create_future()
            self._next.add_done_callback(_retrieved)
        self._durable = self._durable or durable
        waiting = self._next
        if self._task is None:
            self._task = asyncio.create_task(self._drain(), name="goqueue-sqlite-commit")
        await asyncio.shield(waiting)

    async def _drain(self) -> None:
        try:
            while self._next is not None:
                done, durable = self._next, self._durable
                self._next, self._durable = None, False
                await self._write(done, durable)
        finally:
            self._task = None

    async def _write(self, done: asyncio.Future[None], durable: bool) -> None:
        changes = self._take()
        durable = durable or changes.durable  # a failed durable commit's, given back
        try:
            if not changes.empty:
                await self._db.write(self._encode(changes).write)
        except StoreUnavailable as exc:
            changes.durable = changes.durable or durable
            self._give_back(changes)
            done.set_exception(exc)
        except Exception as exc:
            log.exception("writing to the SQLite file failed")
            done.set_exception(StoreUnavailable(f"writing to the SQLite file failed: {exc}"))
        else:
            if durable:
                self._after_sync(done)
            else:
                done.set_result(None)

    def _after_sync(self, done: asyncio.Future[None]) -> None:
        self._unsynced.append(done)
        if self._sync_task is None:
            self._sync_task = asyncio.create_task(self._sync(), name="goqueue-sqlite-fsync")

    async def _sync(self) -> None:
        """Fsync for every durable commit so far; those committed meanwhile share the next."""
        try:
            while self._unsynced:
                waiting, self._unsynced = self._unsynced, []
                try:
                    await self._db.sync()
                except StoreUnavailable as exc:
                    for done in waiting:
                        done.set_exception(exc)
                else:
                    for done in waiting:
                        done.set_result(None)
        finally:
            self._sync_task = None


def _retrieved(future: asyncio.Future[None]) -> None:
    """Mark a failed commit's error seen: its callers may all have gone."""
    if not future.cancelled():
        future.exception()
