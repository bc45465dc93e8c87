"""The store contract: the same tests, run against the memory and PostgreSQL stores."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import msgspec
import pytest
from goqueue.supervisor.common.errors import (
    DuplicateJob,
    IdempotencyMismatch,
    InvalidState,
    NotFound,
)
from goqueue.supervisor.common.jobs import JobSpec
from goqueue.supervisor.common.reads import JobFilter
from goqueue.supervisor.store.base import NewJob, StartNow, Store

pytestmark = pytest.mark.timeout(30)

ALL = {"a": 100, "b": 100}


def new(type: str = "a", *, start: bool = False, **fields: object) -> NewJob:
    """An enqueue request with resolved defaults (`start`: a worker that runs `a` and `b`
    jobs, in every queue, waits for it)."""
    retries = fields.pop("max_retries", 3)
    idem = fields.pop("idempotency_key", None)
    digest = fields.pop("request_hash", None)
    spec = msgspec.json.decode(msgspec.json.encode({"type": type, **fields}), type=JobSpec)
    waiting = StartNow(frozenset({"a", "b"})) if start else None
    return NewJob(
        spec=spec, max_retries=retries, idempotency_key=idem, request_hash=digest, start=waiting
    )


async def claim_one(store: Store, slots: dict[str, int] | None = None):
    leases = await store.claim(1, None, slots or ALL)
    assert len(leases) == 1
    return leases[0]


async def test_enqueue_then_get_and_list_newest_first(open_store) -> None:
    async with open_store() as store:
        first = (await store.enqueue(new("a", payload={"n": 1}))).job
        second = (await store.enqueue(new("b", queue="q2"))).job
        got = await store.get(first.id)
        assert got is not None and got.status == "pending" and got.attempts == 0
        assert msgspec.json.decode(got.payload) == {"n": 1}
        page = await store.list_jobs(JobFilter(), 10, 0)
        assert [j.id for j in page.items] == [second.id, first.id] and page.total == 2
        only_b = await store.list_jobs(JobFilter(type="b"), 10, 0)
        assert [j.id for j in only_b.items] == [second.id]
        by_queue = await store.list_jobs(JobFilter(queue="q2", status="pending"), 10, 0)
        assert by_queue.total == 1
        assert (await store.list_jobs(JobFilter(), 1, 1)).items[0].id == first.id
        assert await store.get("00000000-0000-0000-0000-000000000000") is None


async def test_claim_orders_by_priority_then_fifo(open_store) -> None:
    async with open_store() as store:
        ids = []
        for priority in (0, 5, 10, 5, 10, 0):
            ids.append(((await store.enqueue(new("a", priority=priority))).job.id, priority))
        leases = await store.claim(10, None, ALL)
        got = [lease.job.id for lease in leases]
        expected = [i for i, _ in sorted(ids, key=lambda x: -x[1])]  # stable: FIFO kept
        assert got == expected
        assert all(lease.job.status == "running" and lease.job.attempts == 1 for lease in leases)
        assert await store.claim(10, None, ALL) == []


async def test_claim_respects_type_slots_queues_and_pauses(open_store) -> None:
    async with open_store() as store:
        for _ in range(3):
            await store.enqueue(new("a"))
        await store.enqueue(new("b", queue="other"))
        assert len(await store.claim(10, None, {"a": 2})) == 2
        assert await store.claim(10, frozenset({"default"}), {"b": 5}) == []
        await store.set_paused("other", True)
        assert (await store.queue_stats("other")).paused
        assert not (await store.queue_stats("default")).paused
        assert await store.claim(10, None, {"b": 5}) == []
        await store.set_paused("other", False)
        assert len(await store.claim(10, frozenset({"other"}), {"b": 5})) == 1
        assert len(await store.claim(10, None, {"a": 5})) == 1


async def test_delayed_jobs_are_not_claimed_until_due(open_store, clock) -> None:
    async with open_store() as store:
        delayed = (await store.enqueue(new("a", delay_seconds=0.4))).job
        assert await store.claim(1, None, ALL) == []
        due = store.next_due_at()
        assert due is not None and due <= delayed.run_at + timedelta(seconds=0.01)
        await clock.advance(0.5)
        assert (await claim_one(store)).job.id == delayed.id


async def test_a_job_due_since_the_last_claim_looked_is_answered_once(open_store, clock) -> None:
    async with open_store() as store:
        late = (await store.enqueue(new("a", delay_seconds=0.3))).job
        assert await store.claim(1, None, ALL) == []  # not due yet when it looked
        await clock.advance(0.4)  # due now, and no claim since (no worker was free)
        due = store.next_due_at()  # past: a timer for it wakes the dispatcher at once
        assert due is not None and abs((due - late.run_at).total_seconds()) < 0.01
        assert store.next_due_at() is None  # once: no spinning on a time past
        assert (await claim_one(store)).job.id == late.id


async def test_complete_stores_result_and_chains_on_success(open_store) -> None:
    async with open_store() as store:
        job = (await store.enqueue(new("a", on_success={"type": "b", "payload": 7}))).job
        lease = await claim_one(store)
        outcome = await store.complete(lease, msgspec.Raw(b'{"ok":true}'))
        assert outcome is not None and outcome.job.status == "done"
        assert [f.parent_id for f in outcome.followups] == [job.id]
        stored = await store.get(job.id)
        assert msgspec.json.decode(stored.result) == {"ok": True}
        assert stored.finished_at is not None
        child = await store.get(outcome.followups[0].id)
        assert child.type == "b" and child.status == "pending"
        assert await store.complete(lease, None) is None  # only once


async def test_fail_with_retry_then_dead_letter_and_on_failure(open_store, clock) -> None:
    async with open_store() as store:
        job = (await store.enqueue(new("a", max_retries=1, on_failure={"type": "b"}))).job
        lease = await claim_one(store)
        retry_at = clock.now() + timedelta(seconds=0.2)
        outcome = await store.fail(lease, "boom 1", retry_at)
        assert outcome.job.status == "pending" and outcome.followups == []
        assert await store.claim(1, None, ALL) == []  # not due yet
        await clock.advance(0.3)
        lease = await claim_one(store)
        assert lease.job.attempts == 2
        outcome = await store.fail(lease, "boom 2", None)
        assert outcome.job.status == "failed"
        assert outcome.dead_letter is not None and outcome.dead_letter.job_id == job.id
        assert [f.type for f in outcome.followups] == ["b"]
        assert [e.error for e in outcome.dead_letter.errors] == ["boom 1", "boom 2"]
        stored = await store.get(job.id)
        assert stored.last_error == "boom 2" and stored.attempts == 2


async def test_stale_lease_cannot_write(open_store) -> None:
    async with open_store() as store:
        await store.enqueue(new("a"))
        lease = await claim_one(store)
        stale = msgspec.structs.replace(lease, token="00000000-0000-0000-0000-000000000001")
        assert await store.complete(stale, None) is None
        assert await store.fail(stale, "x", None) is None
        assert await store.release(stale) is False
        assert (await store.get(lease.job.id)).status == "running"


async def test_release_does_not_count_the_attempt(open_store) -> None:
    async with open_store() as store:
        job = (await store.enqueue(new("a"))).job
        lease = await claim_one(store)
        assert await store.release(lease) is True
        assert (await store.get(job.id)).status == "pending"
        again = await claim_one(store)
        assert again.job.attempts == 1


async def test_cancel_rules(open_store) -> None:
    async with open_store() as store:
        pending = (await store.enqueue(new("a"))).job
        cancelled, token = await store.cancel(pending.id, False)
        assert cancelled.status == "cancelled" and token is None
        with pytest.raises(InvalidState):
            await store.cancel(pending.id, True)
        with pytest.raises(NotFound):
            await store.cancel("00000000-0000-0000-0000-000000000000", False)
        assert await store.claim(5, None, ALL) == []
        running = (await store.enqueue(new("a"))).job
        lease = await claim_one(store)
        with pytest.raises(InvalidState):
            await store.cancel(running.id, False)
        job, token = await store.cancel(running.id, True)
        assert job.status == "cancelled" and token == lease.token
        assert await store.heartbeat([lease], 30) == [lease.token]
        assert await store.complete(lease, None) is None


async def test_dedupe_window(open_store, clock) -> None:
    async with open_store() as store:
        first = (await store.enqueue(new("a", dedupe_key="k", dedupe_window_seconds=0.3))).job
        with pytest.raises(DuplicateJob) as dup:
            await store.enqueue(new("a", dedupe_key="k", dedupe_window_seconds=0.3))
        assert dup.value.existing_id == first.id
        await store.cancel(first.id, False)  # the window holds whatever the status
        with pytest.raises(DuplicateJob):
            await store.enqueue(new("a", dedupe_key="k", dedupe_window_seconds=0.3))
        await clock.advance(0.4)
        assert (await store.enqueue(new("a", dedupe_key="k", dedupe_window_seconds=0.3))).created


async def test_idempotency_keys(open_store) -> None:
    async with open_store() as store:
        first = await store.enqueue(new("a", idempotency_key="i1", request_hash="h1"))
        again = await store.enqueue(new("a", idempotency_key="i1", request_hash="h1"))
        assert first.created and not again.created and again.job.id == first.job.id
        with pytest.raises(IdempotencyMismatch):
            await store.enqueue(new("b", idempotency_key="i1", request_hash="h2"))
        assert (await store.list_jobs(JobFilter(), 10, 0)).total == 1


async def test_dead_letters_list_get_replay_purge(open_store) -> None:
    async with open_store() as store:
        for _ in range(2):
            await store.enqueue(new("a", max_retries=0))
            lease = await claim_one(store)
            await store.fail(lease, "fatal", None)
        page = await store.list_dead(10, 0)
        assert page.total == 2
        letter = page.items[0]
        assert (await store.get_dead(letter.id)).job_id == letter.job_id
        replayed = await store.replay_dead(letter.id, 2)
        assert replayed.status == "pending" and replayed.id != letter.job_id
        assert replayed.max_retries == 2
        assert await store.get_dead(letter.id) is None
        with pytest.raises(NotFound):
            await store.replay_dead(letter.id, 2)
        other = page.items[1]
        assert await store.purge_dead(other.id) is True
        assert await store.purge_dead(other.id) is False
        assert (await store.list_dead(10, 0)).total == 0


async def test_expired_lease_is_reaped_and_counted(open_store, clock) -> None:
    async with open_store(lease_seconds=0.2) as store:
        job = (await store.enqueue(new("a", max_retries=1))).job
        await claim_one(store)
        await clock.advance(0.35)
        touched = await store.reap_expired()
        assert [j.id for j in touched] == [job.id]
        back = await store.get(job.id)
        assert back.status == "pending" and "lease expired" in back.last_error
        second = await claim_one(store)
        assert second.job.attempts == 2
        await clock.advance(0.35)
        await store.reap_expired()
        assert (await store.get(job.id)).status == "failed"
        assert (await store.list_dead(10, 0)).total == 1


async def test_heartbeat_keeps_a_lease_alive(open_store, clock) -> None:
    async with open_store(lease_seconds=0.3) as store:
        await store.enqueue(new("a"))
        lease = await claim_one(store)
        for _ in range(4):
            await clock.advance(0.1)
            assert await store.heartbeat([lease], 0.3) == []
        assert await store.reap_expired() == []
        assert (await store.complete(lease, None)) is not None


async def test_stats_and_queue_stats(open_store) -> None:
    async with open_store() as store:
        await store.enqueue(new("a", priority=10))
        await store.enqueue(new("a", priority=10, queue="mail"))
        await store.enqueue(new("b", priority=0, queue="mail"))
        await claim_one(store, {"a": 1})
        stats = await store.stats()
        assert stats.counts["pending"] == 2 and stats.counts["running"] == 1
        assert stats.counts["done"] == 0
        assert stats.queues["mail"] == {"10": 1, "0": 1}
        mail = await store.queue_stats("mail")
        assert mail.counts["pending"] == 2 and mail.depth_by_priority == {"10": 1, "0": 1}
        empty = await store.queue_stats("nothing")
        assert sum(empty.counts.values()) == 0


async def test_queue_depths_are_bounded_and_emptied_queues_vanish(open_store) -> None:
    async with open_store() as store:
        for queue, priority, n in (("big", 10, 3), ("big", 0, 1), ("mid", 5, 2), ("one", 5, 1)):
            for _ in range(n):
                await store.enqueue(new("a", queue=queue, priority=priority))
        await store.set_paused("idle", True)
        depths = await store.queue_depths(2)
        assert depths.top == {"big": {"10": 3, "0": 1}, "mid": {"5": 2}}
        assert depths.other == {"5": 1} and depths.queues == 3 and depths.pending == 7
        assert await store.queue_names(100) == {"big", "mid", "one", "idle"}
        assert len(await store.queue_names(1)) >= 1
        lease = await claim_one(store, {"a": 1})  # the deepest queue's best job: big, 10
        assert lease.job.queue == "big"
        everything = await store.queue_depths(100)
        assert everything.other == {} and everything.top["big"] == {"10": 2, "0": 1}
        for job in (await store.list_jobs(JobFilter(status="pending"), 100, 0)).items:
            await store.cancel(job.id, False)
        emptied = await store.queue_depths(100)
        assert emptied.top == {} and emptied.other == {} and emptied.pending == 0
        assert emptied.queues == 0
        await store.set_paused("idle", False)
        assert await store.queue_names(100) == frozenset()


async def test_events_trail(open_store) -> None:
    async with open_store() as store:
        job = (await store.enqueue(new("a"))).job
        lease = await claim_one(store)
        await store.complete(lease, None)
        kinds = [e.event for e in await store.events(job.id)]
        assert kinds == ["enqueued", "started", "succeeded"]


async def test_waker_is_called_on_enqueue(open_store) -> None:
    woken = asyncio.Event()
    async with open_store(wake=woken.set) as store:
        await store.enqueue(new("a"))
        await asyncio.wait_for(woken.wait(), 5)


async def test_enqueue_many_answers_each(open_store) -> None:
    async with open_store() as store:
        results = await store.enqueue_many(
            [
                new("a", dedupe_key="x", dedupe_window_seconds=60),
                new("a", dedupe_key="x", dedupe_window_seconds=60),
                new("b"),
            ]
        )
        assert results[0].created and isinstance(results[1], DuplicateJob)
        assert results[1].existing_id == results[0].job.id
        assert results[2].created
        assert (await store.list_jobs(JobFilter(), 10, 0)).total == 2


async def test_register_node_and_known_types(open_store) -> None:
    async with open_store() as store:
        await store.register_node({"a": 2, "b": None})
        assert {"a", "b"} <= await store.known_types()


async def test_prune_deletes_old_finished_jobs_and_their_trails_only(open_store, clock) -> None:
    async with open_store() as store:
        done = (await store.enqueue(new("a"))).job
        await store.complete(await claim_one(store), None)
        dead = (await store.enqueue(new("a", max_retries=0))).job
        await store.fail(await claim_one(store), "fatal", None)
        pending = (await store.enqueue(new("b"))).job
        assert await store.prune(clock.now() - timedelta(hours=1), 100) == 0
        await clock.advance(0.05)
        assert await store.prune(clock.now(), 1) == 1  # the limit holds, oldest first
        assert await store.get(done.id) is None and await store.events(done.id) == []
        assert await store.prune(clock.now(), 100) == 1
        assert await store.get(dead.id) is None
        assert (await store.get(pending.id)).status == "pending"
        assert (await store.list_dead(10, 0)).total == 1  # dead letters stay
        assert (await store.stats()).counts["done"] == 0


async def test_a_claim_starts_the_best_and_holds_the_rest_claimed(open_store) -> None:
    async with open_store() as store:
        best = (await store.enqueue(new("a", priority=9))).job
        rest = [(await store.enqueue(new("a"))).job for _ in range(2)]
        leases = await store.claim(3, None, ALL, start=1)
        assert [x.job.id for x in leases] == [best.id, rest[0].id, rest[1].id]
        started, held = leases[0], leases[1]
        assert (started.job.status, started.job.attempts) == ("running", 1)
        for lease in leases[1:]:
            job = await store.get(lease.job.id)
            assert (job.status, job.attempts, job.started_at) == ("claimed", 0, None)
            assert (lease.job.status, lease.job.attempts) == ("claimed", 0)
        assert (await store.stats()).counts["claimed"] == 2
        assert await store.complete(held, None) is None  # not started: nothing to record
        assert await store.heartbeat(leases, 30) == []
        begun = await store.start(held)
        assert begun is not None and (begun.job.status, begun.job.attempts) == ("running", 1)
        assert begun.token == held.token and begun.job.started_at is not None
        assert await store.get(held.job.id) == begun.job
        assert await store.start(held) is None  # started once
        assert [e.event for e in await store.events(held.job.id)] == ["enqueued", "started"]
        assert (await store.complete(begun, None)) is not None
        last = leases[2]
        assert await store.release(last) is True
        again = await store.get(last.job.id)
        assert (again.status, again.attempts) == ("pending", 0)


async def test_a_claim_starts_the_jobs_at_its_head_of_the_types_it_may_start(
    open_store,
) -> None:
    async with open_store() as store:
        jobs = [(await store.enqueue(new(t, priority=p))).job for t, p in
                (("a", 9), ("a", 8), ("b", 7), ("a", 6))]  # fmt: skip
        leases = await store.claim(4, None, ALL, 0, frozenset({"a"}))
        assert [x.job.id for x in leases] == [job.id for job in jobs]
        statuses = [(x.job.status, (await store.get(x.job.id)).status) for x in leases]
        # the "a" jobs before the first "b" start, and none behind it
        assert statuses == [(s, s) for s in ["running", "running", "claimed", "claimed"]]
        for job in jobs:
            await store.enqueue(new(job.type))
        again = await store.claim(4, None, ALL, 0, frozenset({"a", "b"}))
        assert {x.job.status for x in again} == {"running"}  # every type may start: all do
        assert all(x.job.attempts == 1 for x in again)


async def test_reaped_claims_keep_their_place_and_lost_attempts_wait_their_backoff(
    open_store, clock
) -> None:
    async with open_store(lease_seconds=0.2) as store:
        running = (await store.enqueue(new("a", max_retries=0))).job
        claimed = (await store.enqueue(new("a", max_retries=0))).job
        before = (await store.get(claimed.id)).run_at
        behind = (await store.enqueue(new("a"))).job
        await store.claim(2, None, ALL, start=1)
        await clock.advance(0.35)
        touched = await store.reap_expired(lambda attempt: 3600.0 * attempt)
        assert sorted(j.id for j in touched) == sorted([running.id, claimed.id])
        back = await store.get(claimed.id)
        assert (back.status, back.attempts, back.run_at) == ("pending", 0, before)
        assert (await store.get(running.id)).status == "failed"  # its only attempt was lost
        again = await store.claim(5, None, ALL)
        assert [x.job.id for x in again] == [claimed.id, behind.id]  # in its place


async def test_a_lost_attempt_is_retried_after_the_delay_given(open_store, clock) -> None:
    async with open_store(lease_seconds=0.2) as store:
        job = (await store.enqueue(new("a", max_retries=2))).job
        await claim_one(store)
        await clock.advance(0.35)
        await store.reap_expired(lambda attempt: 3600.0 * attempt)
        back = await store.get(job.id)
        assert back.status == "pending" and back.attempts == 1
        assert (back.run_at - back.updated_at).total_seconds() > 3000
        assert await store.claim(5, None, ALL) == []


async def test_a_claimed_job_is_cancelled_without_force(open_store) -> None:
    async with open_store() as store:
        await store.enqueue(new("a"))
        (held,) = await store.claim(1, None, ALL, start=0)
        job, token = await store.cancel(held.job.id, False)
        assert job.status == "cancelled" and token == held.token
        assert await store.start(held) is None


async def test_an_enqueue_a_worker_waits_for_is_stored_started(open_store) -> None:
    async with open_store() as store:
        await store.register_node({"a": None, "b": 1})
        waiting = (await store.enqueue(new("a", priority=1))).job  # less urgent: behind
        enqueued = await store.enqueue(new("a", start=True))
        lease = enqueued.lease
        assert enqueued.created and lease is not None and lease.owner == store.node_id
        assert (lease.job.status, lease.job.attempts) == ("running", 1)
        stored = await store.get(lease.job.id)
        assert stored is not None and (stored.status, stored.attempts) == ("running", 1)
        assert stored.started_at is not None and stored == lease.job
        assert [e.event for e in await store.events(stored.id)] == ["enqueued", "started"]
        assert [e.attempt for e in await store.events(stored.id)] == [0, 1]
        assert await store.heartbeat([lease], 30) == []
        assert [x.job.id for x in await store.claim(5, None, ALL)] == [waiting.id]
        assert (await store.complete(lease, msgspec.Raw(b"1"))) is not None
        assert (await store.get(stored.id)).status == "done"


async def test_an_idempotent_enqueue_a_worker_waits_for_is_stored_started_once(
    open_store,
) -> None:
    async with open_store() as store:
        await store.register_node({"a": None, "b": None})
        first = await store.enqueue(new("a", start=True, idempotency_key="k", request_hash="h"))
        lease = first.lease
        assert first.created and lease is not None and lease.job.status == "running"
        stored = await store.get(lease.job.id)
        assert stored is not None and stored == lease.job
        assert [e.event for e in await store.events(stored.id)] == ["enqueued", "started"]
        again = await store.enqueue(new("a", start=True, idempotency_key="k", request_hash="h"))
        assert not again.created and again.lease is None and again.job.id == stored.id
        with pytest.raises(IdempotencyMismatch):
            await store.enqueue(new("b", start=True, idempotency_key="k", request_hash="x"))
        await store.set_paused("held", True)
        held = await store.enqueue(
            new("a", start=True, queue="held", idempotency_key="k2", request_hash="h")
        )
        assert held.created and held.lease is None and held.job.status == "pending"
        not_waited = await store.enqueue(new("a", idempotency_key="k3", request_hash="h"))
        assert not_waited.created and not_waited.lease is None
        assert (await store.list_jobs(JobFilter(), 10, 0)).total == 3
        assert (await store.get(stored.id)).attempts == 1  # its repeat started nothing
        assert [x.job.id for x in await store.claim(5, None, ALL)] == [not_waited.job.id]


async def test_an_enqueue_to_start_stays_pending_when_it_may_not_run_now(open_store) -> None:
    async with open_store() as store:
        await store.register_node({"a": None, "b": 1})
        await store.set_paused("held", True)
        refused = [
            await store.enqueue(new("a", start=True, delay_seconds=60)),  # not due
            await store.enqueue(new("a", start=True, queue="held")),  # paused
            await store.enqueue(new("b", start=True)),  # a limit on its type
        ]
        for enqueued in refused:
            assert enqueued.created and enqueued.lease is None
            stored = await store.get(enqueued.job.id)
            assert stored is not None and (stored.status, stored.attempts) == ("pending", 0)
            assert [e.event for e in await store.events(stored.id)] == ["enqueued"]
        assert [x.job.id for x in await store.claim(5, None, ALL)] == [refused[2].job.id]


async def test_an_enqueue_to_start_waits_behind_a_due_job_the_worker_could_run(
    open_store,
) -> None:
    async with open_store() as store:
        await store.register_node({"a": None, "b": None})
        ahead = (await store.enqueue(new("b", priority=5))).job
        if (
            not store.traits.sees_ahead
        ):  # in memory the dispatcher's last claim tells, not the store
            assert (await store.enqueue(new("a", start=True))).lease is not None
            return
        spec = new("a").spec
        other = StartNow(frozenset({"a"}))  # a worker that cannot run `b` jobs
        started = await store.enqueue(NewJob(spec=spec, max_retries=3, start=other))
        assert started.lease is not None
        elsewhere = StartNow(frozenset({"a", "b"}), frozenset({"q2"}))  # nor that queue
        spec_q2 = new("a", queue="q2").spec
        started = await store.enqueue(NewJob(spec=spec_q2, max_retries=3, start=elsewhere))
        assert started.lease is not None
        behind = await store.enqueue(new("a", start=True, priority=5))
        assert behind.lease is None and behind.job.status == "pending"
        await store.set_paused("default", True)  # a paused job is not ahead
        paused_ahead = await store.enqueue(new("a", start=True, queue="q2"))
        assert paused_ahead.lease is not None
        await store.set_paused("default", False)
        claimed = await store.claim(5, None, ALL)
        assert [x.job.id for x in claimed] == [ahead.id, behind.job.id]


# -- late outcomes: written after the lease was reaped, if no later attempt started --------


async def reaped(store: Store, clock, retry_delay=None, **fields: object):
    """A job claimed, its lease run out and reaped: its lease (the late outcome's) and id."""
    job = (await store.enqueue(new("a", **fields))).job
    lease = await claim_one(store)
    await clock.advance(0.35)
    assert [j.id for j in await store.reap_expired(retry_delay)] == [job.id]
    return lease, job.id


async def test_a_late_success_replaces_the_dead_letter_its_reaping_made(open_store, clock) -> None:
    async with open_store(lease_seconds=0.2) as store:
        lease, job_id = await reaped(store, clock, max_retries=0)
        assert (await store.get(job_id)).status == "failed"
        assert (await store.list_dead(10, 0)).total == 1
        outcome = await store.complete(lease, msgspec.Raw(b'"late"'))
        assert outcome is not None and outcome.job.status == "done"
        job = await store.get(job_id)
        assert job.status == "done" and msgspec.json.decode(job.result) == "late"
        assert job.attempts == 1 and not job.errors and job.last_error is None
        assert job.finished_at is not None
        assert (await store.list_dead(10, 0)).total == 0
        kinds = [e.event for e in await store.events(job_id)]
        assert kinds[-2:] == ["late_outcome", "succeeded"]
        assert kinds.index("lease_expired") < kinds.index("late_outcome")
        assert await store.complete(lease, None) is None  # written once


async def test_a_late_outcome_drops_the_retry_its_reaping_scheduled(open_store, clock) -> None:
    async with open_store(lease_seconds=0.2) as store:
        lease, job_id = await reaped(store, clock, max_retries=3)
        assert (await store.get(job_id)).status == "pending"
        outcome = await store.fail(lease, "late boom", None)
        assert outcome is not None and outcome.job.status == "failed"
        assert outcome.dead_letter is not None
        job = await store.get(job_id)
        assert [e.error for e in job.errors] == ["late boom"] and job.attempts == 1
        assert await store.claim(1, None, ALL) == []  # the reaping's retry is gone

        lease, job_id = await reaped(store, clock, max_retries=3)
        retry_at = clock.now() + timedelta(seconds=0.2)
        outcome = await store.fail(lease, "late retry", retry_at)
        assert outcome is not None and outcome.job.status == "pending"
        job = await store.get(job_id)
        assert [e.error for e in job.errors] == ["late retry"]
        assert await store.claim(1, None, ALL) == []  # due at the late retry's time, not before
        await clock.advance(0.3)
        again = await claim_one(store)
        assert again.job.id == job_id and again.job.attempts == 2


async def test_a_late_outcome_voids_a_claim_not_yet_started(open_store, clock) -> None:
    async with open_store(lease_seconds=0.2) as store:
        lease, job_id = await reaped(store, clock, max_retries=3)
        (claimed,) = await store.claim(1, None, ALL, start=0)
        assert claimed.job.id == job_id and claimed.job.status == "claimed"
        assert await store.complete(lease, None) is not None
        assert await store.start(claimed) is None  # its holder is fenced out
        assert (await store.get(job_id)).status == "done"


async def test_a_late_outcome_is_refused_once_a_later_attempt_started(open_store, clock) -> None:
    async with open_store(lease_seconds=0.2) as store:
        lease, job_id = await reaped(store, clock, max_retries=3)
        second = await claim_one(store)
        assert second.job.attempts == 2
        assert await store.complete(lease, None) is None
        assert await store.fail(lease, "late", None) is None
        job = await store.get(job_id)
        assert job.status == "running" and job.attempts == 2
        assert "lease expired" in job.last_error  # the attempt stays counted, as reaped
        assert await store.complete(second, None) is not None


async def test_a_late_outcome_is_refused_when_the_dead_letter_moved_on(open_store, clock) -> None:
    async with open_store(lease_seconds=0.2) as store:
        lease, job_id = await reaped(store, clock, max_retries=0)
        (dead,) = (await store.list_dead(10, 0)).items
        replayed = await store.replay_dead(dead.id, 0)
        assert await store.complete(lease, None) is None  # the replay may be running
        assert (await store.get(job_id)).status == "failed"
        assert (await store.get(replayed.id)).status == "pending"


async def test_a_late_outcome_is_refused_when_on_failure_was_enqueued(open_store, clock) -> None:
    async with open_store(lease_seconds=0.2) as store:
        chained = {"max_retries": 0, "on_failure": {"type": "b"}}
        lease, job_id = await reaped(store, clock, **chained)
        assert await store.complete(lease, None) is None  # its on_failure is enqueued
        assert (await store.get(job_id)).status == "failed"
        assert (await store.list_dead(10, 0)).total == 1


async def test_a_late_outcome_is_refused_after_a_cancel(open_store, clock) -> None:
    async with open_store(lease_seconds=0.2) as store:
        lease, job_id = await reaped(store, clock, max_retries=3)
        await store.cancel(job_id, False)
        assert await store.complete(lease, None) is None
        assert (await store.get(job_id)).status == "cancelled"
