"""PostgreSQL-specific behaviour of the store, against a real database.

Several `PostgresStore` instances on one schema behave like several nodes; each test
gets a fresh random schema, dropped afterwards. Without `TEST_DATABASE_URL` (or with an
unreachable one) these tests skip loudly, except under CI, where they fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import msgspec
import psycopg
import pytest
from goqueue.supervisor.common.errors import (
    DuplicateJob,
    IdempotencyMismatch,
    InvalidState,
    NotFound,
    StoreUnavailable,
)
from goqueue.supervisor.common.jobs import Enqueued, JobSpec, Lease, Outcome, utcnow
from goqueue.supervisor.common.reads import JobFilter
from goqueue.supervisor.settings import stores
from goqueue.supervisor.store.postgres.connection import Batcher
from goqueue.supervisor.store.postgres.sql import schema as pg_schema
from goqueue.supervisor.store.postgres.store import PostgresStore

from tests.conftest import wait_for_async
from tests.e2e.store.pg_nodes import Nodes, new

pytestmark = pytest.mark.postgres


async def wait_until(check: Callable[[], Awaitable[bool]], timeout: float) -> float:
    """Poll `check` until true; return the seconds it took (fail after `timeout`)."""
    start = time.monotonic()
    while not await check():
        if time.monotonic() - start > timeout:
            pytest.fail(f"condition not met within {timeout}s")
        await asyncio.sleep(0.01)
    return time.monotonic() - start


async def claim_all(store: PostgresStore, job_type: str = "t", n: int = 100) -> list[Lease]:
    return await store.claim(n, None, {job_type: n})


# -- schema ----------------------------------------------------------------------------


@pytest.mark.timeout(30)
def test_migration_is_idempotent_and_safe_concurrently(nodes: Nodes) -> None:
    async def body(nodes: Nodes) -> None:
        async def migrate() -> list[int]:
            conn = await psycopg.AsyncConnection.connect(nodes.dsn, autocommit=True)
            async with conn:
                return await pg_schema.migrate(conn, nodes.schema)

        results = await asyncio.gather(*(migrate() for _ in range(4)))
        latest = [m.version for m in pg_schema.MIGRATIONS]
        assert sorted(results, key=len) == [[], [], [], latest]
        assert await migrate() == []
        rows = await nodes.sql("SELECT version FROM {s}.schema_version ORDER BY version")
        assert [r[0] for r in rows] == latest
        # Two stores opening at once on a fresh schema both come up.
        nodes.schema = f"{nodes.schema}_b"
        try:
            await asyncio.gather(nodes.open("a"), nodes.open("b"))
            assert await nodes.stores[0].ping() and await nodes.stores[1].ping()
        finally:
            for store in nodes.stores:
                await store.close()
            nodes.stores.clear()
            await nodes.sql(f'DROP SCHEMA IF EXISTS "{nodes.schema}" CASCADE')

    nodes.run(body)


@pytest.mark.timeout(5)
def test_bad_schema_name_is_refused() -> None:
    with pytest.raises(ValueError, match="schema"):
        PostgresStore("postgresql://x", "n", schema='x"; DROP TABLE y; --')


# -- claiming --------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_two_nodes_never_claim_the_same_job(nodes: Nodes) -> None:
    async def body(nodes: Nodes) -> None:
        a, b = await nodes.open("a"), await nodes.open("b")
        results = await a.enqueue_many([new() for _ in range(500)])
        assert all(isinstance(r, Enqueued) for r in results)

        async def drain(store: PostgresStore) -> list[Lease]:
            got: list[Lease] = []
            while batch := await store.claim(7, None, {"t": 7}):
                got.extend(batch)
            return got

        per_claimer = await asyncio.gather(*(drain(s) for s in (a, b, a, b, a, b)))
        ids = [lease.job.id for leases in per_claimer for lease in leases]
        assert len(ids) == 500
        assert len(set(ids)) == 500
        assert all(lease.job.attempts == 1 for leases in per_claimer for lease in leases)
        owners = {lease.owner for leases in per_claimer for lease in leases}
        assert owners == {"a", "b"}
        rows = await nodes.sql("SELECT status, count(*) FROM {s}.jobs GROUP BY status")
        assert rows == [("running", 500)]

    nodes.run(body)


@pytest.mark.timeout(30)
def test_claim_order_slots_queues_and_pauses(nodes: Nodes) -> None:
    async def body(nodes: Nodes) -> None:
        a = await nodes.open("a")
        low = (await a.enqueue(new("t", priority=1))).job
        first = (await a.enqueue(new("t", priority=9))).job
        second = (await a.enqueue(new("t", priority=9))).job
        later = (await a.enqueue(new("t", priority=10, delay_seconds=3600))).job
        others = [(await a.enqueue(new("u", queue="q2"))).job for _ in range(3)]
        for _ in range(20):
            await a.enqueue(new("busy", priority=10))

        # A type at its slot limit does not starve the others.
        leases = await a.claim(10, None, {"t": 2, "u": 2, "busy": 1})
        assert [x.job.type for x in leases] == ["busy", "t", "t", "u", "u"]
        assert [x.job.id for x in leases[1:3]] == [first.id, second.id]
        assert {x.job.id for x in leases[3:]} <= {o.id for o in others}
        assert a.next_due_at() == later.run_at

        assert await a.claim(10, frozenset({"default"}), {"u": 5}) == []
        await a.set_paused("q2", True)
        assert await nodes.sql("SELECT queue FROM {s}.paused_queues") == [("q2",)]
        assert await a.claim(10, None, {"u": 5}) == []
        await a.set_paused("q2", False)
        rest = await a.claim(10, frozenset({"q2"}), {"u": 5})
        assert len(rest) == 1
        assert [x.job.id for x in await a.claim(10, None, {"t": 5})] == [low.id]

    nodes.run(body)


@pytest.mark.timeout(30)
def test_only_a_short_claim_looks_for_the_next_scheduled_job(nodes: Nodes) -> None:
    """A full claim is followed by another as soon as a slot frees: it skips the probes
    for scheduled jobs, and the node keeps the due time it knew."""

    async def body(nodes: Nodes) -> None:
        a = await nodes.open("a")
        later = (await a.enqueue(new(delay_seconds=3600))).job
        await a.enqueue_many([new() for _ in range(4)])
        claim = (
            "SELECT o_next_due FROM {s}.claim_leases(ARRAY['t'], ARRAY[5], NULL, %s, 'x',"
            " 30, 90, 'ns.', %s) WHERE o_job IS NULL"
        )
        assert await nodes.sql(claim, (1, 1)) == [(None,)]  # full: not looked for
        assert await nodes.sql(claim, (2, 0)) == [(None,)]
        await a.cancel(later.id, False)
        assert len(await a.claim(1, None, {"t": 1})) == 1
        assert a.next_due_at() == later.run_at  # as known, though cancelled meanwhile
        assert await a.claim(5, None, {"t": 5}) == []
        assert a.next_due_at() is None
        sooner = (await a.enqueue(new(delay_seconds=1800))).job
        assert await nodes.sql(claim, (5, 0)) == [(sooner.run_at,)]

    nodes.run(body)


@pytest.mark.timeout(60)
def test_claim_by_queue_merges_queues_and_skips_foreign_ones(nodes: Nodes) -> None:
    async def body(nodes: Nodes) -> None:
        a = await nodes.open("a")
        # Deep foreign and paused queues first in line: a claim by queue must not walk them.
        await a.enqueue_many([new(queue="foreign") for _ in range(3000)])
        await a.enqueue_many([new(queue="held") for _ in range(3000)])
        await a.set_paused("held", True)
        jobs = [
            (await a.enqueue(new(queue=q, priority=p))).job
            for q, p in [("x", 5), ("y", 5), ("x", 7), ("y", 5), ("x", 5)]
        ]
        order = [jobs[2].id, jobs[0].id, jobs[1].id, jobs[3].id, jobs[4].id]
        start = time.monotonic()
        leases = await a.claim(10, frozenset({"x", "y", "held"}), {"t": 10})
        assert [x.job.id for x in leases] == order  # priority, then run_at and seq
        assert time.monotonic() - start < 1.0
        for lease in leases:
            assert await a.release(lease)
        # Every queue but the paused one: the same order after the foreign jobs' (older).
        leases = await a.claim(3005, None, {"t": 3005})
        assert len(leases) == 3005 and {x.job.queue for x in leases} == {"foreign", "x", "y"}
        assert [x.job.id for x in leases if x.job.queue != "foreign"] == order
        await a.set_paused("held", False)
        assert len(await a.claim(10, None, {"t": 10})) == 10

    nodes.run(body)


@pytest.mark.timeout(30)
def test_work_in_queues_this_node_does_not_claim_does_not_wake_it(nodes: Nodes) -> None:
    async def body(nodes: Nodes) -> None:
        a = await nodes.open("a")
        woke = asyncio.Event()
        nodes.waker(a).target = woke.set
        await a.enqueue(new(queue="theirs"))
        assert woke.is_set()  # no claim seen yet: any work may be ours
        assert await a.claim(5, frozenset({"mine"}), {"t": 5}) == []
        woke.clear()
        await a.enqueue(new(queue="theirs"))
        assert not woke.is_set()
        await a.enqueue_many([new(queue="theirs"), new(queue="mine")])
        assert woke.is_set()

    nodes.run(body)


@pytest.mark.timeout(60)
def test_global_type_limit_holds_across_nodes(nodes: Nodes) -> None:
    async def body(nodes: Nodes) -> None:
        a, b = await nodes.open("a"), await nodes.open("b")
        await a.register_node({"t": 3, "x": None})
        await b.register_node({"t": 3})
        await a.enqueue_many([new() for _ in range(60)])

        # Twenty claims racing from two nodes, nothing running yet: three in all.
        racing = await asyncio.gather(
            *(s.claim(3, None, {"t": 3}) for s in [a, b] * 10), return_exceptions=True
        )
        assert not [r for r in racing if isinstance(r, BaseException)]
        held = [lease for r in racing if isinstance(r, list) for lease in r]
        assert len(held) == 3
        assert await b.claim(3, None, {"t": 3}) == []
        assert await a.complete(held[0], None) is not None
        assert len(await b.claim(3, None, {"t": 3})) == 1

        # Then a churn of claims and completions, sampled from outside all the while.
        peak = 0
        stop = asyncio.Event()

        async def sample() -> None:
            nonlocal peak
            while not stop.is_set():
                rows = await nodes.sql(
                    "SELECT count(*) FROM {s}.jobs WHERE status = 'running' AND type = 't'"
                )
                peak = max(peak, rows[0][0])

        async def work(store: PostgresStore) -> int:
            done = 0
            while leases := await store.claim(3, None, {"t": 3}):
                await asyncio.sleep(0.002)
                for lease in leases:
                    assert await store.complete(lease, None) is not None
                    done += 1
            return done

        sampler = asyncio.create_task(sample())
        for lease in held[1:] + (await a.claim(3, None, {"t": 3})):
            await a.complete(lease, None)
        await asyncio.gather(*(work(s) for s in (a, b, a, b)))
        stop.set()
        await sampler
        assert 1 <= peak <= 3

    nodes.run(body)


@pytest.mark.timeout(30)
def test_a_freed_global_slot_wakes_every_node(nodes: Nodes) -> None:
    """A claim racing the commit that frees a slot finds none; the commit must wake the
    dispatchers again or the remaining jobs wait for an unrelated event."""

    async def body(nodes: Nodes) -> None:
        a, b = await nodes.open("a"), await nodes.open("b")
        await a.register_node({"t": 1})
        await b.register_node({"t": 1})
        await a.enqueue_many([new(), new(), new()])
        (first,) = await b.claim(1, None, {"t": 1})
        assert await a.claim(1, None, {"t": 1}) == []
        assert await b.claim(1, None, {"t": 1}) == []
        woke_a, woke_b = asyncio.Event(), asyncio.Event()
        nodes.waker(a).target = woke_a.set
        nodes.waker(b).target = woke_b.set
        await b.complete(first, None)
        assert woke_b.is_set()
        await asyncio.wait_for(woke_a.wait(), timeout=1.0)
        (second,) = await a.claim(1, None, {"t": 1})
        woke_a.clear()
        woke_b.clear()
        await a.fail(second, "gone", None)
        assert woke_a.is_set()
        await asyncio.wait_for(woke_b.wait(), timeout=1.0)

    nodes.run(body)


@pytest.mark.timeout(30)
def test_smallest_limit_of_live_nodes_holds(nodes: Nodes) -> None:
    async def body(nodes: Nodes) -> None:
        a, b = await nodes.open("a"), await nodes.open("b")
        await a.register_node({"t": 5})
        await b.register_node({"t": 2, "only_b": None})
        assert await a.known_types() >= {"t", "only_b"}
        await a.enqueue_many([new() for _ in range(10)])
        assert len(await a.claim(5, None, {"t": 5})) == 2
        # b's heartbeat is long gone: its smaller limit no longer applies.
        await nodes.sql("UPDATE {s}.nodes SET heartbeat_at = now() - interval '1 hour'")
        await a.register_node({"t": 5})
        assert len(await a.claim(5, None, {"t": 5})) == 3

        async def b_forgotten() -> bool:  # known_types is cached for a second
            return "only_b" not in await a.known_types()

        await wait_until(b_forgotten, timeout=3)

    nodes.run(body)


@pytest.mark.timeout(30)
def test_claimed_and_running_jobs_both_count_against_a_global_limit(nodes: Nodes) -> None:
    async def body(nodes: Nodes) -> None:
        a, b = await nodes.open("a"), await nodes.open("b")
        await a.register_node({"t": 4})
        await b.register_node({"t": None})  # runs the type, declares no limit
        await a.enqueue_many([new() for _ in range(10)])
        assert len(await a.claim(2, None, {"t": 2}, start=0)) == 2  # held, not started
        assert len(await b.claim(1, None, {"t": 5})) == 1  # started
        assert len(await b.claim(5, None, {"t": 5})) == 1  # the last of the four slots
        assert await a.claim(5, None, {"t": 5}) == []
        assert a.next_due_at() is None

    nodes.run(body)


# -- leases ----------------------------------------------------------------------------


@pytest.mark.timeout(30)
def test_stale_lease_holder_is_fenced_out(nodes: Nodes) -> None:
    async def body(nodes: Nodes) -> None:
        a, b = await nodes.open("a"), await nodes.open("b")
        await a.enqueue(new(on_success=JobSpec(type="next")))
        (stale,) = await claim_all(a)
        await nodes.expire_leases()
        reaped = await b.reap_expired()
        assert [j.status for j in reaped] == ["pending"]
        (fresh,) = await claim_all(b)
        assert fresh.job.attempts == 2

        assert await a.heartbeat([stale], 30) == [stale.token]
        assert await a.complete(stale, msgspec.Raw(b"1")) is None
        assert await a.fail(stale, "late", None) is None
        assert await a.fail(stale, "late", utcnow()) is None
        assert await a.release(stale) is False
        assert await b.heartbeat([fresh], 30) == []

        outcome = await b.complete(fresh, msgspec.Raw(b'{"ok": true}'))
        assert outcome is not None
        assert outcome.job.status == "done"
        assert msgspec.json.decode(outcome.job.result) == {"ok": True}
        assert [f.parent_id for f in outcome.followups] == [fresh.job.id]
        assert await b.complete(fresh, None) is None  # recorded once
        job = await a.get(fresh.job.id)
        assert job is not None and job.status == "done" and job.attempts == 2

    nodes.run(body)


@pytest.mark.timeout(30)
def test_reaper_counts_the_lost_attempt_then_dead_letters(nodes: Nodes) -> None:
    async def body(nodes: Nodes) -> None:
        a, b = await nodes.open("a"), await nodes.open("b")
        job = (await a.enqueue(new(max_retries=1, on_failure=JobSpec(type="alert")))).job
        for attempt in (1, 2):
            (lease,) = await claim_all(a)
            assert lease.attempt == attempt
            await nodes.expire_leases()
            (reaped,) = await b.reap_expired()
            assert reaped.attempts == attempt
            assert "lease expired (node a lost)" in (reaped.last_error or "")
        assert reaped.status == "failed"
        assert [e.attempt for e in reaped.errors] == [1, 2]
        assert await b.reap_expired() == []
        dead = await a.list_dead(10, 0)
        assert dead.total == 1 and dead.items[0].job_id == job.id
        assert len(dead.items[0].errors) == 2
        chained = await a.list_jobs(JobFilter(type="alert"), 10, 0)
        assert [j.parent_id for j in chained.items] == [job.id]
        kinds = [e.event for e in await b.events(job.id)]
        assert kinds.count("lease_expired") == 2 and kinds[-1] == "dead_lettered"

    nodes.run(body)


@pytest.mark.timeout(30)
def test_cancel_fences_the_running_holder(nodes: Nodes) -> None:
    async def body(nodes: Nodes) -> None:
        a = await nodes.open("a")
        pending = (await a.enqueue(new("p"))).job
        await a.enqueue(new())
        (lease,) = await claim_all(a)
        with pytest.raises(InvalidState):
            await a.cancel(lease.job.id, force=False)
        job, token = await a.cancel(lease.job.id, force=True)
        assert job.status == "cancelled" and token == lease.token
        assert await a.complete(lease, None) is None
        assert await a.heartbeat([lease], 30) == [lease.token]
        assert (await a.cancel(pending.id, force=False))[1] is None
        with pytest.raises(InvalidState):
            await a.cancel(pending.id, force=True)
        with pytest.raises(NotFound):
            await a.cancel(str(uuid.uuid4()), force=True)
        with pytest.raises(NotFound):
            await a.cancel("not-a-uuid", force=True)
        assert await a.get("not-a-uuid") is None

    nodes.run(body)


# -- keys ------------------------------------------------------------------------------


@pytest.mark.timeout(30)
def test_dedupe_key_admits_one_of_forty_concurrent_enqueues_on_two_nodes(nodes: Nodes) -> None:
    async def body(nodes: Nodes) -> None:
        a, b = await nodes.open("a"), await nodes.open("b")
        req = new(dedupe_key="once", dedupe_window_seconds=60)
        results = await asyncio.gather(
            *(s.enqueue(req) for s in [a, b] * 20), return_exceptions=True
        )
        created = [r for r in results if isinstance(r, Enqueued)]
        dupes = [r for r in results if isinstance(r, DuplicateJob)]
        assert len(created) == 1 and len(dupes) == 39
        assert {d.existing_id for d in dupes} == {created[0].job.id}
        # The window counts from the first enqueue, whatever that job's status now.
        (lease,) = await claim_all(a)
        await a.complete(lease, None)
        with pytest.raises(DuplicateJob):
            await b.enqueue(req)
        # After the window a new job is accepted.
        await nodes.sql("UPDATE {s}.dedupe SET expires_at = now() - interval '1 second'")
        assert (await b.enqueue(req)).created

    nodes.run(body)


@pytest.mark.timeout(30)
def test_idempotency_key_across_nodes(nodes: Nodes) -> None:
    async def body(nodes: Nodes) -> None:
        a, b = await nodes.open("a"), await nodes.open("b")
        req = new(idempotency_key="k1", request_hash="h1")
        results = await asyncio.gather(*(s.enqueue(req) for s in [a, b] * 10))
        assert sum(r.created for r in results) == 1
        assert len({r.job.id for r in results}) == 1
        with pytest.raises(IdempotencyMismatch) as info:
            await b.enqueue(new(idempotency_key="k1", request_hash="other"))
        assert info.value.existing_id == results[0].job.id
        # A repeat also wins over a dedupe key the original holds.
        dd = new(idempotency_key="k2", request_hash="h", dedupe_key="d", dedupe_window_seconds=60)
        first = await a.enqueue(dd)
        again = await b.enqueue(dd)
        assert first.created and not again.created and again.job.id == first.job.id
        # Expired keys are replaced.
        await nodes.sql("UPDATE {s}.idempotency SET expires_at = now() - interval '1 second'")
        fresh = await b.enqueue(new(idempotency_key="k1", request_hash="other"))
        assert fresh.created and fresh.job.id != results[0].job.id

    nodes.run(body)


@pytest.mark.timeout(30)
def test_enqueue_many_answers_each_item(nodes: Nodes) -> None:
    async def body(nodes: Nodes) -> None:
        a = await nodes.open("a")
        out = await a.enqueue_many(
            [
                new(dedupe_key="x", dedupe_window_seconds=60),
                new(dedupe_key="x", dedupe_window_seconds=60),
                new(idempotency_key="i", request_hash="1"),
                new(idempotency_key="i", request_hash="2"),
                new(payload=msgspec.Raw(b'{"n": 1}')),
            ]
        )
        kinds = [type(r).__name__ for r in out]
        assert kinds == ["Enqueued", "DuplicateJob", "Enqueued", "IdempotencyMismatch", "Enqueued"]
        assert (await a.stats()).counts["pending"] == 3

    nodes.run(body)


def before_savepoints(store: PostgresStore, hook: Callable[[Any], object]) -> None:
    """Call `hook(job)` before each job `store` enqueues in a savepoint of its own."""
    keyed = store._enqueuer._enqueue_keyed

    async def spy(conn: Any, job: Any) -> Any:
        hook(job)
        return await keyed(conn, job)

    store._enqueuer._enqueue_keyed = spy  # type: ignore[method-assign]


@pytest.mark.timeout(30)
def test_idempotency_keys_of_a_group_are_claimed_in_its_statement(nodes: Nodes) -> None:
    async def body(nodes: Nodes) -> None:
        a = await nodes.open("a")
        original = await a.enqueue(new(idempotency_key="old", request_hash="h"))
        slow: list[str | None] = []  # the idempotency keys that took a savepoint
        before_savepoints(a, lambda job: slow.append(job.idempotency_key))
        out = await a.enqueue_many(
            [
                new(idempotency_key="old", request_hash="h"),  # held before: a repeat
                new(idempotency_key="k1", request_hash="h"),
                new(),
                new(idempotency_key="k2", request_hash="h"),
                new(idempotency_key="k1", request_hash="other"),  # k1 again in the group
                new(idempotency_key="old", request_hash="x"),  # held before: a mismatch
            ]
        )
        repeat, k1, plain, k2, again, mismatch = out
        assert isinstance(repeat, Enqueued) and not repeat.created
        assert repeat.job.id == original.job.id
        for made in (k1, plain, k2):
            assert isinstance(made, Enqueued) and made.created
        assert isinstance(again, IdempotencyMismatch) and again.existing_id == k1.job.id
        assert isinstance(mismatch, IdempotencyMismatch)
        assert mismatch.existing_id == original.job.id
        # the new jobs went in the group's statement, their keys claimed there; only the
        # keys held already (and k1 again) took a savepoint, to tell repeat from mismatch
        assert sorted(slow, key=str) == ["k1", "old", "old"]
        assert (await a.stats()).counts["pending"] == 4
        again_k2 = await a.enqueue(new(idempotency_key="k2", request_hash="h"))
        assert not again_k2.created and again_k2.job.id == k2.job.id

    nodes.run(body)


@pytest.mark.timeout(30)
def test_a_held_key_failing_after_its_group_committed_fails_alone(nodes: Nodes) -> None:
    async def body(nodes: Nodes) -> None:
        a = await nodes.open("a")
        original = await a.enqueue(new(idempotency_key="old", request_hash="h"))
        await a.enqueue(new(idempotency_key="old2", request_hash="h"))

        def refuse(job: Any) -> None:
            if job.request_hash == "boom":
                raise psycopg.errors.DataException("refused")

        before_savepoints(a, refuse)
        # no other keyed job: the statement commits on its own, the held keys after it
        repeat, boom, fresh, plain = await a.enqueue_many(
            [
                new(idempotency_key="old", request_hash="h"),
                new(idempotency_key="old2", request_hash="boom"),
                new(idempotency_key="k", request_hash="h"),
                new(),
            ]
        )
        assert isinstance(repeat, Enqueued) and not repeat.created
        assert repeat.job.id == original.job.id
        assert isinstance(boom, psycopg.errors.DataException)
        for made in (fresh, plain):
            assert isinstance(made, Enqueued) and made.created
            assert (await a.get(made.job.id)) is not None
        assert (await a.stats()).counts["pending"] == 4

    nodes.run(body)


@pytest.mark.timeout(30)
def test_json_is_kept_byte_for_byte_and_nul_characters_are_safe(nodes: Nodes) -> None:
    async def body(nodes: Nodes) -> None:
        a = await nodes.open("a")
        payload = msgspec.Raw(b'{"z": 1,"a":"\\u0000", "n": 1.50}')
        template = JobSpec(type="next", payload=payload)
        req = new(payload=payload, on_failure=template, dedupe_key="k\x00", dedupe_window_seconds=9)
        job = (await a.enqueue(req)).job
        assert bytes(job.payload) == bytes(payload)
        with pytest.raises(DuplicateJob):
            await a.enqueue(req)
        (lease,) = await claim_all(a)
        outcome = await a.fail(lease, "bad\x00byte", None)
        assert outcome is not None and outcome.dead_letter is not None
        assert outcome.job.last_error == "bad\ufffdbyte"
        assert bytes(outcome.dead_letter.job.payload) == bytes(payload)
        assert [bytes(f.payload) for f in outcome.followups] == [bytes(payload)]
        stored = await a.get(job.id)
        assert stored is not None and bytes(stored.payload) == bytes(payload)
        (lease,) = await claim_all(a, "next")
        done = await a.complete(lease, msgspec.Raw(b'[1,  "\\u0000"]'))
        assert done is not None and bytes(done.job.result or b"") == b'[1,  "\\u0000"]'

    nodes.run(body)


# -- group commit ----------------------------------------------------------------------


def spy_groups(part: object, method: str, arg: int = 0) -> list[int]:
    """Record the size of every group `part.<method>` writes (its argument `arg`)."""
    sizes: list[int] = []
    write = getattr(part, method)

    async def spy(*args: Any, **kwargs: Any) -> Any:
        sizes.append(len(args[arg]))
        return await write(*args, **kwargs)

    setattr(part, method, spy)
    return sizes


@pytest.mark.timeout(30)
def test_concurrent_enqueues_share_commits_and_each_is_committed_on_return(nodes: Nodes) -> None:
    async def body(nodes: Nodes) -> None:
        a, b = await nodes.open("a"), await nodes.open("b")
        sizes = spy_groups(a._enqueuer, "_store_jobs")
        seen_by_b: list[bool] = []

        async def enqueue(n: int) -> Enqueued:
            result = await a.enqueue(new(payload=msgspec.Raw(b'{"n": %d}' % n), priority=n % 11))
            seen_by_b.append(await b.get(result.job.id) == result.job)  # committed already
            return result

        results = await asyncio.gather(*(enqueue(n) for n in range(50)))
        assert all(r.created for r in results) and all(seen_by_b) and len(seen_by_b) == 50
        assert sum(sizes) == 50 and sizes[0] == 1 and max(sizes) > 1  # the first went alone
        assert len({r.job.id for r in results}) == 50
        # Enqueue order within a group is kept: seq follows the callers' order.
        seqs = [r.job.seq for r in results]
        assert seqs == sorted(seqs)
        # A lone enqueue still goes at once, in a group of its own.
        await a.enqueue(new())
        assert sizes[-1] == 1 and sum(sizes) == 51

    nodes.run(body)


@pytest.mark.timeout(30)
def test_keys_inside_one_group_are_answered_one_by_one(nodes: Nodes) -> None:
    async def body(nodes: Nodes) -> None:
        a = await nodes.open("a")
        sizes = spy_groups(a._enqueuer, "_store_jobs")
        dd = {"dedupe_key": "d", "dedupe_window_seconds": 60}
        requests = [
            new("lead"),  # written alone; everything below waits for it, then goes together
            new(**dd),
            new(**dd),
            new(idempotency_key="k", request_hash="h"),
            new(idempotency_key="k", request_hash="h"),
            new(idempotency_key="k", request_hash="other"),
            new(idempotency_key="k2", request_hash="h", **dd),  # the dedupe key is taken
            new(),
        ]
        results = await asyncio.gather(*(a.enqueue(r) for r in requests), return_exceptions=True)
        assert sizes == [1, 7]
        lead, first, dupe, idem, again, mismatch, dupe_too, plain = results
        assert isinstance(first, Enqueued) and first.created
        assert isinstance(dupe, DuplicateJob) and dupe.existing_id == first.job.id
        assert isinstance(dupe_too, DuplicateJob) and dupe_too.existing_id == first.job.id
        assert isinstance(idem, Enqueued) and idem.created
        assert isinstance(again, Enqueued) and not again.created and again.job == idem.job
        assert isinstance(mismatch, IdempotencyMismatch) and mismatch.existing_id == idem.job.id
        assert isinstance(lead, Enqueued) and isinstance(plain, Enqueued) and plain.created
        assert (await a.stats()).counts["pending"] == 4
        # The refused ones left nothing behind: k2 is free for a job without the dedupe key.
        assert (await a.enqueue(new(idempotency_key="k2", request_hash="h"))).created

    nodes.run(body)


@pytest.mark.timeout(30)
def test_a_value_the_database_refuses_fails_only_its_own_enqueue(nodes: Nodes) -> None:
    async def body(nodes: Nodes) -> None:
        a = await nodes.open("a")
        bad = new(payload=msgspec.Raw(b"{not json"))
        results = await asyncio.gather(
            a.enqueue(new()),
            a.enqueue(new()),
            a.enqueue(bad),
            a.enqueue(new()),
            return_exceptions=True,
        )
        assert [type(r).__name__ for r in results[:2]] == ["Enqueued", "Enqueued"]
        assert isinstance(results[2], psycopg.DataError)
        assert isinstance(results[3], Enqueued)
        assert (await a.stats()).counts["pending"] == 3

    nodes.run(body)


@pytest.mark.timeout(30)
def test_the_job_an_enqueue_answers_is_the_stored_one(nodes: Nodes) -> None:
    async def body(nodes: Nodes) -> None:
        a = await nodes.open("a")
        template = JobSpec(type="next", payload=msgspec.Raw(b'{"x": [1, 2]}'), max_retries=2)
        rich = new(
            queue="q",
            payload=msgspec.Raw(b'{"b": 1, "a": "\\u00e9"}'),
            priority=9,
            max_retries=7,
            delay_seconds=30.5,
            timeout_seconds=2.5,
            dedupe_key="no window",
            webhook_url="http://example.com/hook\x00",
            on_success=template,
            on_failure=template,
        )
        scheduled = new(run_at=utcnow() + timedelta(hours=1))
        for results in (
            await asyncio.gather(*(a.enqueue(r) for r in (rich, scheduled, rich, scheduled))),
            await a.enqueue_many([rich, scheduled]),
        ):
            for result in results:
                assert isinstance(result, Enqueued)
                assert await a.get(result.job.id) == result.job

    nodes.run(body)


@pytest.mark.timeout(30)
def test_concurrent_completes_share_commits_each_fenced(nodes: Nodes) -> None:
    async def body(nodes: Nodes) -> None:
        a, b = await nodes.open("a"), await nodes.open("b")
        await a.enqueue_many([new() for _ in range(20)] + [new(on_success=JobSpec(type="n"))])
        leases = await claim_all(a)
        stale = leases[0]
        await nodes.sql(
            "UPDATE {s}.jobs SET lease_token = gen_random_uuid() WHERE id = %s", (stale.job.id,)
        )
        sizes = spy_groups(a._outcomes, "_complete_in", arg=1)
        result = msgspec.Raw(b'{"ok": 1}')
        outcomes = await asyncio.gather(
            *(a.complete(x, result) for x in leases), a.complete(leases[1], None)
        )
        assert sum(sizes) == 22 and max(sizes) > 1
        assert outcomes[0] is None  # fenced out
        assert outcomes[-1] is None  # recorded once, even within one group
        for lease, outcome in zip(leases[1:], outcomes[1:-1], strict=True):
            assert outcome is not None and outcome.job.status == "done"
            assert outcome.job == await b.get(lease.job.id)
            assert bytes(outcome.job.result or b"") == b'{"ok": 1}'
        chained = [o for o in outcomes if o is not None and o.followups]
        assert len(chained) == 1 and chained[0].followups[0].type == "n"
        assert chained[0].followups[0] == await b.get(chained[0].followups[0].id)
        assert (await b.stats()).counts == {
            "waiting": 0,
            "pending": 1,
            "claimed": 0,
            "running": 1,
            "done": 20,
            "failed": 0,
            "cancelled": 0,
        }

    nodes.run(body)


@pytest.mark.timeout(30)
def test_a_result_the_database_refuses_fails_only_its_own_complete(nodes: Nodes) -> None:
    async def body(nodes: Nodes) -> None:
        a = await nodes.open("a")
        await a.enqueue_many([new() for _ in range(4)])
        first, *rest = await claim_all(a)
        bad = msgspec.Raw(b"{not json")
        results = await asyncio.gather(
            a.complete(first, None),  # alone; the others wait, then go as one group
            a.complete(rest[0], None),
            a.complete(rest[1], bad),
            a.complete(rest[2], None),
            return_exceptions=True,
        )
        assert isinstance(results[2], psycopg.DataError)
        assert all(isinstance(r, Outcome) for r in results[:2] + results[3:])
        assert (await a.stats()).counts["done"] == 3
        assert await a.complete(rest[1], None) is not None  # still held: recorded now

    nodes.run(body)


@pytest.mark.timeout(10)
def test_a_caller_gone_before_its_group_is_not_written() -> None:
    async def body() -> None:
        gate = asyncio.Event()
        written: list[list[int]] = []

        async def write(items: list[int]) -> list[int | Exception]:
            written.append(items)
            await gate.wait()
            return [i * 10 if i != 3 else ValueError("three") for i in items]

        batcher: Batcher[int, int] = Batcher(write, limit=2)
        calls = [asyncio.ensure_future(batcher.submit(i)) for i in range(6)]
        await wait_for_async(lambda: written, timeout=1, what="the first write")
        assert written == [[0]]  # the first writes at once; the others wait
        calls[2].cancel()
        gate.set()
        results = await asyncio.gather(*calls, return_exceptions=True)
        assert written == [[0], [1, 3], [4, 5]]  # groups of at most `limit`, 2 left out
        assert results[:2] == [0, 10] and isinstance(results[2], asyncio.CancelledError)
        assert isinstance(results[3], ValueError) and results[4:] == [40, 50]
        assert await batcher.submit(7) == 70  # idle again: at once

    asyncio.run(body())


# -- dead letters ----------------------------------------------------------------------


@pytest.mark.timeout(30)
def test_replay_is_atomic(nodes: Nodes) -> None:
    async def body(nodes: Nodes) -> None:
        a, b = await nodes.open("a"), await nodes.open("b", command_timeout=1)
        original = (await a.enqueue(new(payload=msgspec.Raw(b'{"k": [1]}'), priority=8))).job
        (lease,) = await claim_all(a)
        outcome = await a.fail(lease, "boom", None)
        assert outcome is not None and outcome.dead_letter is not None
        dead_id = outcome.dead_letter.id
        stored = await b.get_dead(dead_id)
        assert stored is not None and stored.job.status == "failed"
        assert [e.error for e in stored.errors] == ["boom"]

        # A replay that fails after taking the letter (its insert waits on a lock until
        # the store gives up) leaves the letter in place.
        locker = await psycopg.AsyncConnection.connect(nodes.dsn)
        async with locker:
            await locker.execute(f'LOCK TABLE "{nodes.schema}".jobs IN EXCLUSIVE MODE')
            with pytest.raises(StoreUnavailable):
                await b.replay_dead(dead_id, 5)
            assert await a.get_dead(dead_id) is not None
            await locker.rollback()
        assert await a.get_dead(dead_id) is not None

        replayed = await a.replay_dead(dead_id, 5)
        assert await a.get_dead(dead_id) is None
        assert await a.get(replayed.id) == replayed
        assert replayed.id != original.id and replayed.max_retries == 5
        assert (replayed.type, replayed.priority, replayed.status) == ("t", 8, "pending")
        assert msgspec.json.decode(replayed.payload) == {"k": [1]}
        with pytest.raises(NotFound):
            await b.replay_dead(dead_id, 5)
        assert "replayed" in [e.event for e in await a.events(replayed.id)]

        # Both nodes replaying the same letter at once: exactly one succeeds.
        (lease,) = await claim_all(a)
        await a.fail(lease, "again", None)
        (letter,) = (await a.list_dead(10, 0)).items
        results = await asyncio.gather(
            a.replay_dead(letter.id, 1), b.replay_dead(letter.id, 1), return_exceptions=True
        )
        assert sorted(type(r).__name__ for r in results) == ["Job", "NotFound"]
        assert await a.purge_dead(letter.id) is False

    nodes.run(body)


# -- waking ----------------------------------------------------------------------------


@pytest.mark.timeout(30)
def test_notify_wakes_the_other_node(nodes: Nodes) -> None:
    async def body(nodes: Nodes) -> None:
        a, b = await nodes.open("a"), await nodes.open("b")
        assert b.next_due_at() is None
        woke = asyncio.Event()
        nodes.waker(b).target = woke.set
        start = time.monotonic()
        await a.enqueue(new())
        await asyncio.wait_for(woke.wait(), timeout=1.0)
        assert time.monotonic() - start < 1.0

        woke.clear()
        due = (await a.enqueue(new(delay_seconds=600))).job.run_at
        await asyncio.wait_for(woke.wait(), timeout=1.0)
        assert b.next_due_at() == due

    nodes.run(body)


@pytest.mark.timeout(30)
def test_the_longest_schema_name_still_notifies(nodes: Nodes) -> None:
    """LISTEN truncates, and pg_notify refuses, a channel over 63 bytes: at the longest
    name allowed the two must still meet."""

    async def body(nodes: Nodes) -> None:
        nodes.schema = nodes.schema.ljust(stores.MAX_SCHEMA_NAME, "x")
        try:
            a, b = await nodes.open("a"), await nodes.open("b")
            woke = asyncio.Event()
            nodes.waker(b).target = woke.set
            await a.enqueue(new())
            await asyncio.wait_for(woke.wait(), timeout=2.0)
        finally:
            for store in nodes.stores:
                await store.close()
            nodes.stores.clear()
            await nodes.sql(f'DROP SCHEMA IF EXISTS "{nodes.schema}" CASCADE')

    nodes.run(body)


@pytest.mark.timeout(30)
def test_store_recovers_after_its_connections_are_killed(nodes: Nodes) -> None:
    async def body(nodes: Nodes) -> None:
        a, b = await nodes.open("a"), await nodes.open("b", command_timeout=3)
        await nodes.sql(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE application_name = 'goqueue/b'"
        )
        for _ in range(5):  # each either works or says the store is unavailable
            with contextlib.suppress(StoreUnavailable):
                await b.enqueue(new())
        await wait_until(b.ping, timeout=5)
        assert (await b.enqueue(new())).created
        # The listener reconnected too.
        woke = asyncio.Event()
        nodes.waker(b).target = woke.set

        async def woken_by_a() -> bool:
            await a.enqueue(new())
            try:
                await asyncio.wait_for(woke.wait(), timeout=0.2)
            except TimeoutError:
                return False
            return True

        await wait_until(woken_by_a, timeout=10)

    nodes.run(body)


@pytest.mark.timeout(20)
def test_unreachable_database_is_store_unavailable_not_a_hang() -> None:
    async def body() -> None:
        store = PostgresStore("postgresql://postgres@127.0.0.1:1/test", "n", command_timeout=2)
        start = time.monotonic()
        with pytest.raises(StoreUnavailable):
            await store.open()
        assert time.monotonic() - start < 5
        with pytest.raises(StoreUnavailable):
            await store.enqueue(new())
        assert await store.ping() is False
        await store.close()

    asyncio.run(body())


# -- audit trail -----------------------------------------------------------------------


Seen = tuple[str, int, str, str | None]  # an event as read back: kind, attempt, node, detail


class Trails:
    """Each job's audit trail as another client sees it: read on a connection of its own,
    never through a store (so nothing a store holds or flushes can help)."""

    def __init__(self, nodes: Nodes) -> None:
        self.nodes = nodes

    async def __call__(self, job_id: str) -> list[Seen]:
        rows = await self.nodes.sql(
            "SELECT event, attempt, node, detail FROM {s}.events WHERE job_id = %s ORDER BY at, id",
            (job_id,),
        )
        return [(r[0], r[1], r[2], r[3]) for r in rows]


@pytest.mark.timeout(30)
def test_every_event_is_committed_when_the_call_that_made_it_returns(nodes: Nodes) -> None:
    """Each check runs right after the call returns, with no flush and no wait: an event
    written behind the change (as before) would not be there yet."""

    async def body(nodes: Nodes) -> None:
        a, b = await nodes.open("a"), await nodes.open("b")
        trail = Trails(nodes)
        job = (await a.enqueue(new(max_retries=1, on_failure=JobSpec(type="alert")))).job
        expected: list[Seen] = [("enqueued", 0, "a", None)]
        assert await trail(job.id) == expected
        (lease,) = await claim_all(b)
        expected.append(("started", 1, "b", None))
        assert await trail(job.id) == expected
        retry_at = utcnow() - timedelta(seconds=1)
        assert await b.fail(lease, "oops", retry_at) is not None
        expected += [("attempt_failed", 1, "b", "oops"), ("retry_scheduled", 1, "b", None)]
        seen = await trail(job.id)
        assert seen[:-1] == expected[:-1] and seen[-1][:3] == expected[-1][:3]
        assert seen[-1][3] == retry_at.isoformat()  # the time it is due again
        expected[-1] = seen[-1]

        (lease,) = await claim_all(a)
        await nodes.expire_leases()
        (reaped,) = await b.reap_expired()
        assert reaped.status == "failed"  # its last attempt: dead-lettered
        (letter,) = (await b.list_dead(10, 0)).items
        lost = "lease expired (node a lost)"
        expected += [
            ("started", 2, "a", None),
            ("lease_expired", 2, "b", lost),
            ("attempt_failed", 2, "b", lost),
            ("dead_lettered", 2, "b", letter.id),
        ]
        assert await trail(job.id) == expected
        (alert,) = (await b.list_jobs(JobFilter(type="alert"), 10, 0)).items
        assert await trail(alert.id) == [("enqueued", 0, "b", f"after {job.id}")]
        assert [(e.event, e.attempt, e.node, e.detail) for e in await a.events(job.id)] == expected

        replayed = await a.replay_dead(letter.id, 3)
        assert await trail(replayed.id) == [
            ("enqueued", 0, "a", None),
            ("replayed", 0, "a", job.id),
        ]
        cancelled, _ = await b.cancel(replayed.id, force=False)
        assert cancelled.status == "cancelled"
        assert (await trail(replayed.id))[-1] == ("cancelled", 0, "b", None)

        (lease,) = await claim_all(a, "alert")
        assert await a.release(lease)
        (lease,) = await claim_all(b, "alert")
        assert await b.fail(lease, "no", None) is not None  # max_retries 3: still buried
        assert [e[0] for e in await trail(alert.id)] == [
            "enqueued",
            "started",
            "released",
            "started",
            "attempt_failed",
            "dead_lettered",
        ]
        assert (await trail(alert.id))[2][1] == 0  # released: the attempt is not counted

        # Group-committed enqueues and completes: each call's event is there on return.
        async def enqueue_then_look(n: int) -> None:
            done = await a.enqueue(new(payload=msgspec.Raw(b"%d" % n)))
            assert await trail(done.job.id) == [("enqueued", 0, "a", None)]

        await asyncio.gather(*(enqueue_then_look(n) for n in range(20)))
        await a.enqueue_many([new(), new(queue="q2")])

        async def complete_then_look(lease: Lease) -> None:
            assert await a.complete(lease, None) is not None
            assert (await trail(lease.job.id))[-1] == ("succeeded", 1, "a", None)

        leases = await claim_all(a)
        assert len(leases) == 22
        await asyncio.gather(*(complete_then_look(lease) for lease in leases))
        assert [e[0] for e in await trail(leases[0].job.id)] == ["enqueued", "started", "succeeded"]

    nodes.run(body)


@pytest.mark.timeout(30)
def test_a_change_whose_event_cannot_be_written_is_not_made(nodes: Nodes) -> None:
    """Event and change share one transaction: with the events table gone, neither the
    change nor its event commits; once it is back both do."""

    async def body(nodes: Nodes) -> None:
        a = await nodes.open("a")
        await a.enqueue(new())
        (lease,) = await claim_all(a)
        await nodes.sql("ALTER TABLE {s}.events RENAME TO events_off")
        with pytest.raises(psycopg.errors.UndefinedTable):
            await a.complete(lease, None)
        with pytest.raises(psycopg.errors.UndefinedTable):
            await a.enqueue(new())
        with pytest.raises(psycopg.errors.UndefinedTable):
            await a.fail(lease, "no", None)
        assert (await a.stats()).counts == {
            "waiting": 0,
            "pending": 0,
            "claimed": 0,
            "running": 1,
            "done": 0,
            "failed": 0,
            "cancelled": 0,
        }
        assert await a.heartbeat([lease], 30) == []  # still held
        await nodes.sql("ALTER TABLE {s}.events_off RENAME TO events")
        outcome = await a.complete(lease, None)
        assert outcome is not None and outcome.job.status == "done"
        trail = await Trails(nodes)(lease.job.id)
        assert [e[0] for e in trail] == ["enqueued", "started", "succeeded"]

    nodes.run(body)


@pytest.mark.timeout(30)
def test_stats_count_every_status(nodes: Nodes) -> None:
    async def body(nodes: Nodes) -> None:
        a = await nodes.open("a")
        await a.enqueue(new(priority=10))
        await a.enqueue(new(queue="q2", priority=0))
        (lease, _) = await a.claim(2, None, {"t": 2})
        await a.complete(lease, None)
        await a.enqueue(new(queue="q2", priority=7, delay_seconds=60))
        stats = await a.stats()
        assert stats.counts == {
            "waiting": 0,
            "pending": 1,
            "claimed": 0,
            "running": 1,
            "done": 1,
            "failed": 0,
            "cancelled": 0,
        }
        assert stats.dead_letters == 0
        assert stats.queues == {"q2": {"7": 1}}
        q2 = await a.queue_stats("q2")
        assert q2.depth_by_priority == {"7": 1} and q2.counts["running"] == 1
        empty = await a.queue_stats("never")
        assert set(empty.counts.values()) == {0} and empty.depth_by_priority == {}
        page = await a.list_jobs(JobFilter(queue="q2"), 1, 0)
        assert page.total == 2 and page.items[0].priority == 7

    nodes.run(body)
