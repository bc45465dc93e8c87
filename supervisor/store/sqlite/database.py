"""The SQLite file: opened once, locked to this node, written from the loop, flushed and
checkpointed on a thread of its own.

The writes of one turn of the loop share one transaction (`run`: each call in a
savepoint of it, so a call that fails undoes only itself), committed at the end of the
turn with `synchronous=NORMAL`: appended to the WAL in the page cache, with no fsync
(tens of microseconds), which is why it runs on the loop itself. What must be on disk
(`committed(durable=True)`) waits for an fsync of the WAL after the commit, which every
commit before it shares: made at once on the loop while fsyncs are quick (an SSD's take
about 100 microseconds, less than a hand-off to a thread and back), on the flusher
thread while they are slow, the loop going on with the next transactions meanwhile.
That is sound because a checkpoint fsyncs the WAL before copying it into the file: a
commit is on disk once the WAL is fsynced after it, or once checkpointed.

The WAL stays small: once it passes `WAL_CHECKPOINT_BYTES`, new transactions wait while
the flusher checkpoints it whole (no writer, so nothing is left behind); the next
transaction then writes the WAL from its start, and `journal_size_limit` truncates the
file. Reads never hold a transaction open between turns.

WAL mode lets readers (a `sqlite3 .backup` of the running node's file) read while the
node writes.

One node per file: the node holds an exclusive `flock` on the file for as long as it runs,
so a second node on the same file refuses to start, in one line naming the file. The lock
is not SQLite's own (POSIX locks, which `.backup` needs to share), and it holds on one
machine only: network filesystems are not supported.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import mmap
import os
import sqlite3
import struct
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from goqueue.supervisor.common.errors import BootError, OutcomeUnknown, StoreUnavailable
from goqueue.supervisor.store.sqlite.batch import Batch
from goqueue.supervisor.store.sqlite.rows import ADD_COUNTS, Group
from goqueue.supervisor.store.sqlite.schema import connect

T = TypeVar("T")
log = logging.getLogger("goqueue.store.sqlite")


WAL_CHECKPOINT_BYTES = 8 << 20  # a checkpoint once the WAL passes this
WAL_FLOOR_BYTES = 1 << 20  # ... or a quarter of the disk's free room, not below this
ROOM_EVERY = 64  # commits between looks at the disk's free room
RETRY_CHECKPOINT_SECONDS = 1.0  # after a checkpoint a reader kept short of the end
PROBE_BYTES = 256 << 10  # what readiness writes to see that writes go
INLINE_FSYNC_SECONDS = 0.002  # an fsync quicker than this is made on the loop
# The wal-index header at the start of the `-shm` file (SQLite's documented WAL format):
# `mxFrame`, the last valid frame, is the native 32-bit word at byte 16.
_MX_FRAME = struct.Struct("=I")
_MX_FRAME_AT = 16
_FRAME_HEADER = 24


class Database:
    """The file's connection, and the flusher thread for fsyncs and checkpoints."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.transactions = 0  # write transactions committed (each a WAL append)
        self.syncs = 0  # fsyncs of the WAL
        self.checkpoints = 0  # whole checkpoints (the WAL then starts over)
        self.checkpoints_tried = 0
        self.applied: list[int] = []  # migrations the last open applied
        self.failing = False  # the last commit failed (a full disk): readiness says so
        self.undone = 0  # calls and transactions rolled back (caches of rows read again)
        self._flusher = ThreadPoolExecutor(1, thread_name_prefix="goqueue-sqlite-flush")
        self._conn: sqlite3.Connection | None = None
        self._checkpointer: sqlite3.Connection | None = None  # the flusher's own
        self._lock_fd: int | None = None
        self._wal_fd: int | None = None
        self._batch: Batch | None = None  # this turn's open transaction
        self._gate: asyncio.Future[None] | None = None  # a checkpoint: writes wait
        self._unsynced: list[asyncio.Future[None]] = []  # committed, awaiting an fsync
        self._fsync: asyncio.Future[None] | None = None  # the fsync in flight
        self._commits_since_room = 0
        self._wal_limit = WAL_CHECKPOINT_BYTES  # `_room_for_wal`, as last looked at
        self._checkpoint_after = 0.0  # a checkpoint left short: none again before this
        self._fsync_seconds = 0.0  # how long an fsync of the WAL takes, of late
        self._shm: mmap.mmap | None = None  # SQLite's index of the WAL, read-only
        self._page_size = 4096
        self._reclaim = False  # a commit failed: checkpoint at the next that does not

    # -- lifecycle (on the thread) ---------------------------------------------------

    def lock(self) -> None:
        """Take the file's lock, or raise BootError naming the file and why (a second node
        on it, a missing folder): quick, so a node refuses before it listens."""
        if self._lock_fd is not None:
            return
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

    async def open(self) -> None:
        """Lock (unless `lock` did), open and migrate the file (on the flusher thread: a
        migration may rewrite it). Nothing reads the whole file, so an open takes the same
        time however much it holds. Raises BootError naming the file."""
        self.lock()
        await asyncio.get_running_loop().run_in_executor(self._flusher, self._open)

    @property
    def opened(self) -> bool:
        """True once the file is open (not only locked)."""
        return self._conn is not None

    def _open(self) -> None:
        path = self.path
        try:
            self._conn, self.applied = connect(path)
            (self._page_size,) = self._conn.execute("PRAGMA page_size").fetchone()
        except BaseException:
            self._close()
            raise

    async def close(self) -> None:
        """Commit what this turn holds, close the connections, release the lock and stop
        the thread."""
        if self._gate is not None:
            await asyncio.gather(self._gate, return_exceptions=True)
        if self._batch is not None:  # calls still wait for it: it is theirs to keep
            self._commit(self._batch)
        while self._fsync is not None:
            await asyncio.gather(self._fsync, return_exceptions=True)
        await asyncio.get_running_loop().run_in_executor(self._flusher, self._close)
        self._flusher.shutdown(wait=True)

    def _close(self) -> None:
        if self._shm is not None:
            self._shm.close()
            self._shm = None
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
        """Run `work` (indexed reads, in the page cache: no wait for the disk). Raises
        StoreUnavailable on a SQLite error."""
        return self.now(work)

    def now(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """Run `work` at once (a read; inside this turn's transaction if one is open).
        Raises StoreUnavailable on a SQLite error."""
        if self._conn is None:
            raise StoreUnavailable(f"SQLite file {self.path}: the store is closed")
        try:
            return work(self._conn)
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"SQLite file {self.path}: {exc}") from exc

    async def write(self, work: Callable[[sqlite3.Connection], T], durable: bool = False) -> T:
        """Run `work` in this turn's transaction and return once it is committed (with
        `durable`, once it is on disk). Raises StoreUnavailable when it or its commit
        failed: then nothing of it was written."""
        await self.writable()
        out, batch = self.run(work)
        await self.committed(batch, durable)
        return out

    async def writable(self) -> None:
        """Wait while a checkpoint empties the WAL (no transaction may begin then)."""
        while self._gate is not None:
            await asyncio.shield(self._gate)

    def run(self, work: Callable[[sqlite3.Connection], T]) -> tuple[T, Batch]:
        """Run `work` now, in a savepoint of this turn's transaction (begun here if none
        is open, committed once the turn's calls have run). Raises StoreUnavailable on a
        SQLite error: `work` is undone (and so is the turn's whole transaction if SQLite
        rolled it back, failing its batch)."""
        conn = self._conn
        if conn is None:
            raise StoreUnavailable(f"SQLite file {self.path}: the store is closed")
        batch = self._batch
        try:
            if batch is None:
                conn.execute("BEGIN IMMEDIATE")
                batch = self._batch = Batch(asyncio.get_running_loop())
                asyncio.get_running_loop().call_soon(self._commit, batch)
            conn.execute("SAVEPOINT call")
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"SQLite file {self.path}: {exc}") from exc
        mark = len(batch.undo)
        try:
            out = work(conn)
            conn.execute("RELEASE call")
        except BaseException as exc:
            self._undo(conn, batch, mark)
            if isinstance(exc, sqlite3.Error):
                raise StoreUnavailable(f"SQLite file {self.path}: {exc}") from exc
            raise
        return out, batch

    def open_moves(self) -> Mapping[Group, int]:
        """The jobs this turn's calls moved so far, by group: in the rows already (a
        read sees them) but in `job_counts` only once the turn commits."""
        batch = self._batch
        return batch.counts if batch is not None else {}

    def on_undo(self, undo: Callable[[], None]) -> None:
        """Call `undo` if the running call's savepoint, or the turn's transaction, is
        rolled back: how a call's change in memory (not in the file) follows the file."""
        assert self._batch is not None, "on_undo outside a call"
        self._batch.undo.append(undo)

    def _undo(self, conn: sqlite3.Connection, batch: Batch, mark: int) -> None:
        """Roll back a call's savepoint (and what it changed in memory, from the `mark`th
        undo on); if SQLite ended the transaction (a full disk may), the turn's batch has
        failed."""
        self.undone += 1
        try:
            if conn.in_transaction:
                conn.execute("ROLLBACK TO call")
                conn.execute("RELEASE call")
                batch.undo_since(mark)
                return
        except sqlite3.Error:
            pass
        self._fail(batch, StoreUnavailable(f"SQLite file {self.path}: the transaction was lost"))

    def _fail(self, batch: Batch, exc: StoreUnavailable) -> None:
        self.undone += 1
        conn = self._conn
        if conn is not None and conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
        if self._batch is batch:
            self._batch = None
        batch.fail(exc)
        self.failing = True
        self._reclaim = True
        self._commits_since_room = ROOM_EVERY  # look at the disk's room at once

    def _commit(self, batch: Batch) -> None:
        """End of the turn: commit its transaction (on the loop: no fsync)."""
        if self._batch is not batch or self._conn is None:
            return
        self._batch = None
        try:
            if batch.counts:
                moved = [(*group, n) for group, n in batch.counts.items() if n]
                self._conn.executemany(ADD_COUNTS, moved)
            self._conn.execute("COMMIT")
        except sqlite3.Error as exc:
            log.warning("SQLite commit failed", extra={"path": self.path, "err": str(exc)})
            self._fail(batch, StoreUnavailable(f"SQLite file {self.path}: {exc}"))
            return
        self.transactions += 1
        self.failing = False
        batch.commit_done()
        if batch.on_sync:
            self._sync_for(batch.on_sync)
            batch.on_sync = []
        self._mind_the_wal()

    async def committed(self, batch: Batch, durable: bool) -> None:
        """Wait for `batch`'s commit, and with `durable` for an fsync after it (started
        as the commit ends). Raises StoreUnavailable when the commit failed (nothing was
        stored), OutcomeUnknown when only the fsync did."""
        if not durable:
            await batch.commit_waiter()
            return
        if not batch.committed:
            await batch.sync_waiter()
            return
        synced = batch.loop.create_future()  # committed before this call asked
        self._sync_for([synced])
        await synced

    def _sync_for(self, waiting: list[asyncio.Future[None]]) -> None:
        """Resolve `waiting` after an fsync of the WAL that starts from now: at once if
        none is under way, else the next one, which every commit made meanwhile shares."""
        self._unsynced += waiting
        if self._fsync is None:
            self._start_fsync()

    def _start_fsync(self) -> None:
        """Fsync the WAL for the durable commits so far. On a disk whose fsyncs are quick
        (below `INLINE_FSYNC_SECONDS`, as an SSD's) it is made at once, on the loop: a
        hand-off to the flusher thread and back costs more than the fsync itself. On a
        slow one it goes to the thread, and the commits made meanwhile share the next."""
        waiting, self._unsynced = self._unsynced, []
        if self._fsync_seconds < INLINE_FSYNC_SECONDS:
            try:
                self._fsync_wal()
            except OSError as exc:
                self._fsynced(waiting, exc)
            else:
                self._fsynced(waiting, None)
            return
        loop = asyncio.get_running_loop()
        self._fsync = done = loop.run_in_executor(self._flusher, self._fsync_wal)
        done.add_done_callback(lambda finished: self._fsynced(waiting, _error(finished)))

    def _fsynced(self, waiting: list[asyncio.Future[None]], exc: BaseException | None) -> None:
        self._fsync = None
        for synced in waiting:
            if synced.done():
                continue
            if exc is None:
                synced.set_result(None)
            else:  # committed, and seen by every read since: not "nothing was stored"
                message = getattr(exc, "strerror", None) or str(exc)
                failure = OutcomeUnknown(
                    f"SQLite file {self.path}: committed, but its fsync failed ({message}):"
                    " it may not survive a crash"
                )
                synced.set_exception(failure)
        if self._unsynced and self._fsync is None:
            self._start_fsync()

    def _fsync_wal(self) -> None:
        """On the loop or the flusher thread. The WAL exists once this connection wrote (and stays
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
        started = time.perf_counter()
        # as SQLite's own full sync: the data and the size, not the times (the WAL is
        # rewritten in place, so its size rarely moves); a third quicker here than fsync
        os.fdatasync(self._wal_fd)
        took = time.perf_counter() - started
        self._fsync_seconds += (took - self._fsync_seconds) / 8  # a moving average
        self.syncs += 1

    def wal_bytes(self) -> int:
        """How much of the WAL is in use now: its frames since it last started over,
        from SQLite's own index of it (the `-shm` file, mapped once); the file's size
        where that cannot be read."""
        if self._shm is None:
            try:
                with open(self.path + "-shm", "rb") as shm:
                    self._shm = mmap.mmap(shm.fileno(), 0, access=mmap.ACCESS_READ)
            except (OSError, ValueError):
                return self.wal_file_bytes()
        (frames,) = _MX_FRAME.unpack_from(self._shm, _MX_FRAME_AT)
        return int(frames) * (self._page_size + _FRAME_HEADER)

    def wal_file_bytes(self) -> int:
        """The WAL file's size (0 when there is none)."""
        try:
            return os.stat(self.path + "-wal").st_size
        except FileNotFoundError:
            return 0

    def _mind_the_wal(self) -> None:
        """Close the gate and checkpoint the WAL whole when it has grown past its limit
        (looked at after every commit: reading SQLite's index of it costs a memory
        read), or at the first commit after a failed one: the WAL then starts over in
        the room it has, rather than growing into what a full disk has just freed."""
        if self._gate is not None:
            return
        self._commits_since_room += 1
        if self._commits_since_room >= ROOM_EVERY:
            self._commits_since_room = 0
            self._wal_limit = self._room_for_wal()
        if not self._reclaim and (
            self.wal_bytes() < self._wal_limit or time.monotonic() < self._checkpoint_after
        ):
            return
        self._reclaim = False
        self.checkpoints_tried += 1
        loop = asyncio.get_running_loop()
        self._gate = gate = loop.create_future()
        done = loop.run_in_executor(self._flusher, self._checkpoint_wal)
        done.add_done_callback(lambda finished: self._checkpointed(finished, gate))

    def _room_for_wal(self) -> int:
        """`WAL_CHECKPOINT_BYTES`, or a quarter of the disk's free room when that is less
        (a disk nearly full keeps its WAL small)."""
        try:
            room = os.statvfs(os.path.dirname(self.path) or ".")
        except OSError:
            return WAL_CHECKPOINT_BYTES
        return max(WAL_FLOOR_BYTES, min(WAL_CHECKPOINT_BYTES, room.f_bavail * room.f_frsize // 4))

    def _checkpoint_wal(self) -> None:
        """Copy the WAL into the file (on the flusher thread, while no write begins, so
        every frame is copied and the next write starts the WAL over)."""
        if self._checkpointer is None:
            self._checkpointer = sqlite3.connect(
                self.path, isolation_level=None, check_same_thread=False
            )
        busy, frames, copied = self._checkpointer.execute(
            "PRAGMA wal_checkpoint(PASSIVE)"
        ).fetchone()
        if busy or frames != copied:  # a reader (a backup) still needs the old frames
            raise _Partial
        self.checkpoints += 1

    def _checkpointed(self, done: asyncio.Future[None], gate: asyncio.Future[None]) -> None:
        """A checkpoint left short by a reader is not tried again for a while (the WAL
        grows until the reader is done). One that failed (the file could not grow: a
        full disk) is tried again by the next commit past the limit: that commit found
        room, and a WAL left to grow meanwhile could fill it again, and then neither a
        commit nor a checkpoint would go."""
        self._gate = None
        gate.set_result(None)
        exc = _error(done)
        if exc is None:
            self._checkpoint_after = 0.0
        elif isinstance(exc, _Partial):
            self._checkpoint_after = time.monotonic() + RETRY_CHECKPOINT_SECONDS
        else:
            log.warning("WAL checkpoint failed", extra={"err": str(exc)})

    async def probe(self) -> bool:
        """True when a write of some size commits (`PROBE_BYTES`, written and deleted in
        one transaction): a full disk refuses it while real writes would fail, where a
        write of a page could still fit in what the WAL holds already."""

        def write(conn: sqlite3.Connection) -> None:
            conn.execute("INSERT INTO probe (n) VALUES (zeroblob(?))", (PROBE_BYTES,))
            conn.execute("DELETE FROM probe")

        try:
            await self.write(write)
        except StoreUnavailable:
            return False
        return True


class _Partial(Exception):
    """A checkpoint could not copy every frame (a reader needs the old ones)."""


def _error(done: asyncio.Future[None]) -> BaseException | None:
    return None if done.cancelled() else done.exception()
