"""The store contract for flow control by key (`supervisor/common/flow.py`): a job's
`concurrency_key` kept through its life, per-key limits in the claim with no
head-of-line blocking, and keys taking turns; on every store."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

import msgspec
import pytest
from goqueue.supervisor.common.jobs import JobSpec, new_id
from goqueue.supervisor.common.rates import Rate
from goqueue.supervisor.common.reads import JobFilter
from goqueue.supervisor.store.base import NewJob, Store
from goqueue.supervisor.store.new_workflow import NewStep, NewWorkflow

from tests.e2e.store.test_contract import ALL, new

pytestmark = pytest.mark.timeout(30)


async def keyed(store: Store, key: str | None, n: int, job_type: str = "a") -> list[str]:
    """Enqueue `n` jobs of `key`, in order; their ids."""
    return [
        (await store.enqueue(new(job_type, concurrency_key=key, payload={"n": i}))).job.id
        for i in range(n)
    ]


def keys_of(leases) -> Counter[str | None]:
    return Counter(lease.job.concurrency_key for lease in leases)


async def test_the_key_is_stored_listed_and_kept_by_retries_and_replays(open_store) -> None:
    async with open_store() as store:
        (job_id,) = await keyed(store, "tenant-7", 1)
        await keyed(store, "tenant-8", 1)
        got = await store.get(job_id)
        assert got is not None and got.concurrency_key == "tenant-7"
        page = await store.list_jobs(JobFilter(concurrency_key="tenant-7"), 10, 0)
        assert [j.id for j in page.items] == [job_id] and page.total == 1
        (lease,) = [x for x in await store.claim(2, None, ALL) if x.job.id == job_id]
        assert lease.job.concurrency_key == "tenant-7"
        await store.fail(lease, "boom", lease.job.run_at)  # retried: pending again
        again = await store.get(job_id)
        assert again is not None and again.status == "pending"
        assert again.concurrency_key == "tenant-7"
        (lease,) = await store.claim(1, None, ALL)
        outcome = await store.fail(lease, "boom again", None)  # dead-lettered
        assert outcome is not None and outcome.dead_letter is not None
        fresh = await store.replay_dead(outcome.dead_letter.id, 3)
        assert fresh.concurrency_key == "tenant-7"


async def test_a_key_at_its_limit_holds_back_only_its_own_jobs(open_store) -> None:
    async with open_store() as store:
        await store.register_node({"a": None, "b": None}, key_limits={"a": 2})
        big = await keyed(store, "big", 6)  # first in line, and the most
        small = await keyed(store, "small", 3)
        plain = await keyed(store, None, 2)
        first = await store.claim(20, None, ALL)
        assert keys_of(first) == {"big": 2, "small": 2, None: 2}
        assert await store.claim(20, None, ALL) == []  # both keys at their limit
        # a key's jobs start in enqueue order
        assert [x.job.id for x in first if x.job.concurrency_key == "big"] == big[:2]
        assert {x.job.id for x in first if x.job.concurrency_key is None} == set(plain)
        done = next(x for x in first if x.job.concurrency_key == "big")
        await store.complete(done, None)
        (following,) = await store.claim(20, None, ALL)
        assert following.job.id == big[2]
        assert [x.job.id for x in first if x.job.concurrency_key == "small"] == small[:2]


async def test_a_job_without_a_key_is_not_held_behind_its_types_keyed_backlog(
    open_store,
) -> None:
    async with open_store() as store:
        await store.register_node({"a": None, "b": None}, key_limits={"a": 1})
        await store.enqueue_many([new("a", concurrency_key="busy") for _ in range(1000)])
        (plain,) = await keyed(store, None, 1)  # behind 1,000 jobs of a key at its limit
        first = await store.claim(10, None, {"a": 10})
        assert keys_of(first) == {"busy": 1, None: 1}
        assert plain in {x.job.id for x in first}


async def test_keys_with_nothing_due_or_only_paused_jobs_never_fill_a_claims_window(
    open_store,
) -> None:
    async with open_store() as store:
        await store.register_node({"a": None, "b": None}, key_limits={"a": 5})
        # forty keys first in key order: twenty with jobs not due for an hour, twenty with
        # jobs in a paused queue; then one key with a job due now
        later = [new("a", concurrency_key=f"k{i:02}", delay_seconds=3600) for i in range(20)]
        held = [new("a", concurrency_key=f"k{i:02}", queue="held") for i in range(20, 40)]
        await store.enqueue_many([*later, *held])
        await store.set_paused("held", True)
        (due,) = await keyed(store, "zz", 1)
        assert [x.job.id for x in await store.claim(5, None, {"a": 5})] == [due]


async def test_a_type_without_a_key_limit_ignores_keys_and_the_type_limit_holds(
    open_store,
) -> None:
    async with open_store() as store:
        await store.register_node({"a": None, "b": None}, key_limits={"a": 1})
        await keyed(store, "k", 3, job_type="b")  # no key limit on b
        assert keys_of(await store.claim(10, None, {"b": 100})) == {"k": 3}
        await keyed(store, "x", 2)
        await keyed(store, "y", 2)
        await keyed(store, "z", 2)
        assert len(await store.claim(10, None, {"a": 2})) == 2  # the type's slots hold
        assert len(await store.claim(10, None, {"a": 5})) == 1  # the third key's turn
        assert await store.claim(10, None, {"a": 5}) == []


async def test_keys_take_turns_rather_than_enqueue_order(open_store) -> None:
    async with open_store() as store:
        await store.register_node({"a": None, "b": None}, key_limits={"a": 1000})
        big = await keyed(store, "big", 20)
        small = await keyed(store, "small", 3)
        taken = [(await store.claim(1, None, ALL))[0].job.id for _ in range(8)]
        assert taken == [big[0], small[0], big[1], small[1], big[2], small[2], *big[3:5]]


async def test_keys_of_a_type_without_a_key_rule_take_turns_too(open_store) -> None:
    async with open_store() as store:
        await store.register_node({"a": None, "b": None})
        big = await keyed(store, "big", 20, job_type="b")
        small = await keyed(store, "small", 3, job_type="b")
        taken = []
        for _ in range(8):
            (lease,) = await store.claim(1, None, ALL)
            taken.append(lease.job.id)
            await store.complete(lease, None)  # nothing busy: the keys' order alone
        assert taken == [big[0], small[0], big[1], small[1], big[2], small[2], *big[3:5]]


async def test_a_killed_or_lost_attempt_frees_its_keys_slot(open_store, clock) -> None:
    async with open_store(lease_seconds=1) as store:
        await store.register_node({"a": None, "b": None}, key_limits={"a": 1})
        ids = await keyed(store, "k", 3)
        (first,) = await store.claim(10, None, ALL)
        assert first.job.id == ids[0]
        await store.cancel(ids[0], True)  # killed: its slot is free
        (second,) = await store.claim(10, None, ALL)
        assert second.job.id == ids[1]
        await clock.advance(1.5)  # its node is gone: the lease runs out
        reaped = await store.reap_expired(lambda attempt: 60.0)
        assert [j.id for j in reaped] == [ids[1]]
        (third,) = await store.claim(10, None, ALL)
        assert third.job.id == ids[2]


def debounced(key: str, n: int, seconds: float = 1.0, **more: object):
    return new("a", debounce_key=key, debounce_seconds=seconds, payload={"n": n}, **more)


async def test_a_debounced_enqueue_replaces_the_job_until_it_starts(open_store, clock) -> None:
    async with open_store() as store:
        first = await store.enqueue(debounced("doc-7", 1))
        assert first.created and first.job.debounce_key == "doc-7"
        due = first.job.run_at  # (the memory store's job is the one it changes)
        assert due > first.job.created_at
        await clock.advance(0.3)
        again = await store.enqueue(debounced("doc-7", 2))
        assert not again.created and again.job.id == first.job.id
        assert again.job.run_at > due
        other = await store.enqueue(debounced("doc-8", 3))
        assert other.created and other.job.id != first.job.id
        assert await store.claim(10, None, ALL) == []  # not due yet
        await clock.advance(1.2)
        leases = {x.job.id: x for x in await store.claim(10, None, ALL)}
        assert set(leases) == {first.job.id, other.job.id}
        assert msgspec.json.decode(leases[first.job.id].job.payload) == {"n": 2}
        events = [e.event for e in await store.events(first.job.id)]
        assert events[:2] == ["enqueued", "debounced"], events
        later = await store.enqueue(debounced("doc-7", 4))  # started: a new job
        assert later.created and later.job.id != first.job.id


async def test_debounce_max_seconds_bounds_how_long_a_burst_puts_its_job_off(
    open_store, clock
) -> None:
    async with open_store() as store:
        first = (await store.enqueue(debounced("doc", 0, 1.0, debounce_max_seconds=1.5))).job
        for n in range(1, 4):
            await clock.advance(0.5)
            job = (await store.enqueue(debounced("doc", n, 1.0, debounce_max_seconds=1.5))).job
            assert job.id == first.id
        bound = first.created_at + timedelta(seconds=1.5)
        assert abs((job.run_at - bound).total_seconds()) < 0.01, (job.run_at, bound)


async def test_a_keys_starts_are_paced_on_its_own(open_store, clock) -> None:
    async with open_store() as store:
        await store.register_node({"a": None, "b": None}, key_rates={"a": Rate(2, 1.0)})
        await keyed(store, "k", 6)
        await keyed(store, "m", 6)
        await keyed(store, None, 3)
        first = await store.claim(20, None, ALL)
        assert keys_of(first) == {"k": 2, "m": 2, None: 3}  # a burst of 2 each, then paced
        assert await store.claim(20, None, ALL) == []
        await clock.advance(1.2)  # one more start each is due (one every 0.5 s after the burst)
        assert keys_of(await store.claim(20, None, ALL)) == {"k": 1, "m": 1}
        assert await store.claim(20, None, ALL) == []


async def test_workflow_steps_and_chained_jobs_carry_their_key(open_store) -> None:
    async with open_store() as store:
        spec = msgspec.json.decode(b'{"type": "a", "concurrency_key": "tenant-3"}', type=JobSpec)
        wf = NewWorkflow(
            id=new_id(),
            name="wf",
            steps=[NewStep(key="only", after=[], new=NewJob(spec=spec, max_retries=0))],
        )
        await store.create_workflow(wf)
        chained = new("a", on_success={"type": "b", "concurrency_key": "tenant-4"})
        await store.enqueue(chained)
        leases = await store.claim(10, None, ALL)
        assert keys_of(leases) == {"tenant-3": 1, None: 1}
        (parent,) = [x for x in leases if x.job.concurrency_key is None]
        outcome = await store.complete(parent, None)
        assert outcome is not None
        assert [j.concurrency_key for j in outcome.followups] == ["tenant-4"]


async def test_a_debounced_enqueues_idempotency_key_names_the_job_it_replaced(
    open_store,
) -> None:
    async with open_store() as store:
        first = await store.enqueue(debounced("doc", 1, idempotency_key="i1", request_hash="h1"))
        again = await store.enqueue(debounced("doc", 2, idempotency_key="i2", request_hash="h2"))
        assert not again.created and again.job.id == first.job.id
        repeat = await store.enqueue(debounced("doc", 2, idempotency_key="i2", request_hash="h2"))
        assert not repeat.created and repeat.job.id == first.job.id
