"""PostgreSQL's workflow statuses, kept with each workflow as its steps move: the counts
and listings by status are exact from two nodes, before, across and after a fold; they
read no step but those of the workflows touched since the last fold; and the upgrade
gives every workflow already there its status."""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import timedelta

import psycopg
import pytest
from goqueue.supervisor.common.enums import WorkflowStatus
from goqueue.supervisor.common.jobs import JobSpec, new_id, utcnow
from goqueue.supervisor.store.base import NewJob
from goqueue.supervisor.store.new_workflow import NewStep, NewWorkflow
from goqueue.supervisor.store.postgres.sql.fragments import Sql
from goqueue.supervisor.store.postgres.sql.statements import Statements
from goqueue.supervisor.store.postgres.store import PostgresStore
from goqueue.supervisor.store.postgres.upkeep import TableCare

from tests.e2e.store.pg_nodes import FLOW_STATUS_DROPPED, Nodes, plan_of, rows_read

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(60)]

ALL = {"t": 1000}


def flow(*steps: tuple[str, list[str]]) -> NewWorkflow:
    """A workflow of `t` jobs: (key, after) each, parents first."""
    spec = JobSpec(type="t")
    return NewWorkflow(
        id=new_id(),
        name="wf",
        steps=[NewStep(key=k, after=a, new=NewJob(spec=spec, max_retries=0)) for k, a in steps],
    )


async def assert_exact(store: PostgresStore, ids: list[str]) -> None:
    """Counts, totals and listings by status (newest first) are each workflow's own
    status."""
    own = {}
    for wf_id in ids:
        found = await store.get_workflow(wf_id)
        assert found is not None
        own[wf_id] = found.status
    counts = await store.workflow_counts()
    assert counts.by_status == {str(s): Counter(own.values())[s] for s in WorkflowStatus}
    every = await store.list_workflows(None, 100, 0)
    newest_first = [w.id for w in every.items]
    assert sorted(newest_first) == sorted(ids) and every.total == len(ids)
    for status in WorkflowStatus:
        page = await store.list_workflows(status, 100, 0)
        assert [w.id for w in page.items] == [w for w in newest_first if own[w] == status]
        assert page.total == counts.by_status[status]


def test_workflow_counts_stay_exact_from_two_nodes_across_folds(nodes: Nodes) -> None:
    async def body(nodes: Nodes) -> None:
        a, b = await nodes.open("a"), await nodes.open("b")
        care = TableCare(a._db, nodes.schema)
        made = await asyncio.gather(
            *(a.create_workflow(flow(("x", []), ("y", ["x"]))) for _ in range(6)),
            *(b.create_workflow(flow(("x", []))) for _ in range(4)),
        )
        ids = [m.workflow.id for m in made]
        await assert_exact(a, ids)
        upper = await a.get_workflow(ids[0].upper())  # a uuid in any spelling
        assert upper is not None and str(upper.id) == ids[0]
        assert await care.fold() > 0  # the new ones settled
        await assert_exact(b, ids)
        roots = {lease.job.workflow_id: lease for lease in await a.claim(100, None, ALL)}
        assert len(roots) == 10
        # outcomes on both nodes while a fold runs, a cancel, a failure to the dead letters
        failing = roots.pop(ids[0])
        await asyncio.gather(
            care.fold(),
            *(a.complete(lease, None) for wf, lease in roots.items() if wf in ids[:5]),
            *(b.complete(lease, None) for wf, lease in roots.items() if wf in ids[5:8]),
            b.fail(failing, "boom", None),
            a.cancel_workflow(ids[9]),
        )
        await assert_exact(a, ids)
        await care.fold()
        await assert_exact(b, ids)
        # the children of those done run; the failed step is replayed and runs again
        for lease in await b.claim(100, None, ALL):
            await b.complete(lease, None)
        await assert_exact(a, ids)
        await care.fold()
        await b.cancel_workflow(ids[1])  # done and settled: no step moves, the workflow does
        await assert_exact(a, ids)
        (letter,) = (await a.list_dead(10, 0)).items
        await a.replay_dead(letter.id, 0)
        await assert_exact(b, ids)
        await care.fold()
        await assert_exact(a, ids)
        (again,) = await a.claim(100, None, ALL)
        await a.complete(again, None)
        await assert_exact(a, ids)
        # a step with no dependents fails, is settled failed, then replayed: running
        lone = (await b.create_workflow(flow(("x", [])))).workflow.id
        ids.append(lone)
        for step in await b.claim(100, None, ALL):  # the lone step, and any left to run
            if step.job.workflow_id != lone:
                await b.complete(step, None)
                continue
            failed = await b.fail(step, "boom", None)
        assert failed is not None and failed.dead_letter is not None
        await care.fold()
        await assert_exact(a, ids)
        await a.replay_dead(failed.dead_letter.id, 0)
        await assert_exact(a, ids)
        await care.fold()
        await assert_exact(b, ids)
        (step,) = await b.claim(100, None, ALL)
        await b.complete(step, None)
        await assert_exact(a, ids)
        # pruning: a workflow whose steps all go is counted out, folded or not
        await nodes.sql("UPDATE {s}.jobs SET finished_at = now() - interval '1 day'")
        assert await b.prune(utcnow() - timedelta(hours=1), 1000) > 0
        left = [wf_id for wf_id in ids if await a.get_workflow(wf_id) is not None]
        assert len(left) < len(ids)
        await assert_exact(a, left)
        await care.fold()
        await assert_exact(b, left)
        assert await nodes.sql("SELECT 1 FROM {s}.workflow_touches") == []
        assert await nodes.sql("SELECT 1 FROM {s}.workflow_count_changes") == []

    nodes.run(body)


def test_workflow_counts_and_listings_read_no_history(nodes: Nodes) -> None:
    async def body(nodes: Nodes) -> None:
        a = await nodes.open("a")
        made = [await a.create_workflow(flow(("x", []))) for _ in range(50)]
        for lease in await a.claim(1000, None, ALL):
            await a.complete(lease, None)
        running = await a.create_workflow(flow(("x", [])))
        await TableCare(a._db, nodes.schema).fold()
        page = await a.list_workflows(WorkflowStatus.DONE, 5, 0)
        assert page.total == len(made) and len(page.items) == 5
        assert [w.id for w in (await a.list_workflows(WorkflowStatus.RUNNING, 5, 0)).items] == [
            running.workflow.id
        ]
        # a long history as the planner sees it: many workflows kept, settled done
        await nodes.sql(
            "INSERT INTO {s}.workflows (id, name, created_at, status)"
            " SELECT gen_random_uuid(), 'old', now(), 'done' FROM generate_series(1, 20000);"
            " ANALYZE {s}.jobs; ANALYZE {s}.workflows"
        )
        statements = Statements(nodes.schema)
        conn = await psycopg.AsyncConnection.connect(nodes.dsn, autocommit=True)
        async with conn:
            plan = await plan_of(conn, statements[Sql.WORKFLOW_COUNTS], None, "ANALYZE")
            assert rows_read(plan, "jobs") == 0 and rows_read(plan, "workflows") == 0, plan
            for status, rows in (("running", 1), ("done", 5)):
                params = {"status": status, "limit": 5, "offset": 0}
                plan = await plan_of(conn, statements[Sql.WORKFLOW_LIST], params, "ANALYZE")
                assert rows_read(plan, "workflows") == rows, plan
                assert rows_read(plan, "jobs") == 0, plan


def test_an_upgrade_keeps_the_status_of_every_workflow_already_there(nodes: Nodes) -> None:
    async def body(nodes: Nodes) -> None:
        a = await nodes.open("a")
        made = [await a.create_workflow(flow(("x", []), ("y", ["x"]))) for _ in range(4)]
        ids = [m.workflow.id for m in made]
        roots = {lease.job.workflow_id: lease for lease in await a.claim(100, None, ALL)}
        await a.complete(roots[ids[0]], None)
        await a.fail(roots[ids[1]], "boom", None)
        await a.cancel_workflow(ids[2])
        (child,) = await a.claim(100, None, ALL)
        await a.complete(child, None)
        await a.close()
        await nodes.sql(FLOW_STATUS_DROPPED)  # the schema before migration 21
        upgraded = await nodes.open("b")  # migrates
        kept = dict(await nodes.sql("SELECT id::text, status FROM {s}.workflows"))
        assert kept == dict(zip(ids, ("done", "failed", "cancelled", "running"), strict=True))
        await assert_exact(upgraded, ids)
        await upgraded.create_workflow(flow(("x", [])))
        assert (await upgraded.workflow_counts()).by_status["running"] == 2

    nodes.run(body)


def test_a_workflow_with_no_step_kept_counts_as_it_reads(nodes: Nodes) -> None:
    async def body(nodes: Nodes) -> None:
        a = await nodes.open("a")
        wf_id = (await a.create_workflow(flow(("x", [])))).workflow.id
        # its steps gone by hand (pruning takes the workflow with its last step)
        await nodes.sql("DELETE FROM {s}.jobs WHERE workflow_id = %s", (wf_id,))
        await assert_exact(a, [wf_id])  # done, as `workflow_status` rules with no step
        await TableCare(a._db, nodes.schema).fold()
        await assert_exact(a, [wf_id])

    nodes.run(body)
