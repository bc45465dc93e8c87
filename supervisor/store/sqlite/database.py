"""The SQLite file: opened once, locked to this node, written from the loop, flushed on
a thread of its own.

Every transaction commits with `synchronous=NORMAL`: appended to the WAL in the page
cache, with no fsync and so no wait for the disk (tens of microseconds for a commit of a
loop turn's writes), which is why it runs on the loop itself. What must be on disk is made
so by `sync`, an fsync of the WAL on the flusher thread, so the loop goes on with the next
transactions (claims, outcomes) while the disk flushes, and one fsync covers every commit
before it. That is sound because the WAL only grows between checkpoints, and a checkpoint
(which may restart it) fsyncs the WAL first and the database file after: a commit is on
disk once the WAL is fsynced after it, or once checkpointed. Checkpoints (the other I/O
wait) run on the flusher thread too, on a connection of its own, without blocking writes
(`PASSIVE`); SQLite's own, in the committing connection, are off.

Why not every statement on a writer thread: measured on this project's 2-core machine,
one producer got 155 enqueues/s that way and 523/s this way (a thread hop per call costs
the GIL twice, and the loop waits for it); the fsync was the same in both.

WAL mode lets readers (a `sqlite3 .backup` of the running node's file) read while the
node writes.

One node per file: the node holds an exclusive `flock` on the file for as long as it runs,
so a second node on the same file refuses to start, in one line naming the file. The lock
is not SQLite's own (POSIX locks, which `.backup` needs to share), and it holds on one
machine only: network filesystems are not supported.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from goqueue.supervisor.errors import BootError, StoreUnavailable
from goqueue.supervisor.store.sqlite.schema import NewerSchema, migrate

T = TypeVar("T")
log = logging.getLogger("goqueue.store.sqlite")


CHECKPOINT_EVERY = 500  # transactions between checkpoints (a few MB of WAL at most)


class Database:
    """The file's connection, and the flusher thread for fsyncs and checkpoints."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.transactions = 0  # write transactions committed (each a WAL append)
        self.syncs = 0  # fsyncs of the WAL
        self.applied: list[int] = []  # migrations the last open applied
        self._flusher = ThreadPoolExecutor(1, thread_name_prefix="goqueue-sqlite-flush")
        self._conn: sqlite3.Connection | None = None
        self._checkpointer: sqlite3.Connection | None = None  # the flusher's own
        self._lock_fd: int | None = None
        self._wal_fd: int | None = None
        self._since_checkpoint = 0
        self._checkpoint: asyncio.Future[None] | None = None

    # -- lifecycle (on the thread) ---------------------------------------------------

    async def open(self) -> None:
        """Lock, open, check and migrate the file (on the flusher thread: a check reads the
        whole file). Raises BootError naming the file."""
        await asyncio.get_running_loop().run_in_executor(self._flusher, self._open)

    def _open(self) -> None:
        path = self.path
        folder = os.path.dirname(path) or "."
        if not os.path.isdir(folder):
            raise BootError(f"SQLite file {path}: the folder {folder} does not exist")
        if os.path.isdir(path):
            raise BootError(f"SQLite file {path}: is a directory")
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise BootError(f"SQLite file {path}: cannot open it: {exc.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise BootError(
                f"SQLite file {path} is in use by another GoQueue node (one node per file)"
            ) from None
        self._lock_fd = fd
        try:
            self._conn, self.applied = self._connect(path)
        except BaseException:
            self._close()
            raise

    @staticmethod
    def _connect(path: str) -> tuple[sqlite3.Connection, list[int]]:
        try:
            conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            raise BootError(f"SQLite file {path}: cannot open it: {exc}") from None
        try:
            # before the first table, or it has no effect: lets prune give pages back
            conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if mode != "wal":
                raise BootError(f"SQLite file {path}: cannot use WAL mode (got {mode})")
            (check,) = conn.execute("PRAGMA quick_check").fetchone()
            if check != "ok":
                raise BootError(f"SQLite file {path} is corrupt: {check}")
            conn.execute("PRAGMA busy_timeout = 5000")  # a checkpointing reader, briefly
            conn.execute("PRAGMA synchronous = NORMAL")  # durability comes from `sync`
            conn.execute("PRAGMA wal_autocheckpoint = 0")  # the flusher checkpoints
            applied = migrate(conn)
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise BootError(f"SQLite file {path}: {exc}") from None
        except NewerSchema as exc:
            conn.close()
            raise BootError(f"SQLite file {path}: {exc}") from None
        except BaseException:
            conn.close()
            raise
        return conn, applied

    async def close(self) -> None:
        """Close the connections, release the lock and stop the thread."""
        if self._checkpoint is not None:
            await asyncio.gather(self._checkpoint, return_exceptions=True)
        await asyncio.get_running_loop().run_in_executor(self._flusher, self._close)
        self._flusher.shutdown(wait=True)

    def _close(self) -> None:
        if self._checkpointer is not None:
            self._checkpointer.close()
            self._checkpointer = None
        if self._wal_fd is not None:
            os.close(self._wal_fd)
            self._wal_fd = None
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self._lock_fd is not None:  # after the connection: closing drops POSIX locks
            os.close(self._lock_fd)
            self._lock_fd = None

    # -- calls -----------------------------------------------------------------------

    async def read(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """Run `work` (indexed reads, in memory: no wait for the disk). Raises
        StoreUnavailable on a SQLite error."""
        return self._run(work)

    async def write(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """Run `work` in one transaction, committed to the WAL (not fsynced: see `sync`).
        Raises StoreUnavailable on a SQLite error (the transaction rolled back)."""
        out = self._run(lambda conn: self._transaction(conn, work))
        self._since_checkpoint += 1
        if self._since_checkpoint >= CHECKPOINT_EVERY and self._checkpoint is None:
            self._since_checkpoint = 0
            loop = asyncio.get_running_loop()
            self._checkpoint = loop.run_in_executor(self._flusher, self._checkpoint_wal)
            self._checkpoint.add_done_callback(self._checkpointed)
        return out

    async def sync(self) -> None:
        """Put every transaction committed so far on disk (an fsync of the WAL), on a
        thread of its own so that writes go on meanwhile. Raises StoreUnavailable."""
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._flusher, self._fsync)
        except OSError as exc:
            raise StoreUnavailable(f"SQLite file {self.path}: fsync: {exc.strerror}") from exc

    def _fsync(self) -> None:
        """On the flusher thread. The WAL exists once this connection wrote (and stays
        while it is open); before that every commit is in the file already (the last
        node's close checkpointed it). Its folder is synced once, for the WAL's name."""
        if self._wal_fd is None:
            try:
                self._wal_fd = os.open(self.path + "-wal", os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                return
            folder = os.open(os.path.dirname(self.path) or ".", os.O_RDONLY | os.O_CLOEXEC)
            try:
                os.fsync(folder)
            finally:
                os.close(folder)
        os.fsync(self._wal_fd)
        self.syncs += 1

    def _checkpoint_wal(self) -> None:
        """Copy the WAL into the file without blocking writers (on the flusher thread)."""
        if self._checkpointer is None:
            self._checkpointer = sqlite3.connect(
                self.path, isolation_level=None, check_same_thread=False
            )
        self._checkpointer.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()

    def _checkpointed(self, done: asyncio.Future[None]) -> None:
        self._checkpoint = None
        if not done.cancelled() and done.exception() is not None:
            log.warning("WAL checkpoint failed", extra={"err": str(done.exception())})

    def _run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        if self._conn is None:
            raise StoreUnavailable(f"SQLite file {self.path}: the store is closed")
        try:
            return work(self._conn)
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"SQLite file {self.path}: {exc}") from exc

    def _transaction(self, conn: sqlite3.Connection, work: Callable[[sqlite3.Connection], T]) -> T:
        conn.execute("BEGIN IMMEDIATE")
        try:
            out = work(conn)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        self.transactions += 1
        return out
