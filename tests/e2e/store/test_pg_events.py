"""PostgreSQL's audit trails: each event under one index, its key, which every read of
a trail walks; and an upgrade that moves the trails already there under it."""

from __future__ import annotations

import msgspec
import psycopg
import pytest
from goqueue.supervisor.store.postgres.sql.fragments import Sql
from goqueue.supervisor.store.postgres.sql.statements import Statements

from tests.e2e.store.pg_nodes import EVENTS_UNKEYED, Nodes, new, plan_of, relations_of

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(60)]

ALL = {"t": 10}


async def indexes(nodes: Nodes) -> list[tuple[str, str]]:
    """The events table's indexes: (name, definition), by name."""
    rows = await nodes.sql(
        "SELECT c.relname, pg_get_indexdef(i.indexrelid) FROM pg_index i"
        " JOIN pg_class c ON c.oid = i.indexrelid"
        " WHERE i.indrelid = %s::regclass AND i.indisprimary ORDER BY 1",
        (f'"{nodes.schema}".events',),
    )
    others = await nodes.sql(
        "SELECT count(*) FROM pg_index WHERE indrelid = %s::regclass",
        (f'"{nodes.schema}".events',),
    )
    assert others == [(len(rows),)], "an index beside the key"
    return [(name, definition.split(" USING ")[1]) for name, definition in rows]


def test_a_trail_is_kept_and_read_under_the_events_key_alone(nodes: Nodes) -> None:
    async def body(nodes: Nodes) -> None:
        node = await nodes.open("a")
        await node.register_node({"t": None})
        for _ in range(3):
            await node.enqueue(new("t"))
        leases = await node.claim(3, None, ALL)
        await node.complete(leases[0], msgspec.Raw(b"1"))
        await node.fail(leases[1], "boom", None)
        trails = {x.job.id: [e.event for e in await node.events(x.job.id)] for x in leases}
        assert await indexes(nodes) == [("events_pkey", "btree (job_id, at, id)")]
        conn = await psycopg.AsyncConnection.connect(nodes.dsn, autocommit=True)
        async with conn:
            query = Statements(nodes.schema)[Sql.EVENTS]
            read = relations_of(await plan_of(conn, query, {"id": leases[0].job.id}))
        assert "events_pkey" in read, read
        # the schema before migration 23, with these trails in it: the upgrade keeps them
        await node.close()
        await nodes.sql(EVENTS_UNKEYED)
        assert len(await nodes.sql("SELECT 1 FROM pg_index WHERE indrelid = %s::regclass",
                                   (f'"{nodes.schema}".events',))) == 2  # fmt: skip
        again = await nodes.open("b")  # migrates
        assert await indexes(nodes) == [("events_pkey", "btree (job_id, at, id)")]
        for job_id, trail in trails.items():
            assert [e.event for e in await again.events(job_id)] == trail
        assert trails[leases[0].job.id][-1] == "succeeded"

    nodes.run(body)
