"""The PostgreSQL schema of GoQueue: its migrations.

The rules for its name (`schema_name_problem`, the one check config and store both use)
and its NOTIFY channel are in `settings/stores.py`.

`migrate` applies the steps not yet recorded in `schema_version`, all in one transaction
under a transaction-scoped advisory lock, so several nodes starting at once are safe and
running it again is a no-op. The steps themselves are in `sql/migrations.py`.

The statements the store runs live in `sql/statements.py`. psycopg is imported only to migrate, so
that checking a configuration does not load it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from goqueue.supervisor.settings.stores import schema_name_problem
from goqueue.supervisor.store.postgres.sql.migrations import MIGRATIONS as MIGRATIONS

if TYPE_CHECKING:
    from psycopg import AsyncConnection
    from psycopg.rows import TupleRow


def check_schema_name(schema: str) -> str:
    """Return `schema` if `schema_name_problem` finds nothing; raise ValueError otherwise."""
    problem = schema_name_problem(schema)
    if problem is not None:
        raise ValueError(f"invalid schema name: {problem}")
    return schema


def lock_key(schema: str) -> str:
    """The text hashed into the advisory lock that serializes migrations of `schema`."""
    return f"goqueue.migrate.{schema}"


async def applied_versions(conn: AsyncConnection[TupleRow], schema: str) -> frozenset[int]:
    """The migrations of `schema` already applied (none when it has no version table)."""
    from psycopg import sql

    cur = await conn.execute(
        "SELECT to_regclass(%s) IS NOT NULL", (f"{check_schema_name(schema)}.schema_version",)
    )
    row = await cur.fetchone()
    if not row or not row[0]:
        return frozenset()
    query = sql.SQL("SELECT version FROM {}.schema_version").format(sql.Identifier(schema))
    cur = await conn.execute(query)
    return frozenset(int(r[0]) for r in await cur.fetchall())


async def migrate(conn: AsyncConnection[TupleRow], schema: str) -> list[int]:
    """Create `schema` and apply every pending migration; return the versions applied.

    Safe to run concurrently from several processes: the first takes the advisory lock
    and does the work, the others wait for it and then find nothing left to apply.
    """
    from psycopg import sql

    check_schema_name(schema)
    ident = sql.Identifier(schema)
    applied: list[int] = []
    async with conn.transaction():
        await conn.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (lock_key(schema),)
        )
        await conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(ident))
        await conn.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {}.schema_version ("
                " version integer PRIMARY KEY,"
                " name text NOT NULL,"
                " applied_at timestamptz NOT NULL DEFAULT now())"
            ).format(ident)
        )
        # Every step not yet recorded, not only those above the highest: steps written on
        # parallel branches may land in either order.
        done = await applied_versions(conn, schema)
        for step in MIGRATIONS:
            if step.version in done:
                continue
            await conn.execute(sql.SQL(step.sql).format(s=ident))
            await conn.execute(
                sql.SQL("INSERT INTO {}.schema_version (version, name) VALUES (%s, %s)").format(
                    ident
                ),
                (step.version, step.name),
            )
            applied.append(step.version)
    return applied
