"""The producer's side of unique jobs and bulk dead-letter actions: `Client` and
`AsyncClient` against a real node, and `goqueue.pg.enqueue` in the caller's transaction."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

import goqueue
import goqueue.pg
import psycopg
import pytest

from tests.conftest import Node, wait_for
from tests.e2e.client.conftest import Database

pytestmark = pytest.mark.timeout(90)


def bury(client: goqueue.Client, job_type: str, n: int, **options: object) -> list[str]:
    """`n` jobs that fail for good, each waited for until its dead letter is there."""
    ids = [client.enqueue(job_type, **options).id for _ in range(n)]  # type: ignore[arg-type]
    for job_id in ids:
        with pytest.raises(goqueue.JobFailed):
            client.wait(job_id, timeout=20)
    wait_for(lambda: client.dlq.page().total >= n)
    return ids


def test_client_replays_and_purges_every_match(node: Node, tmp_path: Path) -> None:
    with goqueue.Client(node.url) as client:
        bury(client, "fails_until_fixed", 3, payload={"dir": str(tmp_path)})
        bury(client, "failnow", 2)
        with pytest.raises(goqueue.BadRequest) as unfiltered:
            client.dlq.replay_many()
        assert unfiltered.value.details == {"parameter": "all"}
        assert client.dlq.page(type="failnow").total == 2
        assert len(list(client.dlq.list(page_size=1, error="rejected"))) == 3
        (tmp_path / "fixed").touch()
        one = client.dlq.replay_many(type="fails_until_fixed", limit=1)
        assert (one.replayed, one.remaining) == (1, 2)
        rest = client.dlq.replay_many(type="fails_until_fixed")  # as many requests as needed
        assert (rest.replayed, rest.remaining) == (2, 0)
        week_ago = datetime.now(UTC) - timedelta(days=7)
        assert client.dlq.purge_many(before=week_ago).purged == 0
        with pytest.raises(ValueError, match="timezone-aware"):
            client.dlq.purge_many(before=datetime.now())
        with pytest.raises(TypeError, match="unknown dead-letter filter"):
            client.dlq.purge_many(kind="x")  # type: ignore[call-arg]
        everything = client.dlq.purge_many(all=True)
        assert (everything.purged, everything.remaining) == (2, 0)
        assert client.dlq.page().total == 0


def test_async_client_replays_and_purges_and_finds_by_job_id(node: Node) -> None:
    async def scenario() -> None:
        async with goqueue.AsyncClient(node.url) as client:
            jobs = [await client.enqueue("failnow") for _ in range(3)]
            for job in jobs:
                with pytest.raises(goqueue.JobFailed):
                    await client.wait(job.id, timeout=20)
            letter = await client.dlq.get(jobs[0].id)  # the job's id finds its letter
            assert letter.job_id == jobs[0].id
            purged = await client.dlq.purge_many(type="failnow", limit=2)
            assert (purged.purged, purged.remaining) == (2, 1)
            replayed = await client.dlq.replay_many(error="bad INPUT")
            assert (replayed.replayed, replayed.remaining) == (1, 0)
            with pytest.raises(goqueue.NotFound):
                await client.dlq.get(jobs[0].id)

    asyncio.run(scenario())


def test_client_unique_key_conflict_names_the_holder(node: Node) -> None:
    with goqueue.Client(node.url) as client:
        first = client.enqueue("noop", delay_seconds=60, unique_key="report:7")
        assert first.unique_key == "report:7"
        with pytest.raises(goqueue.Conflict) as held:
            client.enqueue("noop", delay_seconds=60, unique_key="report:7")
        assert held.value.existing_id == first.id
        client.cancel(first.id)
        assert client.enqueue("noop", unique_key="report:7").unique_key == "report:7"


def test_pg_enqueue_holds_a_unique_key_in_the_callers_transaction(registered: Database) -> None:
    with psycopg.connect(registered.dsn) as conn:
        conn.execute("CREATE TEMPORARY TABLE mine (n int)")
        first = goqueue.pg.enqueue(conn, "email", schema=registered.schema, unique_key="u:1")
        with pytest.raises(goqueue.Conflict) as held:
            goqueue.pg.enqueue(conn, "email", schema=registered.schema, unique_key="u:1")
        assert held.value.existing_id == first.id and held.value.status == 409
        conn.execute("INSERT INTO mine VALUES (1)")  # the transaction is still usable
        conn.commit()
    with psycopg.connect(registered.dsn, autocommit=True) as other:
        with pytest.raises(goqueue.Conflict):  # committed: held for everyone
            goqueue.pg.enqueue(other, "email", schema=registered.schema, unique_key="u:1")
        schema = registered.schema
        other.execute(f"UPDATE {schema}.jobs SET status = 'done' WHERE id = %s", (first.id,))
        again = goqueue.pg.enqueue(other, "email", schema=schema, unique_key="u:1")
        assert again.id != first.id
