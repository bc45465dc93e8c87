"""The store contract for workflows, run against the memory and PostgreSQL stores:
atomic creation, release exactly once with the parents' results, a failure cancelling
exactly the dependents, replay resuming them, cancel of the whole workflow."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

import msgspec
import pytest
from goqueue.supervisor.common.enums import Status, WorkflowStatus
from goqueue.supervisor.common.errors import IdempotencyMismatch, InvalidState, NotFound
from goqueue.supervisor.common.jobs import JobSpec, Lease, new_id, utcnow
from goqueue.supervisor.common.steps import Workflow
from goqueue.supervisor.store.base import NewJob, Store
from goqueue.supervisor.store.new_workflow import NewStep, NewWorkflow

pytestmark = pytest.mark.timeout(60)

ALL = {"a": 1000, "b": 1000}


def flow(*steps: tuple[str, list[str]], **fields: object) -> NewWorkflow:
    """A workflow of `a` jobs: (key, after) each, parents first."""
    spec = msgspec.json.decode(b'{"type": "a"}', type=JobSpec)
    return NewWorkflow(
        id=new_id(),
        name="wf",
        steps=[NewStep(key=k, after=a, new=NewJob(spec=spec, max_retries=0)) for k, a in steps],
        idempotency_key=fields.get("idempotency_key"),  # type: ignore[arg-type]
        request_hash=fields.get("request_hash"),  # type: ignore[arg-type]
    )


def statuses(wf: Workflow) -> dict[str, str]:
    return {s.key: s.status for s in wf.steps}


async def current(store: Store, wf_id: str) -> Workflow:
    found = await store.get_workflow(wf_id)
    assert found is not None
    return found


async def take(store: Store, n: int = 100) -> dict[str, Lease]:
    """Claim every due step, by key."""
    leases = await store.claim(n, None, ALL)
    return {lease.job.step_key or "": lease for lease in leases}


async def test_chain_releases_each_step_once_with_parent_results(open_store) -> None:
    async with open_store() as store:
        made = await store.create_workflow(flow(("a", []), ("b", ["a"]), ("c", ["b"])))
        assert [s.after for s in made.workflow.steps] == [[], ["a"], ["b"]]
        assert made.created and statuses(made.workflow) == {
            "a": "pending",
            "b": "waiting",
            "c": "waiting",
        }
        stats = await store.stats()
        assert stats.counts["waiting"] == 2 and stats.counts["pending"] == 1
        counts = await store.workflow_counts()
        assert counts.steps_waiting == 2 and counts.by_status["running"] == 1
        leases = await take(store)
        assert list(leases) == ["a"]
        outcome = await store.complete(leases["a"], msgspec.Raw(b'{"n": 1}'))
        assert outcome is not None and [j.step_key for j in outcome.released] == ["b"]
        leases = await take(store)
        assert list(leases) == ["b"]
        b = leases["b"].job
        assert b.workflow_id == made.workflow.id and b.parent_ids == [made.workflow.steps[0].id]
        assert msgspec.json.decode(b.parents or b"{}") == {"a": {"n": 1}}
        await store.complete(leases["b"], msgspec.Raw(b"2"))
        leases = await take(store)
        assert list(leases) == ["c"]
        await store.complete(leases["c"], msgspec.Raw(b"3"))
        wf = await current(store, made.workflow.id)
        assert wf.status == WorkflowStatus.DONE
        assert [s.after for s in wf.steps] == [[], ["a"], ["b"]]


async def test_fan_in_waits_for_every_parent(open_store) -> None:
    async with open_store() as store:
        leaves = [(f"leaf{i}", ["root"]) for i in range(5)]
        made = await store.create_workflow(
            flow(("root", []), *leaves, ("join", [k for k, _ in leaves]))
        )
        await store.complete((await take(store))["root"], None)
        leaves_held = await take(store)
        assert sorted(leaves_held) == sorted(k for k, _ in leaves)
        for key in sorted(leaves_held)[:-1]:
            outcome = await store.complete(leaves_held[key], msgspec.Raw(b'"x"'))
            assert outcome is not None and outcome.released == []
        last = sorted(leaves_held)[-1]
        outcome = await store.complete(leaves_held[last], msgspec.Raw(b'"y"'))
        assert outcome is not None and [j.step_key for j in outcome.released] == ["join"]
        join = (await take(store))["join"].job
        assert set(msgspec.json.decode(join.parents or b"{}")) == {k for k, _ in leaves}
        assert (await current(store, made.workflow.id)).status == WorkflowStatus.RUNNING


async def test_concurrent_parents_release_the_join_exactly_once(open_store) -> None:
    async with open_store("node-a") as one, open_store("node-b") as two:
        keys = [f"p{i}" for i in range(40)]
        await one.create_workflow(flow(*[(k, []) for k in keys], ("join", keys)))
        held = await take(one, 40)
        assert len(held) == 40
        stores = [one, two]
        outcomes = await asyncio.gather(
            *(stores[i % 2].complete(lease, None) for i, lease in enumerate(held.values()))
        )
        released = [j.step_key for o in outcomes if o is not None for j in o.released]
        assert released == ["join"]


async def test_failure_cancels_exactly_the_dependents_and_replay_resumes(open_store) -> None:
    async with open_store() as store:
        made = await store.create_workflow(
            flow(("a", []), ("bad", []), ("x", ["bad"]), ("y", ["x", "a"]), ("z", ["a"]))
        )
        held = await take(store)
        outcome = await store.fail(held["bad"], "boom", None)
        assert outcome is not None and outcome.dead_letter is not None
        wf = await current(store, made.workflow.id)
        assert statuses(wf) == {
            "a": "pending" if "a" not in held else "running",
            "bad": "failed",
            "x": "cancelled",
            "y": "cancelled",
            "z": "waiting",
        }
        assert wf.status == WorkflowStatus.RUNNING  # a and z, which do not depend on bad, go on
        x = await store.get(wf.steps[2].id)
        assert x is not None and x.last_error is not None and "'bad'" in x.last_error
        await store.complete(held["a"], None)
        assert statuses(await current(store, made.workflow.id))["z"] == "pending"
        await store.complete((await take(store))["z"], None)
        wf = await current(store, made.workflow.id)
        assert wf.status == WorkflowStatus.FAILED  # nothing unfinished is left
        failed = await store.list_workflows(WorkflowStatus.FAILED, 10, 0)
        assert [w.id for w in failed.items] == [made.workflow.id]

        fresh = await store.replay_dead(outcome.dead_letter.id, 0)
        assert fresh.workflow_id == made.workflow.id and fresh.step_key == "bad"
        wf = await current(store, made.workflow.id)
        assert wf.status == WorkflowStatus.RUNNING
        assert statuses(wf)["x"] == "waiting" and statuses(wf)["y"] == "waiting"
        assert wf.steps[1].id == fresh.id
        held = await take(store)
        await store.complete(held["bad"], msgspec.Raw(b"1"))
        await store.complete((await take(store))["x"], None)
        held = await take(store)
        assert "y" in held
        assert set(msgspec.json.decode(held["y"].job.parents or b"{}")) == {"x", "a"}


async def test_cancel_stops_the_whole_workflow(open_store) -> None:
    async with open_store() as store:
        made = await store.create_workflow(flow(("a", []), ("b", []), ("c", ["a", "b"])))
        held = await take(store, 1)
        wf, cancelled = await store.cancel_workflow(made.workflow.id)
        assert wf.status == WorkflowStatus.CANCELLED
        assert set(statuses(wf).values()) == {"cancelled"}
        tokens = {job.step_key: token for job, token in cancelled}
        (running,) = held.values()
        assert tokens[running.job.step_key] == running.token
        assert await store.complete(running, None) is None  # fenced out
        assert await take(store) == {}
        with pytest.raises(InvalidState):
            await store.cancel_workflow(made.workflow.id)
        with pytest.raises(NotFound):
            await store.cancel_workflow(new_id())


async def test_idempotent_creation_and_listing(open_store) -> None:
    async with open_store() as store:
        first = await store.create_workflow(flow(("a", []), idempotency_key="k", request_hash="h1"))
        again = await store.create_workflow(flow(("a", []), idempotency_key="k", request_hash="h1"))
        assert not again.created and again.workflow.id == first.workflow.id
        with pytest.raises(IdempotencyMismatch):
            await store.create_workflow(flow(("a", []), idempotency_key="k", request_hash="h2"))
        other = await store.create_workflow(flow(("a", []), ("b", ["a"])))
        page = await store.list_workflows(None, 10, 0)
        assert [w.id for w in page.items] == [other.workflow.id, first.workflow.id]
        assert page.total == 2
        await store.cancel_workflow(other.workflow.id)
        cancelled = await store.list_workflows(WorkflowStatus.CANCELLED, 10, 0)
        assert [w.id for w in cancelled.items] == [other.workflow.id]
        assert await store.get_workflow(new_id()) is None
        assert await store.get_workflow("not-a-uuid") is None
        counts = await store.workflow_counts()
        assert counts.by_status == {"running": 1, "done": 0, "failed": 0, "cancelled": 1}
        assert counts.steps_waiting == 0


async def test_a_large_workflow_is_stored_quickly(open_store) -> None:
    async with open_store() as store:
        steps = [("s0", [])] + [(f"s{i}", [f"s{i - 1}"]) for i in range(1, 2000)]
        started = time.perf_counter()
        made = await store.create_workflow(flow(*steps))
        took = time.perf_counter() - started
        print(f"2000-step workflow stored in {took * 1000:.0f} ms")
        assert len(made.workflow.steps) == 2000
        counted = (await store.stats()).counts
        assert counted[Status.WAITING] == 1999 and counted[Status.PENDING] == 1


async def test_a_late_success_of_a_reaped_step_lets_its_dependents_run(open_store, clock) -> None:
    async with open_store(lease_seconds=0.2) as store:
        made = await store.create_workflow(flow(("a", []), ("b", ["a"]), ("c", ["b"])))
        lease = (await take(store))["a"]
        await clock.advance(0.35)
        assert [j.id for j in await store.reap_expired(None)] == [lease.job.id]
        assert statuses(await current(store, made.workflow.id)) == {
            "a": "failed",
            "b": "cancelled",
            "c": "cancelled",
        }
        outcome = await store.complete(lease, msgspec.Raw(b'"late"'))
        assert outcome is not None and [j.step_key for j in outcome.released] == ["b"]
        wf = await current(store, made.workflow.id)
        assert statuses(wf) == {"a": "done", "b": "pending", "c": "waiting"}
        assert wf.status == WorkflowStatus.RUNNING


async def test_a_workflow_goes_when_its_last_step_is_pruned(open_store) -> None:
    async with open_store() as store:
        keyed = {"idempotency_key": "k", "request_hash": "h"}
        made = await store.create_workflow(flow(("a", []), ("b", ["a"]), **keyed))
        keep = await store.create_workflow(flow(("x", []), ("y", ["x"])))
        roots = await take(store)
        await store.complete(roots["a"], None)
        await store.complete((await take(store))["b"], None)
        await store.complete(roots["x"], None)  # y is still to run: `keep` stays
        assert await store.prune(utcnow() + timedelta(days=1), 1000) == 3
        assert await store.get_workflow(made.workflow.id) is None
        assert [w.id for w in (await store.list_workflows(None, 10, 0)).items] == [keep.workflow.id]
        (y,) = (await take(store)).values()
        await store.complete(y, msgspec.Raw(b"1"))
        assert (await current(store, keep.workflow.id)).status == WorkflowStatus.DONE
        assert await store.prune(utcnow() + timedelta(days=1), 1000) == 1
        assert (await store.list_workflows(None, 10, 0)).total == 0
        # its idempotency key went with it: the same request makes a new workflow
        again = await store.create_workflow(flow(("a", []), ("b", ["a"]), **keyed))
        assert again.created and again.workflow.id != made.workflow.id


async def agree(store: Store, ids: list[str]) -> None:
    """Each status's listing, total and count name exactly the workflows whose own status
    it is, newest first."""
    found = {wf_id: (await current(store, wf_id)).status for wf_id in ids}
    counts = (await store.workflow_counts()).by_status
    for status in WorkflowStatus:
        page = await store.list_workflows(status, 10, 0)
        mine = [wf_id for wf_id in reversed(ids) if found[wf_id] == status]
        assert [w.id for w in page.items] == mine, status
        assert page.total == counts[status] == len(mine), status
    assert (await store.list_workflows(None, 10, 0)).total == len(ids)


async def test_counts_and_listings_follow_every_move_of_a_workflow(open_store) -> None:
    async with open_store() as store:
        made = [await store.create_workflow(flow(("a", []), ("b", ["a"]))) for _ in range(4)]
        ids = [m.workflow.id for m in made]
        await agree(store, ids)
        leases = {lease.job.workflow_id: lease for lease in await store.claim(100, None, ALL)}
        done, failing, cancelled, _ = ids
        await store.complete(leases[done], None)
        outcome = await store.fail(leases[failing], "boom", None)
        assert outcome is not None and outcome.dead_letter is not None
        await store.cancel_workflow(cancelled)
        await agree(store, ids)  # running, failed (its dependent cancelled), cancelled
        (b,) = [lease for lease in await store.claim(100, None, ALL) if lease.job.step_key == "b"]
        await store.complete(b, None)
        await agree(store, ids)  # done
        await store.replay_dead(outcome.dead_letter.id, 0)
        await agree(store, ids)  # running again
        (again,) = [lease for lease in await store.claim(100, None, ALL)]
        await store.fail(again, "boom again", None)
        await agree(store, ids)  # failed again
        await store.prune(utcnow() + timedelta(days=1), 1000)
        left = [wf_id for wf_id in ids if await store.get_workflow(wf_id) is not None]
        assert left == [ids[3]]  # only the one still running keeps steps
        await agree(store, left)
