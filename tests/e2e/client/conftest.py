"""Fixtures for the producer's side: nodes sharing a fresh PostgreSQL schema, and a
schema migrated with a live node's row but no node process (for `goqueue.pg`)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import psycopg
import pytest
from goqueue.api.cli.main import _apply_migrations
from goqueue.supervisor.store.postgres.sql.statements import Sql, Statements
from psycopg.types.json import Jsonb

from tests.conftest import Node, postgres_dsn, stop_node


@dataclass(frozen=True)
class Database:
    """A fresh schema of the test database."""

    dsn: str
    schema: str


def _drop(dsn: str, schema: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


@pytest.fixture
def database() -> Iterator[Database]:
    """A schema name of the test database, dropped afterwards (nothing created yet)."""
    db = Database(postgres_dsn(), f"gq_client_{uuid.uuid4().hex[:10]}")
    yield db
    _drop(db.dsn, db.schema)


@pytest.fixture
def pg_node(make_node: Callable[..., Node], database: Database) -> Iterator[Callable[..., Node]]:
    """A factory of real nodes on `database` (stopped before the schema is dropped)."""
    nodes: list[Node] = []

    def make(*args: str, env: dict[str, str] | None = None) -> Node:
        db = ("--database-url", database.dsn, "--database-schema", database.schema)
        node = make_node(*db, *args, env=env)
        nodes.append(node)
        return node

    yield make
    for node in nodes:
        stop_node(node)


@pytest.fixture
def registered(database: Database) -> Database:
    """`database` migrated, with a live node row declaring the types `email` and
    `report` (as a node's store does at start; no process runs them)."""

    asyncio.run(_apply_migrations(database.dsn, database.schema))
    with psycopg.connect(database.dsn, autocommit=True) as conn:
        limits = Jsonb({"email": None, "report": 2})
        conn.execute(
            Statements(database.schema)[Sql.REGISTER],
            {"node": "n1", "limits": limits, "report": None, "key_limits": None, "live": 60},
        )
    return database
