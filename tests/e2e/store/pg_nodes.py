"""Several PostgreSQL stores on one fresh schema, acting as nodes, for the store tests."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import psycopg
from goqueue.supervisor.common.jobs import JobSpec
from goqueue.supervisor.store.base import NewJob
from goqueue.supervisor.store.postgres.store import PostgresStore

T = TypeVar("T")

# The schema as it was before migration 21 (`{s}` for it): no workflow status kept.
FLOW_STATUS_DROPPED = (
    "DROP TRIGGER jobs_touch_insert ON {s}.jobs; DROP TRIGGER jobs_touch_delete ON {s}.jobs;"
    " DROP TRIGGER jobs_touch_update ON {s}.jobs; DROP FUNCTION {s}.touch_workflow();"
    " DROP TABLE {s}.workflow_touches, {s}.workflow_counts, {s}.workflow_count_changes;"
    " DROP INDEX {s}.workflows_status; ALTER TABLE {s}.workflows DROP COLUMN status;"
    " DELETE FROM {s}.schema_version WHERE version = 21;"
)

# The schema as it was before migration 22 (`{s}` for it): the dead letters not tallied.
TALLY_DROPPED = (
    "DROP TRIGGER dead_counted_insert ON {s}.dead_letters;"
    " DROP TRIGGER dead_counted_delete ON {s}.dead_letters;"
    " DROP FUNCTION {s}.count_dead_letters(); DROP TABLE {s}.tallies, {s}.tally_changes;"
    " DELETE FROM {s}.schema_version WHERE version = 22;"
)

# The schema as it was before migration 23 (`{s}` for it): each event in two indexes.
EVENTS_UNKEYED = (
    "CREATE INDEX events_job ON {s}.events (job_id, at, id);"
    " ALTER TABLE {s}.events DROP CONSTRAINT events_pkey;"
    " ALTER TABLE {s}.events ADD PRIMARY KEY (id);"
    " DELETE FROM {s}.schema_version WHERE version = 23;"
)


# The schema as it was before migration 24 (`{s}` for it): dead letters tallied in all
# only (the function as migration 22 made it), no queue or type of their own.
DEAD_GROUPS_DROPPED = (
    "DROP TRIGGER dead_grouped ON {s}.dead_letters; DROP FUNCTION {s}.group_dead_letter();"
    " DROP FUNCTION {s}.job_field(json, text);"
    " ALTER TABLE {s}.dead_letters DROP COLUMN queue, DROP COLUMN type;"
    " CREATE OR REPLACE FUNCTION {s}.count_dead_letters() RETURNS trigger"
    " LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$"
    " BEGIN IF TG_OP = 'INSERT' THEN INSERT INTO {s}.tally_changes"
    " SELECT 'dead', count(*) FROM new_rows HAVING count(*) > 0;"
    " ELSE INSERT INTO {s}.tally_changes"
    " SELECT 'dead', -count(*) FROM old_rows HAVING count(*) > 0; END IF;"
    " RETURN NULL; END $$;"
    " DELETE FROM {s}.tallies WHERE name LIKE 'dead %';"
    " DELETE FROM {s}.tally_changes WHERE name LIKE 'dead %';"
    " DELETE FROM {s}.schema_version WHERE version = 24;"
)


# Every dead letter written again under an id of its own (`{s}` for the schema; a WHERE
# added picks which): letters already there when an upgrade comes.
LETTERS_AGAIN = (
    "INSERT INTO {s}.dead_letters (id, job_id, job, errors, created_at)"
    " SELECT gen_random_uuid(), job_id, job, errors, now() FROM {s}.dead_letters"
)


class Waker:
    """A store's wake-up (given when the store is made) that calls nothing until a test
    says what to call: only the wake-ups from that point on count."""

    def __init__(self) -> None:
        self.target: Callable[[], None] = lambda: None

    def __call__(self) -> None:
        self.target()


class Nodes:
    """Opens stores ("nodes") on one schema inside one event loop, and closes them."""

    def __init__(self, dsn: str, schema: str) -> None:
        self.dsn = dsn
        self.schema = schema
        self.stores: list[PostgresStore] = []
        self.wakers: dict[int, Waker] = {}

    async def open(self, node_id: str, **options: Any) -> PostgresStore:
        """A started store for `node_id` on this test's schema."""
        waker = Waker()
        store = PostgresStore(self.dsn, node_id, schema=self.schema, wake=waker, **options)
        await store.open()
        self.stores.append(store)
        self.wakers[id(store)] = waker
        return store

    def waker(self, store: PostgresStore) -> Waker:
        """The wake-up `store` was made with."""
        return self.wakers[id(store)]

    def run(self, body: Callable[[Nodes], Awaitable[T]]) -> T:
        """Run an async test body; every store it opened is closed afterwards."""

        async def main() -> T:
            try:
                return await body(self)
            finally:
                for store in self.stores:
                    await store.close()

        return asyncio.run(main())

    async def sql(self, query: str, params: Any = None) -> list[tuple[Any, ...]]:
        """Run SQL on a connection of its own, with `{s}` standing for the schema."""
        conn = await psycopg.AsyncConnection.connect(self.dsn, autocommit=True)
        async with conn:
            cur = await conn.execute(query.replace("{s}", f'"{self.schema}"'), params)
            return await cur.fetchall() if cur.description else []

    async def expire_leases(self) -> None:
        """Make every running lease expired now (a node that died long ago)."""
        await self.sql(
            "UPDATE {s}.jobs SET lease_expires_at = now() - interval '1 second'"
            " WHERE status = 'running'"
        )


async def plan_of(
    conn: psycopg.AsyncConnection[Any], query: str, params: Any = None, options: str = ""
) -> dict[str, Any]:
    """The top node of `query`'s plan, by EXPLAIN (`options`, FORMAT JSON)."""
    cur = await conn.execute(
        f"EXPLAIN ({options}{', ' if options else ''}FORMAT JSON) {query}", params
    )
    (row,) = await cur.fetchall()
    plan: dict[str, Any] = (json.loads(row[0]) if isinstance(row[0], str) else row[0])[0]["Plan"]
    return plan


def relations_of(plan: dict[str, Any]) -> set[str]:
    """Every relation and index a plan reads."""
    found = {plan[k] for k in ("Relation Name", "Index Name") if k in plan}
    for child in plan.get("Plans", []):
        found |= relations_of(child)
    return found


def rows_read(plan: dict[str, Any], relation: str) -> int:
    """Rows the scans of `relation` in an analyzed plan handed up, over all their loops."""
    read = 0
    if plan.get("Relation Name") == relation:
        read += int(plan["Actual Rows"] * plan["Actual Loops"])
    for child in plan.get("Plans", []):
        read += rows_read(child, relation)
    return read


def new(job_type: str = "t", **fields: Any) -> NewJob:
    """An enqueue request; NewJob options (keys, max_retries) are split off `fields`."""
    max_retries = fields.pop("max_retries", 3)
    idem = fields.pop("idempotency_key", None)
    request_hash = fields.pop("request_hash", None)
    return NewJob(
        spec=JobSpec(type=job_type, **fields),
        max_retries=max_retries,
        idempotency_key=idem,
        request_hash=request_hash,
    )
