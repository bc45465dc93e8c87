"""The `open_store` factory: each contract test runs against every store (memory, SQLite,
PostgreSQL), and a `clock` that moves the memory and SQLite stores' time by hand; for the
PostgreSQL tests, the test database's `dsn` and a factory of `nodes` on a fresh schema."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from goqueue.supervisor.common.jobs import utcnow
from goqueue.supervisor.store.base import NodeLinks, Store
from goqueue.supervisor.store.memory.store import MemoryStore
from goqueue.supervisor.store.sqlite.store import SqliteStore

from tests.conftest import postgres_dsn
from tests.e2e.store.pg_nodes import Nodes

OpenStore = Callable[..., contextlib.AbstractAsyncContextManager[Store]]


class Clock:
    """The time a contract test's store sees. The memory and SQLite stores are given
    `now`, which moves only when the test calls `advance`; PostgreSQL keeps real time, so
    there `advance` really waits."""

    def __init__(self, manual: bool) -> None:
        self.manual = manual
        self.at = utcnow()

    def now(self) -> datetime:
        """The store's current time."""
        return self.at if self.manual else utcnow()

    async def advance(self, seconds: float) -> None:
        """Let `seconds` pass."""
        if self.manual:
            self.at += timedelta(seconds=seconds)
        else:
            await asyncio.sleep(seconds)


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def store_kind(request: pytest.FixtureRequest) -> str:
    """Which store a contract test runs against."""
    return str(request.param)


@pytest.fixture
def clock(store_kind: str) -> Clock:
    """The clock of the store under test."""
    return Clock(manual=store_kind != "postgres")


@pytest.fixture
def open_store(store_kind: str, clock: Clock, tmp_path: Path) -> Iterator[OpenStore]:
    """A factory of opened stores of one kind; several calls share one backing store
    (as several nodes share one database; one SQLite file has one node, so nested calls
    share one store, as in memory, and a call after the last one closed reopens the
    file, as a restarted node does)."""
    kind = store_kind
    dsn = postgres_dsn() if kind == "postgres" else ""
    schema = f"gq_test_{uuid.uuid4().hex[:12]}"
    shared: dict[str, MemoryStore] = {}
    sqlite: dict[str, SqliteStore] = {}
    users: list[str] = []  # the calls using the SQLite store now

    @contextlib.asynccontextmanager
    async def open_one(
        node_id: str = "node-a", links: NodeLinks | None = None, **options: Any
    ) -> AsyncIterator[Store]:
        if kind == "memory":
            store = shared.setdefault("store", MemoryStore(node_id, clock=clock.now, **options))
            await store.open(links)
            yield store
            return
        if kind == "sqlite":
            if not users:
                path = str(tmp_path / "contract.db")
                opened = SqliteStore(path, node_id, clock=clock.now, **options)
                await opened.open(links)
                sqlite["store"] = opened
            users.append(node_id)
            try:
                yield sqlite["store"]
            finally:
                users.pop()
                if not users:
                    await sqlite.pop("store").close()
            return
        from goqueue.supervisor.store.postgres.store import PostgresStore

        store = PostgresStore(dsn, node_id, schema=schema, **options)
        await store.open(links)
        try:
            yield store
        finally:
            await store.close()

    yield open_one
    if kind == "postgres":
        import psycopg

        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


@pytest.fixture(scope="module")
def dsn() -> str:
    """The test database's DSN once it answered (skips loudly without one; fails in CI)."""
    return postgres_dsn()


@pytest.fixture
def nodes(dsn: str) -> Iterator[Nodes]:
    """A factory of nodes on a fresh schema, dropped after the test."""
    schema = f"gq_test_{uuid.uuid4().hex[:12]}"
    yield Nodes(dsn, schema)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
