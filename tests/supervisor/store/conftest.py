"""The `open_store` factory: each contract test runs against both stores."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from goqueue.supervisor.store.base import Store
from goqueue.supervisor.store.memory import MemoryStore

from tests.conftest import postgres_dsn

OpenStore = Callable[..., contextlib.AbstractAsyncContextManager[Store]]


@pytest.fixture(params=["memory", "postgres"])
def open_store(request: pytest.FixtureRequest) -> OpenStore:
    """A factory of opened stores of one kind; several calls share one backing store
    (as several nodes share one database)."""
    kind = request.param
    dsn = postgres_dsn() if kind == "postgres" else ""
    schema = f"gq_test_{uuid.uuid4().hex[:12]}"
    shared: dict[str, MemoryStore] = {}

    @contextlib.asynccontextmanager
    async def open_one(node_id: str = "node-a", **options: Any) -> AsyncIterator[Store]:
        if kind == "memory":
            store = shared.setdefault("store", MemoryStore(node_id, **options))
            yield store
            return
        from goqueue.supervisor.store.postgres import PostgresStore

        store = PostgresStore(dsn, node_id, schema=schema, **options)
        await store.open()
        try:
            yield store
        finally:
            await store.close()

    yield open_one
    if kind == "postgres":
        import psycopg

        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
