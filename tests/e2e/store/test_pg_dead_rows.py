"""PostgreSQL with dead row versions it cannot remove: a claim starts past the jobs it took
already, starts and completes do not walk the status indexes, jobs placed below a claim's
floor are still claimed, and the node VACUUMs its own table and names a snapshot that
holds cleanup back."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from goqueue.supervisor.common.enums import Status
from goqueue.supervisor.common.jobs import JobSpec, new_id, utcnow
from goqueue.supervisor.store.base import NewJob, StartNow
from goqueue.supervisor.store.postgres.rows import array_literal, insert_params
from goqueue.supervisor.store.postgres.sql.statements import Sql, Statements
from goqueue.supervisor.store.postgres.upkeep import TableCare
from psycopg.types.json import Json

from tests.conftest import postgres_dsn, wait_for, wait_for_async
from tests.e2e.store.pg_nodes import Nodes, new, plan_of

pytestmark = pytest.mark.postgres


@pytest.fixture(scope="module")
def dsn() -> Iterator[str]:
    """A database of this module's own: the node looks for the oldest snapshot across its
    whole database, so another test's transaction on the shared one (a node of its own
    named `a`, a snapshot it holds) would be named instead of this module's, or keep its
    VACUUM from removing anything."""
    shared = postgres_dsn()
    name = f"gq_dead_rows_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(shared, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    yield urlunsplit(urlsplit(shared)._replace(path=f"/{name}"))
    with psycopg.connect(shared, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def snapshot(dsn: str) -> Iterator[psycopg.Connection]:
    """A session holding a REPEATABLE READ snapshot open: no row version dead since can
    be removed, by VACUUM or by any scan, until it ends."""
    conn = psycopg.connect(dsn, application_name="held-snapshot")
    conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    conn.execute("SELECT 1")
    pid = conn.info.backend_pid
    yield conn
    conn.close()
    # its backend ends a moment after: until then it still holds back the next test's VACUUM
    with psycopg.connect(dsn, autocommit=True) as probe:
        query = "SELECT count(*) FROM pg_stat_activity WHERE pid = %s"
        wait_for(lambda: probe.execute(query, (pid,)).fetchone() == (0,), timeout=10)


async def _buffers(nodes: Nodes, query: str, params: object) -> int:
    """Shared buffers `query` touches, by EXPLAIN (ANALYZE, BUFFERS), rolled back; run
    once before (rolled back too), so that planning it reads no catalog pages. The fewest
    of three runs: beside other tests, a run now and then reads pages that are not the
    statement's (70 against 67, 318 against 279; most likely catalog reloads after DDL
    elsewhere on the server), enough to tip a bar of 4 times."""
    conn = await psycopg.AsyncConnection.connect(nodes.dsn)
    query = query.replace("{s}", f'"{nodes.schema}"')
    read = []
    async with conn:
        await conn.execute("SAVEPOINT warm")
        await conn.execute(query, params)
        for _ in range(3):
            await conn.execute("ROLLBACK TO SAVEPOINT warm")
            plan = await plan_of(conn, query, params, "ANALYZE, BUFFERS")
            read.append(
                int(plan.get("Shared Hit Blocks", 0)) + int(plan.get("Shared Read Blocks", 0))
            )
        await conn.rollback()
    return min(read)


CLAIM = (
    "SELECT * FROM {s}.claim_floored(ARRAY['t'],"
    " ARRAY[10], NULL, 10, 'probe', 30, 90, 'ns.', 0, %s::timestamptz[], %s::bigint[])"
)


@pytest.mark.timeout(90)
def test_a_claim_starts_past_the_jobs_it_took(nodes: Nodes, snapshot: object) -> None:
    async def body(nodes: Nodes) -> None:
        a = await nodes.open("a")
        await a.enqueue_many([new() for _ in range(10_000)])
        taken = []
        while len(taken) < 10_000:
            leases = await a.claim(500, None, {"t": 500})
            assert leases
            taken += leases
        last = taken[-1].job
        ahead = (await a.enqueue(new())).job
        # From the start, the claim steps over 10,000 dead pending versions (the held
        # snapshot keeps them); from the floor, over none of them.
        nowhere = [None] * 11
        walked = await _buffers(nodes, CLAIM, (nowhere, nowhere))
        floor_at = [None] * 5 + [last.run_at] + [None] * 5
        floor_seq = [None] * 5 + [last.seq] + [None] * 5
        floored = await _buffers(nodes, CLAIM, (floor_at, floor_seq))
        assert floored * 4 < walked, (floored, walked)
        # and the job beyond the floor is found (the probes were rolled back)
        leases = await a.claim(10, None, {"t": 10})
        assert [x.job.id for x in leases] == [ahead.id]

    nodes.run(body)


@pytest.mark.timeout(90)
def test_a_paused_queue_costs_a_claim_from_every_queue_nothing_more(
    nodes: Nodes, snapshot: object
) -> None:
    async def body(nodes: Nodes) -> None:
        a = await nodes.open("a")
        await a.set_paused("zzz", True)
        await a.enqueue_many([new(queue="zzz") for _ in range(10)])
        await a.enqueue_many([new() for _ in range(3_000)])
        taken = []
        while len(taken) < 3_000:
            leases = await a.claim(500, None, {"t": 500})
            assert leases and all(x.job.queue == "default" for x in leases)
            taken += leases
        # The claim walks from its floor whether a queue is paused or not: it does not
        # list the queues holding jobs first, a walk over the 3,000 dead pending
        # versions of the jobs it took (the held snapshot keeps them).
        last = taken[-1].job
        floors = [None] * 5 + [last.run_at] + [None] * 5, [None] * 5 + [last.seq] + [None] * 5
        claim = CLAIM.removesuffix(")") + ", ARRAY[]::text[])"  # the node's own overload
        paused = await _buffers(nodes, claim, floors)
        await a.set_paused("zzz", False)
        resumed = await _buffers(nodes, claim, floors)
        assert paused < resumed + 20, (paused, resumed)  # the walk was 50 pages more
        leases = await a.claim(20, None, {"t": 20})
        assert sorted(x.job.queue for x in leases) == ["zzz"] * 10

    nodes.run(body)


@pytest.mark.timeout(90)
def test_a_keyed_claim_reads_a_window_of_keys_not_every_pending_job(nodes: Nodes) -> None:
    async def body(nodes: Nodes) -> None:
        a = await nodes.open("a")
        await a.register_node({"k": None}, key_limits={"k": 1})
        floors = [utcnow()] * 11, [0] * 11  # past every job: the unkeyed walk finds none
        claim = CLAIM.replace("'t'", "'k'")

        async def jobs(n: int, keys: int) -> None:
            await a.enqueue_many([new("k", concurrency_key=f"key-{i % keys}") for i in range(n)])

        await jobs(200, 100)
        few = await _buffers(nodes, claim, floors)
        await jobs(4000, 1000)
        # each key of the window is an index probe from the type's cursor: 20 times the
        # jobs and 10 times the keys, and about the same pages read
        many = await _buffers(nodes, claim, floors)
        assert many < 2 * few, (few, many)
        assert len(await a.claim(10, None, {"k": 10})) == 10  # one job of each of 10 keys

    nodes.run(body)


@pytest.mark.timeout(60)
def test_jobs_made_pending_below_a_floor_are_claimed(nodes: Nodes) -> None:
    async def body(nodes: Nodes) -> None:
        a = await nodes.open("a")
        b = await nodes.open("b")
        await a.enqueue_many([new() for _ in range(20)])
        assert len(await a.claim(20, None, {"t": 20})) == 20  # a's floor is past them
        past = utcnow() - timedelta(hours=1)
        # Made pending by this node below its floor: claimed at once.
        mine = (await a.enqueue(new(run_at=past))).job
        assert [x.job.id for x in await a.claim(5, None, {"t": 5})] == [mine.id]
        # By another node: claimed within the floors' rescan at worst.
        theirs = (await b.enqueue(new(run_at=past))).job
        got: list[str] = []

        async def claimed() -> bool:
            got.extend(x.job.id for x in await a.claim(5, None, {"t": 5}))
            return bool(got)

        await wait_for_async(claimed, timeout=15)
        assert got == [theirs.id]

    nodes.run(body)


@pytest.mark.timeout(60)
def test_starts_and_completes_do_not_walk_the_status_indexes(
    nodes: Nodes, snapshot: object
) -> None:
    async def body(nodes: Nodes) -> None:
        a = await nodes.open("a")
        await a.enqueue_many([new() for _ in range(2000)])
        while leases := await a.claim(500, None, {"t": 500}, start=0):
            started = [await a.start(x) for x in leases]
            for lease in started:
                assert lease is not None
                await a.complete(lease, None)
        # Thousands of dead 'claimed' and 'running' versions now; a start by id reads
        # the primary key, never the whole of `jobs_claimed`.
        job = (await a.enqueue(new())).job
        (lease,) = await a.claim(1, None, {"t": 1}, start=0)
        start = (
            "UPDATE {s}.jobs j SET status = 'running' WHERE j.id = ANY (%s::uuid[])"
            " AND (j.status || '') IN ('claimed')"
        )
        assert await _buffers(nodes, start, ([job.id],)) < 40
        assert await a.start(lease) is not None

    nodes.run(body)


def start_params(floor_at: datetime | None = None, floor_seq: int | None = None) -> dict[str, Any]:
    """`Sql.ADD_JOB_STARTED`'s parameters for a job of type `t` that a worker of node `a`
    (serving `t` alone) waits for, from the given claim floor at its priority."""
    return insert_params(JobSpec(type="t"), 3) | {
        "node": "a",
        "token": new_id(),
        "lease": 30.0,
        "live": 60.0,
        "types": array_literal(["t"]),
        "queues": None,
        "payload": Json(None),  # not Raw: this connection has no adapter for it
        "floor_at": array_literal([floor_at]),
        "floor_seq": array_literal([floor_seq]),
    }


def test_a_start_at_enqueue_looks_for_a_job_ahead_of_it_once(
    nodes: Nodes, snapshot: object
) -> None:
    """The statement that stores a job started for a waiting worker first checks that no
    due job is ahead of it; that check walks the dead pending versions a held snapshot
    keeps, and must do so once, not once for each column that depends on it."""

    async def body(nodes: Nodes) -> None:
        a = await nodes.open("a")
        await a.enqueue_many([new() for _ in range(10_000)])
        while await a.claim(500, None, {"t": 500}):
            pass
        params = start_params()  # no floor: walked from the start, as the check
        statement = Statements(nodes.schema)[Sql.ADD_JOB_STARTED]
        check = (
            "SELECT NOT EXISTS (SELECT 1 FROM {s}.jobs j WHERE j.status = 'pending'"
            " AND j.type = ANY (%(types)s::text::text[]) AND j.priority >= %(priority)s"
            " AND j.run_at <= now())"
        )
        once = await _buffers(nodes, check, params)
        stored = await _buffers(nodes, statement, params)
        assert stored < 2 * once, (stored, once)

    nodes.run(body)


def started() -> NewJob:
    """An enqueue for which a worker of the node waits (`Sql.ADD_JOB_STARTED`)."""
    asked = new()
    asked.start = StartNow(frozenset({"t"}))
    return asked


def test_a_start_at_enqueue_looks_for_jobs_ahead_from_the_claims_floors(
    nodes: Nodes, snapshot: object
) -> None:
    """Once the node has drained 10,000 jobs (their pending versions kept by a held
    snapshot), a job started at its enqueue looks for a job ahead of it from where the
    node's claims left off, as a claim does, not through every version drained; and a
    job ahead is still seen, so the new one waits its turn."""

    async def body(nodes: Nodes) -> None:
        a = await nodes.open("a")
        await a.enqueue_many([new() for _ in range(10_000)])
        taken = []
        while leases := await a.claim(500, None, {"t": 500}):
            taken += leases
        last = taken[-1].job
        params = start_params()
        statement = Statements(nodes.schema)[Sql.ADD_JOB_STARTED]
        walked = await _buffers(nodes, statement, params)
        floored = await _buffers(nodes, statement, start_params(last.run_at, last.seq))
        assert floored * 4 < walked, (floored, walked)
        # through the store, with the floors its claims raised: a pending job ahead
        # keeps the new one from starting; once that one is claimed, the next starts
        ahead = (await a.enqueue(new())).job
        waits = await a.enqueue(started())
        assert waits.lease is None and waits.job.status == Status.PENDING
        claimed = await a.claim(10, None, {"t": 10})
        assert [x.job.id for x in claimed] == [ahead.id, waits.job.id]
        starts = await a.enqueue(started())
        assert starts.lease is not None and starts.job.status == Status.RUNNING

    nodes.run(body)


@pytest.mark.timeout(90)
def test_the_node_vacuums_its_table_and_names_a_snapshot_holding_it_back(
    nodes: Nodes, dsn: str
) -> None:
    async def body(nodes: Nodes) -> None:
        a = await nodes.open("a")
        care = TableCare(a._db, nodes.schema, threshold=100, warn_after=0.0)

        async def drain(n: int) -> None:
            await a.enqueue_many([new() for _ in range(n)])
            while leases := await a.claim(200, None, {"t": 200}):
                for lease in leases:
                    await a.complete(lease, None)

        async def dead_counted() -> bool:
            return (await care.look()).dead >= 300

        await drain(300)
        await wait_for_async(dead_counted, timeout=20)
        assert await care.step()  # dead rows past the threshold: vacuumed
        assert care.upkeep().vacuums == 1
        assert care.upkeep().dead_rows is not None
        assert (care.upkeep().dead_rows or 0) < 300

        holder = psycopg.connect(dsn, application_name="held-snapshot")
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT 1")
        try:
            await drain(300)
            await wait_for_async(dead_counted, timeout=20)
            assert await care.step()  # vacuumed in vain: the snapshot holds them
            warning = care.upkeep().warning
            assert warning is not None and "held-snapshot" in warning
            assert not await care.step()  # not again while the same snapshot holds
        finally:
            holder.close()
        # it ended (once its backend is gone, as seen from the server): a step removes them
        await wait_for_async(care.step, timeout=10)
        assert (care.upkeep().dead_rows or 0) < 300
        assert care.upkeep().vacuums == 3

    nodes.run(body)
