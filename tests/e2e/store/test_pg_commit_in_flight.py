"""A PostgreSQL write whose commit was sent but never answered has an unknown outcome
(`OutcomeUnknown`), while a fault before the commit is `StoreUnavailable`: nothing was
stored. The backend serving the write is frozen (SIGSTOP) at the chosen moment, on a
private cluster of the test's own (`tests/pgcluster.py`), then thawed to show what
the database did with the write meanwhile."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import psycopg
import pytest
from goqueue.supervisor.common.errors import OutcomeUnknown, StoreUnavailable
from goqueue.supervisor.store.postgres.connection import Connections
from goqueue.supervisor.store.postgres.sql.statements import Statements

from tests.pgcluster import PgCluster

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(120)]

TIMEOUT = 1.0  # the store's command timeout: a frozen backend outlasts it


@asynccontextmanager
async def connections(cluster: PgCluster) -> AsyncIterator[Connections]:
    """Open store connections on `cluster`, with a table `t` to write to."""
    schema = f"gq_unknown_{uuid.uuid4().hex[:8]}"
    db = Connections(
        cluster.dsn,
        "n",
        Statements(schema),
        command_timeout=TIMEOUT,
        min_pool=1,
        max_pool=2,
    )
    await db.open(schema)
    await db.execute("CREATE TABLE t (v int)", {})
    try:
        yield db
    finally:
        await db.close()


async def rows(cluster: PgCluster) -> list[int]:
    """What `t` holds, read on a connection of the test's own."""
    async with await psycopg.AsyncConnection.connect(cluster.dsn, autocommit=True) as conn:
        cur = await conn.execute("SELECT v FROM t ORDER BY v")
        return [row[0] for row in await cur.fetchall()]


async def thawed_and_gone(pid: int, cluster: PgCluster) -> None:
    """Let the frozen backend run again, and wait (with a deadline) until it has ended:
    its client gave up on it, so it finishes what it read and exits."""
    os.kill(pid, signal.SIGCONT)
    async with (
        asyncio.timeout(30),
        await psycopg.AsyncConnection.connect(cluster.dsn, autocommit=True) as conn,
    ):
        while True:
            cur = await conn.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", [pid])
            if await cur.fetchone() is None:
                return
            await asyncio.sleep(0.05)


class Freezer:
    """Stops backends (SIGSTOP) and remembers them, to thaw them all at the end: a failing
    test leaves no stopped process behind."""

    def __init__(self) -> None:
        self.pids: list[int] = []

    def freeze(self, pid: int) -> None:
        os.kill(pid, signal.SIGSTOP)
        self.pids.append(pid)

    def thaw_all(self) -> None:
        for pid in self.pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


@asynccontextmanager
async def freezer() -> AsyncIterator[Freezer]:
    """A `Freezer` whose backends are thawed on leaving."""
    frozen = Freezer()
    try:
        yield frozen
    finally:
        frozen.thaw_all()


async def insert_frozen(db: Connections, frozen: Freezer, before: str) -> None:
    """Insert 1 in a transaction, its backend frozen `before` the "insert" or the
    "commit"."""
    async with db.connection() as conn, db.transaction(conn):
        pid = conn.info.backend_pid
        if before == "insert":
            frozen.freeze(pid)
        await conn.execute("INSERT INTO t VALUES (1)")
        if before == "commit":
            frozen.freeze(pid)
    raise AssertionError("the frozen write answered")


def test_a_commit_sent_and_never_answered_is_outcome_unknown_and_may_land(
    pg_cluster: PgCluster,
) -> None:
    async def body() -> None:
        async with connections(pg_cluster) as db, freezer() as frozen:
            with pytest.raises(OutcomeUnknown, match="did not answer a commit"):
                await insert_frozen(db, frozen, "commit")
            await thawed_and_gone(frozen.pids[0], pg_cluster)
            # the COMMIT was in the backend's hands: it landed after the client gave up,
            # which a 503 ("nothing was stored") would have denied
            assert await rows(pg_cluster) == [1]

    asyncio.run(body())


def test_a_fault_before_the_commit_is_store_unavailable_and_stores_nothing(
    pg_cluster: PgCluster,
) -> None:
    async def body() -> None:
        async with connections(pg_cluster) as db, freezer() as frozen:
            with pytest.raises(StoreUnavailable, match="did not answer within"):
                await insert_frozen(db, frozen, "insert")
            await thawed_and_gone(frozen.pids[0], pg_cluster)
            assert await rows(pg_cluster) == []  # no COMMIT was sent: rolled back

    asyncio.run(body())


def test_an_autocommitted_write_sent_and_never_answered_is_outcome_unknown(
    pg_cluster: PgCluster,
) -> None:
    async def body() -> None:
        async with connections(pg_cluster) as db, freezer() as frozen:
            pid = 0
            with pytest.raises(OutcomeUnknown):
                async with db.connection() as conn:
                    pid = conn.info.backend_pid
                    frozen.freeze(pid)
                    db.committing(conn)  # as `Connections.write` does
                    await conn.execute("INSERT INTO t VALUES (2)")
            await thawed_and_gone(pid, pg_cluster)
            assert await rows(pg_cluster) == [2]
            # a read on a frozen backend is an outage: 503, nothing was written
            with pytest.raises(StoreUnavailable):
                async with db.connection() as conn:
                    pid = conn.info.backend_pid
                    frozen.freeze(pid)
                    await conn.execute("SELECT 1")
            await thawed_and_gone(pid, pg_cluster)

    asyncio.run(body())


def test_a_connection_lost_while_its_commit_is_in_flight_is_outcome_unknown(
    pg_cluster: PgCluster,
) -> None:
    """The backend is killed once the COMMIT was sent: the connection ends without an
    answer (no SQLSTATE), which is not "nothing stored". (The cluster restarts after a
    backend is killed; nothing else here needs it.)"""

    async def body() -> None:
        async with connections(pg_cluster) as db, freezer() as frozen:
            with pytest.raises(OutcomeUnknown, match="connection lost during a commit"):
                async with db.connection() as conn, db.transaction(conn):
                    await conn.execute("INSERT INTO t VALUES (3)")
                    frozen.freeze(conn.info.backend_pid)
                    # runs at the commit's first wait for its answer, the COMMIT sent
                    kill = functools.partial(os.kill, conn.info.backend_pid, signal.SIGKILL)
                    asyncio.get_running_loop().call_soon(kill)

    asyncio.run(body())
