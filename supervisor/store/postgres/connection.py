"""How the PostgreSQL store reaches the database: the pool, kept lanes, per-connection
settings, the fault policy, and group commit.

Every database fault (a lost or refused connection, a timeout, a closed pool) becomes
`StoreUnavailable`, except, when the store opens, what only a change of the node's
settings can cure (`misconfigured`: a database that does not exist, credentials refused,
no permission on the schema), which becomes `StoreMisconfigured`, and a fault while a
write's commit is in flight (`committing`), which becomes `OutcomeUnknown`: the commit
may have landed, so the caller must not hear that nothing was stored. No operation waits
longer than `command_timeout` (nor over a
second for a connection while the database is known to be down, so callers answer 503
promptly). After a fault the pool tests its idle connections, so one outage does not
fail one request per stale connection afterwards. Errors the database answers about a
statement itself (a value it refuses) are left as they are: they are the caller's.

Group commit (enqueues, completes and starts): `Batcher` lets the calls that arrive while
one write is in flight go together in the next write (one transaction), each answered on
its own once that transaction committed; an idle store writes at once. `group_or_each`
writes a group, falling back to one item at a time when the database refuses the group as
a whole, and `WriteAgain` marks an item to write again in a later group (named apart from
the user-facing `goqueue.Retry`).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager, suppress
from typing import Any, Generic, TypeAlias, TypeVar

import psycopg
from goqueue.supervisor.common.errors import OutcomeUnknown, StoreMisconfigured, StoreUnavailable
from goqueue.supervisor.store.postgres import rows as pg_rows
from goqueue.supervisor.store.postgres.rows import Row
from goqueue.supervisor.store.postgres.sql import schema as pg_schema
from goqueue.supervisor.store.postgres.sql.statements import Sql, Statements
from psycopg import AsyncConnection
from psycopg.rows import TupleRow
from psycopg_pool import AsyncConnectionPool, PoolClosed

Conn: TypeAlias = AsyncConnection[TupleRow]

# What the server answers about the node's own settings: its database (3D000), its role
# or password (class 28), its rights (42501: connect to the database, create or use the
# schema). A restart of the database cures none of them.
MISCONFIGURED_STATES = ("3D000", "28", "42501")
# A refused connection carries no SQLSTATE (libpq gives only the server's text): those
# same faults as the server words them. Anything else (refused, starting up, shutting
# down, too many connections, a timeout) is an outage, and retried.
MISCONFIGURED_TEXTS = (
    "does not exist",  # database "x" / role "x"
    "password authentication failed",
    "no pg_hba.conf entry",
    "permission denied",
)


def misconfigured(exc: psycopg.Error) -> str | None:
    """The server's one line on what is wrong with the node's settings, if `exc` says
    the settings are wrong; None for an outage (see `MISCONFIGURED_STATES`)."""
    state = exc.sqlstate
    text = str(exc)
    if state is not None:
        wrong = state.startswith(MISCONFIGURED_STATES)
    else:
        text = text.partition("FATAL:")[2] or text
        wrong = any(marker in text for marker in MISCONFIGURED_TEXTS)
    if not wrong:
        return None
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


class Connections:
    """The store's connections: a pool, plus one connection kept per lane.

    A lane is a kind of write done one at a time (a group commit): its connection is
    kept for the lane's next write instead of going back to the pool each time; after an
    error it does go back (and the pool drops it if it is broken).
    """

    def __init__(
        self,
        dsn: str,
        node_id: str,
        sql: Statements,
        *,
        command_timeout: float,
        min_pool: int,
        max_pool: int,
    ) -> None:
        self.dsn = dsn
        self.node_id = node_id
        self.command_timeout = command_timeout
        self.min_pool = min_pool
        self.max_pool = max_pool
        self._sql = sql
        self._adapters = pg_rows.adapters()
        self._pool: AsyncConnectionPool[Conn] | None = None
        self._lanes: dict[str, Conn] = {}
        self._committing: set[Conn] = set()  # borrowed connections with a commit sent
        self._down = False  # the last operation failed to reach the database
        self._check_task: asyncio.Task[None] | None = None

    def connect_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of every connection (the listener's too)."""
        return {
            "connect_timeout": max(2, round(self.command_timeout)),
            "application_name": f"goqueue/{self.node_id}"[:63],
            "context": self._adapters,
        }

    async def configure(self, conn: Conn) -> None:
        """Apply the per-connection settings (`Sql.SESSION`)."""
        ms = int(self.command_timeout * 1000)
        params = {"statement_ms": str(ms), "idle_ms": str(max(ms * 3, 30_000))}
        await conn.execute(self._sql[Sql.SESSION], params)

    async def open(self, schema: str) -> None:
        """Migrate `schema` on a connection of its own, then open the pool."""
        if self._pool is not None:
            return
        try:
            conn = await AsyncConnection.connect(self.dsn, autocommit=True, **self.connect_kwargs())
            async with conn:
                await self.configure(conn)
                await pg_schema.migrate(conn, schema)
        except psycopg.Error as exc:
            if (wrong := misconfigured(exc)) is not None:
                raise StoreMisconfigured(
                    f"PostgreSQL refused the node's settings: {wrong}"
                ) from exc
            raise StoreUnavailable(f"PostgreSQL unavailable: {exc}") from exc
        pool: AsyncConnectionPool[Conn] = AsyncConnectionPool(
            self.dsn,
            min_size=self.min_pool,
            max_size=self.max_pool,
            open=False,
            timeout=self.command_timeout,
            kwargs={"autocommit": True, **self.connect_kwargs()},
            configure=self.configure,
            # Give up on background reconnection soon: the next request that finds the
            # pool short of connections starts a fresh attempt, so recovery after a long
            # outage does not wait out an ever longer backoff.
            reconnect_timeout=max(2.0, self.command_timeout),
            name=f"goqueue-{self.node_id}",
        )
        try:
            await pool.open(wait=True, timeout=self.command_timeout)
        except psycopg.Error as exc:
            await pool.close()
            raise StoreUnavailable(f"PostgreSQL unavailable: {exc}") from exc
        self._pool = pool

    async def close(self) -> None:
        """Hand the lanes' connections back, stop the health check, close the pool."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        for conn in self._lanes.values():
            await pool.putconn(conn)
        self._lanes.clear()
        if self._check_task is not None:
            self._check_task.cancel()
            await asyncio.gather(self._check_task, return_exceptions=True)
        await pool.close()

    @asynccontextmanager
    async def connection(self, lane: str | None = None) -> AsyncIterator[Conn]:
        """A pooled connection (the lane's, with a `lane`) under the fault policy."""
        pool = self._pool
        if pool is None:
            raise StoreUnavailable("the PostgreSQL store is not open")
        wait = min(1.0, self.command_timeout) if self._down else self.command_timeout
        conn: Conn | None = None
        try:
            async with (
                asyncio.timeout(self.command_timeout),
                pool.connection(timeout=wait) if lane is None else self._kept(lane, wait) as conn,
            ):
                yield conn
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            self._fault()
            if self._in_flight(conn, exc):
                raise OutcomeUnknown(f"PostgreSQL connection lost during a commit: {exc}") from exc
            raise StoreUnavailable(f"PostgreSQL unavailable: {exc}") from exc
        except TimeoutError as exc:
            self._fault()
            if self._in_flight(conn, None):
                raise OutcomeUnknown(
                    f"PostgreSQL did not answer a commit within {self.command_timeout:g}s"
                ) from exc
            raise StoreUnavailable(
                f"PostgreSQL did not answer within {self.command_timeout:g}s"
            ) from exc
        except PoolClosed as exc:
            raise StoreUnavailable("the PostgreSQL store is closed") from exc
        finally:
            if conn is not None:
                self._committing.discard(conn)
        self._down = False

    def committing(self, conn: Conn) -> None:
        """Mark `conn` as sending a commit: its transaction's COMMIT, or a statement that
        commits on its own (autocommit). A fault from here until `conn` goes back raises
        OutcomeUnknown: the commit may have landed. Called last in a transaction, so a
        fault before the COMMIT (the server rolls back) stays StoreUnavailable."""
        self._committing.add(conn)

    @asynccontextmanager
    async def transaction(self, conn: Conn) -> AsyncIterator[None]:
        """`conn.transaction()` for a write: its COMMIT is marked `committing` (in a
        pipeline its answer comes only when the pipeline syncs, after this block)."""
        async with conn.transaction():
            yield
            self.committing(conn)

    def _in_flight(self, conn: Conn | None, exc: psycopg.Error | None) -> bool:
        """Whether a fault on `conn` leaves its commit's outcome unknown: one was sent and
        no answer came back. An error the server sent instead (with a SQLSTATE: the
        statement cancelled, the server shutting down) is its answer: no commit."""
        sent = conn is not None and conn in self._committing
        return sent and (exc is None or exc.sqlstate is None)

    @asynccontextmanager
    async def _kept(self, lane: str, wait: float) -> AsyncIterator[Conn]:
        """The lane's connection (see the class)."""
        pool = self._pool
        assert pool is not None
        conn = self._lanes.pop(lane, None) or await pool.getconn(timeout=wait)
        try:
            yield conn
        except BaseException:
            await pool.putconn(conn)
            raise
        idle = conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        if idle and self._pool is pool and lane not in self._lanes:
            self._lanes[lane] = conn
        else:
            await pool.putconn(conn)

    def _fault(self) -> None:
        """After a fault, have the pool test its idle connections (the lanes' kept ones
        too) and replace dead ones."""
        self._down = True
        if self._pool is None or (self._check_task is not None and not self._check_task.done()):
            return
        self._check_task = asyncio.create_task(self._check(self._pool))

    async def _check(self, pool: AsyncConnectionPool[Conn]) -> None:
        """Hand the lanes' connections back, then have the pool check the idle ones."""
        kept = list(self._lanes.values())
        self._lanes.clear()
        for conn in kept:
            await pool.putconn(conn)
        await pool.check()

    async def execute(self, query: str, params: Mapping[str, object]) -> list[Row]:
        """Run one statement on a pooled connection; return its rows (if any)."""
        async with self.connection() as conn:
            return await self._rows(conn, query, params)

    async def write(
        self, query: str, params: Mapping[str, object], *, prepare: bool | None = None
    ) -> list[Row]:
        """`execute` for a write that commits on its own (autocommit), so a fault once it
        is sent raises OutcomeUnknown (see `committing`); `prepare` as for `page`."""
        async with self.connection() as conn:
            self.committing(conn)
            return await self._rows(conn, query, params, prepare=prepare)

    @staticmethod
    async def _rows(
        conn: Conn, query: str, params: Mapping[str, object], *, prepare: bool | None = None
    ) -> list[Row]:
        """Run one statement on `conn`; its rows (if any)."""
        cur = await conn.execute(query, params, prepare=prepare)
        result = cur.pgresult  # not `description`: it builds a Column per column
        return await cur.fetchall() if result is not None and result.nfields else []

    async def page(
        self,
        page_sql: str,
        count_sql: str,
        params: Mapping[str, object],
        count_params: Mapping[str, object] | None = None,
        *,
        prepare: bool | None = None,
    ) -> tuple[list[Row], int]:
        """A page of rows and how many match in all (`count_sql`, with `count_params`
        if given, else `params`): both statements in one pipeline, one round trip. The
        page is prepared as psycopg's `prepare` says (False: planned for its parameters
        every time, see `rows.dead_prepare`)."""
        async with self.connection() as conn:
            async with conn.pipeline():
                page = await conn.execute(page_sql, params, prepare=prepare)
                total = await conn.execute(
                    count_sql, params if count_params is None else count_params
                )
            rows = await page.fetchall()
            count = await total.fetchone()
        return rows, int(count[0]) if count is not None else 0

    @staticmethod
    async def fetchone(conn: Conn, query: str, params: Mapping[str, object]) -> Row | None:
        """Run one statement on `conn`; its first row, if any."""
        cur = await conn.execute(query, params)
        return await cur.fetchone()


# -- group commit ---------------------------------------------------------------------

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
