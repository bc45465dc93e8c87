"""PostgreSQL's job counts, kept as jobs change: exact through every kind of change from
two nodes at once, before and after a fold and across one; never read from the jobs
table; and counted from the jobs already there when the schema is upgraded."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from datetime import timedelta

import msgspec
import psycopg
import pytest
from goqueue.supervisor.common.bulk import CancelFilter
from goqueue.supervisor.common.jobs import JobSpec, new_id, utcnow
from goqueue.supervisor.common.reads import JobFilter
from goqueue.supervisor.common.summaries import DeadFilter
from goqueue.supervisor.store.base import RUN_TIMES_SAMPLE, NewJob
from goqueue.supervisor.store.new_workflow import NewStep, NewWorkflow
from goqueue.supervisor.store.postgres.rows import dead_filter
from goqueue.supervisor.store.postgres.sql.fragments import Sql
from goqueue.supervisor.store.postgres.sql.statements import Statements
from goqueue.supervisor.store.postgres.store import PostgresStore
from goqueue.supervisor.store.postgres.upkeep import TableCare

from tests.e2e.store.pg_nodes import (
    DEAD_GROUPS_DROPPED,
    FLOW_STATUS_DROPPED,
    LETTERS_AGAIN,
    TALLY_DROPPED,
    Nodes,
    new,
    plan_of,
    relations_of,
    rows_read,
)

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(60)]

Counts = dict[tuple[str, str, int, str], int]


async def truth(nodes: Nodes) -> Counts:
    """The jobs counted by a pass over the table."""
    rows = await nodes.sql(
        "SELECT queue, type, priority, status, count(*) FROM {s}.jobs GROUP BY 1, 2, 3, 4"
    )
    return {(q, t, p, s): n for q, t, p, s, n in rows}


async def kept(nodes: Nodes) -> Counts:
    """The counts as kept: folded, plus the changes since (zero groups left out)."""
    rows = await nodes.sql(
        "SELECT queue, type, priority, status, sum(n) FROM ("
        " SELECT queue, type, priority, status, n FROM {s}.job_counts UNION ALL"
        " SELECT queue, type, priority, status, n FROM {s}.job_count_changes) c"
        " GROUP BY 1, 2, 3, 4 HAVING sum(n) <> 0"
    )
    return {(q, t, p, s): int(n) for q, t, p, s, n in rows}


async def assert_exact(nodes: Nodes, store: PostgresStore) -> None:
    """The kept counts are the table's, and so are the store's answers built on them."""
    real = await truth(nodes)
    assert await kept(nodes) == real
    by_status: Counter[str] = Counter()
    for (_, _, _, status), n in real.items():
        by_status[status] += n
    stats = await store.stats()
    assert {s: n for s, n in stats.counts.items() if n} == dict(by_status)
    q2: Counter[str] = Counter()
    for (queue, _, _, status), n in real.items():
        if queue == "q2":
            q2[status] += n
    assert {s: n for s, n in (await store.queue_stats("q2")).counts.items() if n} == dict(q2)
    listed = await store.list_jobs(JobFilter(status="pending", queue="q2"), 1, 0)
    assert listed.total == sum(
        n for (q, _, _, s), n in real.items() if q == "q2" and s == "pending"
    )
    assert (await store.list_jobs(JobFilter(), 1, 0)).total == sum(real.values())


def step(job_type: str) -> NewJob:
    return NewJob(spec=JobSpec(type=job_type), max_retries=0)


def test_counts_stay_exact_through_every_change_from_two_nodes(nodes: Nodes) -> None:
    async def body(nodes: Nodes) -> None:
        a, b = await nodes.open("a"), await nodes.open("b")
        care = TableCare(a._db, nodes.schema)
        # enqueues of every shape, from both nodes at once
        await asyncio.gather(
            a.enqueue_many([new("t", priority=i % 3) for i in range(60)]),
            b.enqueue_many([new("u", queue="q2") for _ in range(40)]),
            a.enqueue(new("t", queue="q2", delay_seconds=600)),
            b.enqueue(new("u", dedupe_key="once")),
        )
        await assert_exact(nodes, a)
        # claims, starts, completes and failures (to the dead letters) on both nodes
        leases = await a.claim(20, None, {"t": 20, "u": 20}, start=5)
        others = await b.claim(20, None, {"t": 20, "u": 20})
        for lease in leases[5:8]:
            assert await a.start(lease) is not None
        await asyncio.gather(
            *(a.complete(x, msgspec.Raw(b"1")) for x in leases[:5]),
            *(b.fail(x, "boom", None) for x in others[:6]),
            *(b.fail(x, "again", utcnow() + timedelta(seconds=60)) for x in others[6:9]),
        )
        await assert_exact(nodes, a)
        # a fold while both nodes write, then the counts stay exact
        await asyncio.gather(
            care.fold(),
            a.enqueue_many([new("t", queue="q2") for _ in range(30)]),
            b.cancel_many(CancelFilter(type="u"), 5),
        )
        await assert_exact(nodes, a)
        # cancels, the reaper, replays, workflows and pruning
        await a.cancel((await a.enqueue(new("t", queue="q2"))).job.id, False)
        await nodes.expire_leases()
        await a.reap_expired()
        await b.replay_dead_many(DeadFilter(), 3)
        await b.create_workflow(
            NewWorkflow(
                id=new_id(),
                name="flow",
                steps=[
                    NewStep(key="x", after=[], new=step("t")),
                    NewStep(key="y", after=["x"], new=step("t")),
                ],
            )
        )
        await assert_exact(nodes, b)
        assert await care.fold() > 0
        await assert_exact(nodes, b)
        await nodes.sql("UPDATE {s}.jobs SET finished_at = now() - interval '1 day'")
        assert await a.prune(utcnow() - timedelta(hours=1), 1000) > 0
        await assert_exact(nodes, a)
        await care.fold()
        assert await kept(nodes) == await truth(nodes)
        # the fold left no zero groups and no changes behind
        assert await nodes.sql("SELECT 1 FROM {s}.job_counts WHERE n = 0") == []
        assert await nodes.sql("SELECT 1 FROM {s}.job_count_changes") == []

    nodes.run(body)


def test_a_count_never_reads_the_jobs_table(nodes: Nodes) -> None:
    async def body(nodes: Nodes) -> None:
        a = await nodes.open("a")
        await a.enqueue_many([new() for _ in range(50)])
        # a history three times the run times' sample, as the planner sees it
        await nodes.sql(
            "INSERT INTO {s}.jobs (id, type, queue, payload, priority, status, attempts,"
            " max_retries, run_at, created_at, started_at, finished_at, updated_at)"
            " SELECT gen_random_uuid(), 't', 'default', '{}', 5, 'done', 1, 0, t, t, t,"
            " t + interval '3 ms', t FROM generate_series(1, %s) AS g,"
            " LATERAL (SELECT now() - g * interval '1 ms' AS t) AS at",
            (3 * RUN_TIMES_SAMPLE,),
        )
        await nodes.sql("ANALYZE {s}.jobs")
        statements = Statements(nodes.schema)
        conn = await psycopg.AsyncConnection.connect(nodes.dsn, autocommit=True)
        async with conn:
            for name in (
                Sql.COUNTS,
                Sql.DEPTH,
                Sql.QUEUE_COUNTS,
                Sql.QUEUE_DEPTH,
                Sql.TYPE_COUNTS,
                Sql.QUEUE_NAMES,
            ):
                plan = await plan_of(conn, statements[name], {"queue": "default", "limit": 10})
                read = relations_of(plan)
                assert "jobs" not in read and "job_counts" in read, (name, read)
            # depths and waits by queue: of the 50 pending jobs (one group, all due) one
            # row is read, the group's oldest
            for name in (Sql.QUEUE_DEPTHS, Sql.QUEUE_PENDING):
                plan = await plan_of(conn, statements[name], {"top": 10}, "ANALYZE")
                assert rows_read(plan, "jobs") == 1, (name, plan)
            # a listing's total, filtered by the counts' columns
            for filters in (JobFilter(), JobFilter(status="done", type="t", queue="default")):
                count_sql = statements.list_jobs(filters)[1]
                params = {"status": "done", "type": "t", "queue": "default"}
                plan = await plan_of(conn, count_sql, params)
                assert "jobs" not in relations_of(plan), (filters, relations_of(plan))
            # the Types page's run times: the latest finished jobs, newest first, no more
            plan = await plan_of(conn, statements[Sql.TYPE_RUN_TIMES])
            assert "jobs_finished" in relations_of(plan), plan
            assert '"Limit"' in json.dumps(plan), plan

    nodes.run(body)


def test_the_queues_page_counts_the_jobs_for_later_without_walking_them_all(
    nodes: Nodes,
) -> None:
    # Reminders scheduled weeks ahead are a deep queue of their own: the Queues page must
    # not walk them all, and must still count them exactly.
    async def body(nodes: Nodes) -> None:
        await nodes.open("a")  # migrates
        shapes = {"later": (3, 20_000), "due": (3_000, 3), "both": (1_500, 1_500)}
        for queue, (due, later) in shapes.items():
            await nodes.sql(
                "INSERT INTO {s}.jobs (id, type, queue, payload, priority, status, attempts,"
                " max_retries, run_at, created_at, updated_at)"
                " SELECT gen_random_uuid(), 't', %s, '{}', 5, 'pending', 0, 3,"
                " now() + CASE WHEN g <= %s THEN -g ELSE g END * interval '1 s', now(), now()"
                " FROM generate_series(1, %s) AS g",
                (queue, due, due + later),
            )
        await nodes.sql("ANALYZE {s}.jobs")
        statements = Statements(nodes.schema)
        conn = await psycopg.AsyncConnection.connect(nodes.dsn, autocommit=True)
        async with conn:
            cur = await conn.execute(statements[Sql.QUEUE_PENDING])
            got = {queue: (int(n), int(later)) for queue, _, n, later, *_ in await cur.fetchall()}
            plan = await plan_of(conn, statements[Sql.QUEUE_PENDING], None, "ANALYZE")
        assert got == {q: (due + later, later) for q, (due, later) in shapes.items()}
        # "later" walks a thousand of its jobs for later, then its 3 due; "due" its 3 for
        # later; only "both", deep on both sides, walks a thousand of each, then all its
        # 1,500 for later; and each group probes its oldest: about 4,500 in all, where a
        # walk over every job for later would read 21,500
        assert rows_read(plan, "jobs") < 5_000, rows_read(plan, "jobs")

    nodes.run(body)


def test_an_upgrade_counts_the_jobs_already_there(nodes: Nodes) -> None:
    async def body(nodes: Nodes) -> None:
        a = await nodes.open("a")
        await a.enqueue_many([new("t", queue=f"q{i % 2}") for i in range(30)])
        leases = await a.claim(12, None, {"t": 12})
        for lease in leases[:4]:
            await a.complete(lease, None)
        await a.fail(leases[4], "boom", None)
        await a.close()
        # the schema as it was before migration 20, with more jobs written since
        await nodes.sql(FLOW_STATUS_DROPPED)
        await nodes.sql(
            "DROP TRIGGER jobs_counted_insert ON {s}.jobs;"
            " DROP TRIGGER jobs_counted_update ON {s}.jobs;"
            " DROP TRIGGER jobs_counted_delete ON {s}.jobs;"
            " DROP FUNCTION {s}.count_job_changes(); DROP TABLE {s}.job_counts;"
            " DROP TABLE {s}.job_count_changes;"
            " DELETE FROM {s}.schema_version WHERE version = 20;"
            " UPDATE {s}.jobs SET status = 'cancelled', finished_at = now()"
            " WHERE status = 'pending' AND queue = 'q1'"
        )
        before = await truth(nodes)
        assert {status for *_, status in before} >= {"pending", "running", "done", "cancelled"}
        upgraded = await nodes.open("b")  # migrates
        assert await kept(nodes) == before
        await upgraded.enqueue(new("t", queue="q2"))
        await assert_exact(nodes, upgraded)

    nodes.run(body)


def test_a_role_that_may_only_write_jobs_can_enqueue(nodes: Nodes) -> None:
    from goqueue import pg

    role = f"gq_writer_{nodes.schema[-8:]}"

    async def body(nodes: Nodes) -> None:
        a = await nodes.open("a")
        # the grants an application's role needs to enqueue in its own transaction,
        # and none on the counts
        await nodes.sql(
            f"CREATE ROLE {role}; GRANT USAGE ON SCHEMA {{s}} TO {role};"
            f" GRANT SELECT, INSERT ON {{s}}.jobs, {{s}}.events TO {role};"
            f" GRANT SELECT ON {{s}}.paused_queues, {{s}}.nodes TO {role};"
            f" GRANT USAGE ON ALL SEQUENCES IN SCHEMA {{s}} TO {role}"
        )
        try:
            with psycopg.connect(nodes.dsn) as conn:
                conn.execute(f"SET ROLE {role}")
                pg.enqueue(conn, "t", {"n": 1}, schema=nodes.schema, strict=False)
                conn.commit()
            assert (await a.stats()).counts["pending"] == 1
        finally:
            await nodes.sql(f"DROP OWNED BY {role}; DROP ROLE {role}")

    nodes.run(body)


def test_the_dead_letters_are_tallied_as_they_come_and_go(nodes: Nodes) -> None:
    async def body(nodes: Nodes) -> None:
        a, b = await nodes.open("a"), await nodes.open("b")
        care = TableCare(a._db, nodes.schema)

        async def assert_tallied() -> None:
            ((real,),) = await nodes.sql("SELECT count(*) FROM {s}.dead_letters")
            assert (await a.stats()).dead_letters == real
            assert (await b.queue_depths(10)).dead_letters == real
            assert (await a.dead_briefs(DeadFilter(), 5, 0, 10)).total == real
            assert (await b.list_dead(5, 0)).total == real

        await a.enqueue_many([new("t", max_retries=0) for _ in range(30)])
        leases = await a.claim(30, None, {"t": 30})
        await asyncio.gather(
            *(a.fail(x, "boom", None) for x in leases[:15]),
            *(b.fail(x, "boom", None) for x in leases[15:25]),
            care.fold(),
        )
        await assert_tallied()
        await a.replay_dead_many(DeadFilter(), 4)
        await b.purge_dead_many(DeadFilter(), 3)
        await assert_tallied()
        assert await care.fold() > 0
        await assert_tallied()
        letter = (await a.list_dead(1, 0)).items[0]
        await b.purge_dead(letter.id)
        await assert_tallied()
        await care.fold()
        await assert_tallied()
        assert await nodes.sql("SELECT 1 FROM {s}.tally_changes") == []
        statements = Statements(nodes.schema)
        conn = await psycopg.AsyncConnection.connect(nodes.dsn, autocommit=True)
        async with conn:
            for name, params in ((Sql.DEAD_COUNT, None), (Sql.QUEUE_DEPTHS, {"top": 10})):
                read = relations_of(await plan_of(conn, statements[name], params))
                assert "dead_letters" not in read and "tallies" in read, (name, read)
        # the schema before migration 22, with more dead letters since: the upgrade counts
        await a.close()
        await b.close()
        await nodes.sql(TALLY_DROPPED)
        await nodes.sql(LETTERS_AGAIN)
        c = await nodes.open("c")  # migrates
        ((real,),) = await nodes.sql("SELECT count(*) FROM {s}.dead_letters")
        assert real > 10 and (await c.stats()).dead_letters == real

    nodes.run(body)


def test_dead_letters_by_queue_and_type_are_tallied_and_found_by_index(nodes: Nodes) -> None:
    """A page of dead letters filtered by queue, type or both takes its total from the
    tallies (reading no letter) and its letters from that queue's or type's index, exact
    through burials and replays and purges on two nodes with a fold among them; an
    upgrade tallies the letters already there."""
    groups = [DeadFilter(queue="q1"), DeadFilter(type="u"), DeadFilter(queue="q2", type="u")]
    groups.append(DeadFilter(queue="q1", type="u"))

    async def body(nodes: Nodes) -> None:
        a, b = await nodes.open("a"), await nodes.open("b")
        care = TableCare(a._db, nodes.schema)

        async def assert_tallied(store: PostgresStore) -> None:
            jobs = [
                json.loads(j) for (j,) in await nodes.sql("SELECT job::text FROM {s}.dead_letters")
            ]
            for f in groups:
                real = sum(
                    (f.queue in (None, j["queue"])) and (f.type in (None, j["type"])) for j in jobs
                )
                assert (await store.list_dead(1, 0, f)).total == real, f
                assert (await store.dead_briefs(f, 1, 0, 10)).total == real, f

        nul = msgspec.Raw(b'{"a": "\\u0000", "queue": "elsewhere"}')  # `->>` refuses it
        news = [new("t", queue="q1", max_retries=0, payload=nul) for _ in range(6)]
        await a.enqueue_many(news + [new("u", queue="q2", max_retries=0) for _ in range(4)])
        leases = await a.claim(10, None, {"t": 10, "u": 10})
        await asyncio.gather(
            *(a.fail(x, "boom", None) for x in leases[:5]),
            *(b.fail(x, "boom", None) for x in leases[5:]),
            care.fold(),
        )
        await assert_tallied(a)
        # letters whose JSON the database cannot read field by field are listed whole
        briefs = (await a.dead_briefs(DeadFilter(queue="q1"), 100, 0, 8)).items
        assert len(briefs) == 6 and {(b.type, b.priority) for b in briefs} == {("t", 5)}
        assert {(b.payload.text, b.payload.truncated) for b in briefs} == {('{"a": "\\', True)}
        await b.replay_dead_many(DeadFilter(queue="q1"), 2)
        await a.purge_dead_many(DeadFilter(type="u"), 1)
        await assert_tallied(b)
        assert await care.fold() > 0
        await assert_tallied(a)
        # many letters elsewhere: the count reads none of them, the page walks its index
        await nodes.sql(
            "INSERT INTO {s}.dead_letters (id, job_id, job, errors, created_at)"
            " SELECT gen_random_uuid(), gen_random_uuid(),"
            " jsonb_set(jsonb_set(d.job::jsonb, '{queue}', '\"bulk\"'), '{type}', '\"bulk\"')"
            "::json, d.errors, now()"
            " FROM {s}.dead_letters d, generate_series(1, 20000)"
            " WHERE strpos(d.job::text, '\\u0000') = 0 LIMIT 20000"
        )
        await nodes.sql("ANALYZE {s}.dead_letters")
        await assert_tallied(b)
        statements = Statements(nodes.schema)
        conn = await psycopg.AsyncConnection.connect(nodes.dsn, autocommit=True)
        async with conn:
            counted = {"queue": "q1", "type": None}
            read = relations_of(await plan_of(conn, statements[Sql.COUNT_DEAD_GROUPED], counted))
            assert "dead_letters" not in read and "tallies" in read, read
            for f, index in (
                (DeadFilter(queue="q1"), "dead_letters_queue"),
                (DeadFilter(type="u"), "dead_letters_type"),
            ):
                params = dead_filter(f) | {"limit": 5, "offset": 0, "n": 10}
                for name in (Sql.LIST_DEAD, Sql.DEAD_BRIEFS):
                    read = relations_of(await plan_of(conn, statements[name], params))
                    assert index in read, (name, read)
        # a bulk purge counts what is left from the tallies: none of the 20,000 is read
        # (the statement runs in a transaction rolled back)
        conn = await psycopg.AsyncConnection.connect(nodes.dsn)
        read = {}
        async with conn:
            params = dead_filter(DeadFilter()) | {"limit": 1}
            for name in (Sql.PURGE_DEAD_MANY_TALLIED, Sql.PURGE_DEAD_MANY):
                plan = await plan_of(conn, statements[name], params, "ANALYZE")
                await conn.rollback()
                read[name] = rows_read(plan, "dead_letters")
        assert read[Sql.PURGE_DEAD_MANY_TALLIED] < 10 < 20_000 < read[Sql.PURGE_DEAD_MANY], read
        # the schema before migration 24, with letters: the upgrade tallies them by group
        await a.close()
        await b.close()
        await nodes.sql(DEAD_GROUPS_DROPPED)
        await nodes.sql(LETTERS_AGAIN + ' WHERE strpos(job::text, \'"queue":"bulk"\') = 0')
        c = await nodes.open("c")  # migrates
        await assert_tallied(c)
        ((total,),) = await nodes.sql("SELECT count(*) FROM {s}.dead_letters")
        assert (await c.stats()).dead_letters == total

    nodes.run(body)
