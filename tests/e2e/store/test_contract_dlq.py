"""The store contract, continued: bulk dead-letter actions, lookup by job id, unique
keys and the queue health a scrape reads; run against the memory and PostgreSQL stores."""

from __future__ import annotations

import asyncio

import msgspec
import pytest
from goqueue.supervisor.common.errors import DuplicateJob
from goqueue.supervisor.common.jobs import DeadLetter
from goqueue.supervisor.common.reads import OTHER_QUEUES, JobFilter
from goqueue.supervisor.common.summaries import DeadFilter
from goqueue.supervisor.store.base import Store

from tests.e2e.store.test_contract import ALL, claim_one, new

pytestmark = pytest.mark.timeout(30)


async def bury(store: Store, type: str = "a", error: str = "fatal", **fields: object) -> DeadLetter:
    """Enqueue a job, claim it and fail it for good; its dead letter."""
    job = (await store.enqueue(new(type, max_retries=0, **fields))).job
    leases = await store.claim(1, None, {type: 1})
    assert [lease.job.id for lease in leases] == [job.id]
    outcome = await store.fail(leases[0], error, None)
    assert outcome is not None and outcome.dead_letter is not None
    return outcome.dead_letter


async def test_get_dead_finds_a_letter_by_its_jobs_id(open_store) -> None:
    async with open_store() as store:
        letter = await bury(store)
        by_job = await store.get_dead(letter.job_id)
        assert by_job is not None and by_job.id == letter.id
        assert (await store.get_dead(letter.id)).id == letter.id
        assert await store.get_dead("00000000-0000-0000-0000-000000000000") is None


async def test_replay_many_by_filter_oldest_first_within_the_limit(open_store, clock) -> None:
    async with open_store() as store:
        emails = []
        for n in range(3):
            emails.append(await bury(store, "email", f"smtp timeout {n}"))
            await clock.advance(0.01)
        other = await bury(store, "report", "smtp timeout", queue="reports")
        listed = await store.list_dead(2, 0, DeadFilter(type="email"))  # what a replay takes
        assert [d.id for d in listed.items] == [emails[2].id, emails[1].id]
        assert listed.total == 3
        by_error = await store.list_dead(10, 0, DeadFilter(error="TIMEOUT 1"))
        assert [d.id for d in by_error.items] == [emails[1].id] and by_error.total == 1
        assert (await store.list_dead(10, 0, DeadFilter())).total == 4
        first = await store.replay_dead_many(DeadFilter(type="email"), 2)
        assert len(first.jobs) == 2 and first.remaining == 1
        assert [j.type for j in first.jobs] == ["email", "email"]
        assert all(j.status == "pending" and j.max_retries == 0 for j in first.jobs)
        assert await store.get_dead(emails[0].id) is None  # the oldest went first
        assert await store.get_dead(emails[1].id) is None
        assert await store.get_dead(emails[2].id) is not None
        events = [e.event for e in await store.events(first.jobs[0].id)]
        assert events == ["enqueued", "replayed"]
        rest = await store.replay_dead_many(DeadFilter(type="email"), 100)
        assert len(rest.jobs) == 1 and rest.remaining == 0
        assert (await store.replay_dead_many(DeadFilter(type="email"), 100)).jobs == []
        assert (await store.get_dead(other.id)) is not None  # another type stays
        pending = await store.list_jobs(JobFilter(type="email", status="pending"), 10, 0)
        assert pending.total == 3


async def test_replay_and_purge_filters_queue_error_and_time(open_store, clock) -> None:
    async with open_store() as store:
        old = await bury(store, "a", "Connection REFUSED", queue="q1")
        await clock.advance(0.05)
        mid = await bury(store, "a", "bad input", queue="q1")
        await clock.advance(0.05)
        new_ = await bury(store, "b", "connection refused again", queue="q2")
        by_error = await store.purge_dead_many(DeadFilter(error="connection refused"), 1)
        assert (by_error.purged, by_error.remaining) == (1, 1)
        assert await store.get_dead(old.id) is None  # oldest of the two matching
        assert await store.get_dead(new_.id) is not None
        by_queue = await store.replay_dead_many(DeadFilter(queue="q2"), 10)
        assert [j.queue for j in by_queue.jobs] == ["q2"]
        again = await bury(store, "c", "x")
        before = await store.purge_dead_many(DeadFilter(before=again.created_at), 10)
        assert (before.purged, before.remaining) == (1, 0)  # mid only
        assert await store.get_dead(mid.id) is None
        after = await store.purge_dead_many(DeadFilter(after=mid.created_at), 10)
        assert after.purged == 1 and await store.get_dead(again.id) is None
        assert (await store.list_dead(10, 0)).total == 0


async def test_a_page_by_queue_or_type_totals_its_letters_as_they_come_and_go(
    open_store,
) -> None:
    """The totals of pages filtered by queue, type or both (kept as letters come and
    go, not counted) are the letters each page walks, after burials, a replay, bulk
    replays and purges, and a purge of one."""
    groups = [("q1", "a"), ("q1", "b"), ("q2", "a"), ("q2", "b"), ("q3", "c")]
    filters = [DeadFilter(queue=q) for q in ("q1", "q2", "q3", "none")]
    filters += [DeadFilter(type=t) for t in ("a", "b", "c", "none")]
    filters += [DeadFilter(queue=q, type=t) for q, t in groups] + [DeadFilter(queue="q3", type="a")]

    async def assert_totals() -> None:
        for f in [*filters, DeadFilter()]:
            page = await store.list_dead(1000, 0, f)
            briefs = await store.dead_briefs(f, 1000, 0, 10)
            assert page.total == briefs.total == len(page.items), f
            assert all(f.matches(dead) for dead in page.items), f

    async with open_store() as store:
        letters = [await bury(store, t, queue=q) for q, t in groups for _ in range(3)]
        await assert_totals()
        await store.replay_dead(letters[0].id, 0)
        await store.purge_dead(letters[-1].id)
        await assert_totals()
        replayed = await store.replay_dead_many(DeadFilter(queue="q2", type="a"), 2)
        assert (len(replayed.jobs), replayed.remaining) == (2, 1)
        purged = await store.purge_dead_many(DeadFilter(type="b"), 4)
        assert (purged.purged, purged.remaining) == (4, 2)
        await assert_totals()
        left = await store.replay_dead_many(DeadFilter(queue="q1"), 10)
        assert (len(left.jobs), left.remaining) == (2, 0)  # its b letters were purged
        await assert_totals()


async def test_purge_many_with_an_empty_filter_purges_everything_up_to_the_limit(
    open_store,
) -> None:
    async with open_store() as store:
        for _ in range(3):
            await bury(store)
        first = await store.purge_dead_many(DeadFilter(), 2)
        assert (first.purged, first.remaining) == (2, 1)
        second = await store.purge_dead_many(DeadFilter(), 2)
        assert (second.purged, second.remaining) == (1, 0)
        assert (await store.stats()).dead_letters == 0


async def test_a_unique_key_is_held_until_its_job_is_terminal(open_store, clock) -> None:
    async with open_store() as store:
        first = (await store.enqueue(new("a", unique_key="u1"))).job
        assert first.unique_key == "u1"
        with pytest.raises(DuplicateJob) as dup:
            await store.enqueue(new("a", unique_key="u1"))
        assert dup.value.existing_id == first.id
        assert (await store.enqueue(new("c", unique_key="u2"))).created  # another key
        lease = await claim_one(store, {"a": 1})
        assert lease.job.id == first.id
        with pytest.raises(DuplicateJob):  # running holds it
            await store.enqueue(new("b", unique_key="u1"))
        retry = await store.fail(lease, "again", clock.now())
        assert retry is not None and retry.job.status == "pending"
        with pytest.raises(DuplicateJob):  # pending again for a retry: still held
            await store.enqueue(new("a", unique_key="u1"))
        lease = await claim_one(store, {"a": 1})
        await store.complete(lease, None)
        second = (await store.enqueue(new("a", unique_key="u1"))).job  # free once done
        await store.cancel(second.id, False)
        third = (await store.enqueue(new("a", unique_key="u1", max_retries=0))).job
        lease = (await store.claim(1, None, {"a": 1}))[0]
        assert lease.job.id == third.id
        await store.fail(lease, "fatal", None)  # dead-lettered: free again
        assert (await store.enqueue(new("a", unique_key="u1"))).created


async def test_a_delayed_job_holds_its_unique_key(open_store) -> None:
    async with open_store() as store:
        later = (await store.enqueue(new("a", unique_key="k", delay_seconds=60))).job
        with pytest.raises(DuplicateJob) as dup:
            await store.enqueue(new("a", unique_key="k"))
        assert dup.value.existing_id == later.id


async def test_enqueue_many_answers_a_repeated_unique_key_on_its_own(open_store) -> None:
    async with open_store() as store:
        answers = await store.enqueue_many(
            [new("a", unique_key="k"), new("a"), new("a", unique_key="k"), new("a", unique_key="j")]
        )
        first, plain, dup, other = answers
        assert not isinstance(first, Exception) and first.created
        assert not isinstance(plain, Exception) and not isinstance(other, Exception)
        assert isinstance(dup, DuplicateJob) and dup.existing_id == first.job.id
        assert (await store.list_jobs(JobFilter(), 10, 0)).total == 3


async def test_a_replay_carries_no_unique_key(open_store) -> None:
    async with open_store() as store:
        letter = await bury(store, "a", unique_key="k")
        holder = (await store.enqueue(new("a", unique_key="k"))).job
        replayed = await store.replay_dead_many(DeadFilter(), 10)
        assert [j.unique_key for j in replayed.jobs] == [None]
        assert replayed.jobs[0].id not in (holder.id, letter.job_id)


async def test_concurrent_enqueues_of_one_unique_key_on_two_nodes_make_one_job(
    open_store,
) -> None:
    async with open_store("node-a") as a, open_store("node-b") as b:
        tries = [(a if i % 2 else b).enqueue(new("a", unique_key="race")) for i in range(20)]
        answers = await asyncio.gather(*tries, return_exceptions=True)
        created = [x for x in answers if not isinstance(x, BaseException)]
        refused = [x for x in answers if isinstance(x, DuplicateJob)]
        assert len(created) == 1 and len(refused) == 19
        assert {x.existing_id for x in refused} == {created[0].job.id}


async def test_queue_depths_report_the_longest_wait_and_dead_letters(open_store, clock) -> None:
    async with open_store() as store:
        await store.enqueue(new("a", queue="slow"))
        await store.enqueue(new("a", queue="slow"))
        await store.enqueue(new("a", queue="later", delay_seconds=600))
        await store.enqueue(new("b", queue="small"))
        await bury(store, "c")
        await clock.advance(0.3)
        depths = await store.queue_depths(2)
        assert set(depths.top) == {"slow", "later"}
        assert 0.25 <= depths.waiting["slow"] < 30
        assert depths.waiting["later"] == 0.0  # nothing due: no wait
        assert 0.25 <= depths.waiting[OTHER_QUEUES] < 30  # "small", beyond the top 2
        assert depths.dead_letters == 1
        everything = await store.queue_depths(100)
        assert OTHER_QUEUES not in everything.waiting and set(everything.waiting) == {
            "slow",
            "later",
            "small",
        }


async def test_unique_key_round_trips_through_the_job(open_store) -> None:
    async with open_store() as store:
        job = (await store.enqueue(new("a", unique_key="k\x00z"))).job
        got = await store.get(job.id)
        assert got is not None and got.unique_key in ("k\x00z", "k\ufffdz")
        assert msgspec.json.decode(got.payload) is None
        assert ALL
