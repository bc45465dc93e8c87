"""The SQLite file: opened once, locked to this node, written on one thread of its own.

The supervisor runs one asyncio loop and every SQLite call blocks, so the connection
lives on a dedicated thread and the loop awaits its answers. WAL mode lets readers (a
`sqlite3 .backup` of the running node's file) read while the node writes.

One node per file: the node holds an exclusive `flock` on the file for as long as it runs,
so a second node on the same file refuses to start, in one line naming the file. The lock
is not SQLite's own (POSIX locks, which `.backup` needs to share), and it holds on one
machine only: network filesystems are not supported.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from goqueue.supervisor.errors import BootError, StoreUnavailable
from goqueue.supervisor.store.sqlite.schema import NewerSchema, migrate

T = TypeVar("T")


class Database:
    """The file's one connection and the thread that owns it."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.transactions = 0  # write transactions committed (each a WAL append)
        self.durable_transactions = 0  # those committed with synchronous=FULL (an fsync)
        self.applied: list[int] = []  # migrations the last open applied
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="goqueue-sqlite")
        self._conn: sqlite3.Connection | None = None
        self._lock_fd: int | None = None
        self._synchronous = ""

    # -- lifecycle (on the thread) ---------------------------------------------------

    async def open(self) -> None:
        """Lock, open, check and migrate the file. Raises BootError naming the file."""
        await asyncio.get_running_loop().run_in_executor(self._thread, self._open)

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
        """Close the connection, release the lock and stop the thread."""
        await asyncio.get_running_loop().run_in_executor(self._thread, self._close)
        self._thread.shutdown(wait=True)

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self._lock_fd is not None:  # after the connection: closing drops POSIX locks
            os.close(self._lock_fd)
            self._lock_fd = None

    # -- calls -----------------------------------------------------------------------

    async def read(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """Run `work` on the thread. Raises StoreUnavailable on a SQLite error."""
        return await self._call(work)

    async def write(self, work: Callable[[sqlite3.Connection], T], *, durable: bool) -> T:
        """Run `work` in one transaction: with `durable`, committed only once the WAL is
        on disk (synchronous=FULL); otherwise written to the WAL, not flushed (NORMAL).
        Raises StoreUnavailable on a SQLite error (the transaction rolled back)."""
        return await self._call(lambda conn: self._transaction(conn, work, durable))

    async def _call(self, work: Callable[[sqlite3.Connection], T]) -> T:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._thread, self._on_thread, work)
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"SQLite file {self.path}: {exc}") from exc

    def _on_thread(self, work: Callable[[sqlite3.Connection], T]) -> T:
        if self._conn is None:
            raise sqlite3.OperationalError("the store is closed")
        return work(self._conn)

    def _transaction(
        self, conn: sqlite3.Connection, work: Callable[[sqlite3.Connection], T], durable: bool
    ) -> T:
        synchronous = "FULL" if durable else "NORMAL"
        if synchronous != self._synchronous:
            conn.execute(f"PRAGMA synchronous = {synchronous}")
            self._synchronous = synchronous
        conn.execute("BEGIN IMMEDIATE")
        try:
            out = work(conn)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        self.transactions += 1
        self.durable_transactions += durable
        return out
