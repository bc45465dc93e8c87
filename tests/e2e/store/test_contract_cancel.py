"""The store contract for bulk cancel (`Store.cancel_many`), on both stores: filtered,
bounded, oldest first, audited, and running jobs only when forced."""

from __future__ import annotations

import pytest
from goqueue.supervisor.common.bulk import BULK_CANCEL, CancelFilter
from goqueue.supervisor.common.enums import Status
from goqueue.supervisor.common.reads import JobFilter

from tests.e2e.store.test_contract import ALL, claim_one, new

pytestmark = pytest.mark.timeout(30)

FORCED = (Status.PENDING, Status.CLAIMED, Status.RUNNING)


async def test_pending_jobs_of_a_queue_and_type_go_oldest_first_within_the_limit(
    open_store,
) -> None:
    async with open_store() as store:
        mine = [(await store.enqueue(new("a", queue="q", payload={"n": n}))).job for n in range(5)]
        other_type = (await store.enqueue(new("b", queue="q"))).job
        other_queue = (await store.enqueue(new("a", queue="r"))).job
        done = await store.cancel_many(CancelFilter(queue="q", type="a"), 3)
        assert [j.id for j in done.jobs] == [j.id for j in mine[:3]]
        assert all(j.status == "cancelled" and j.finished_at is not None for j in done.jobs)
        assert (done.tokens, done.remaining, done.running) == ([], 2, 0)
        for job in mine[:3]:
            trail = await store.events(job.id)
            assert [(e.event, e.detail) for e in trail][-1] == ("cancelled", BULK_CANCEL)
            assert (await store.get(job.id)).status == "cancelled"
        rest = await store.cancel_many(CancelFilter(queue="q", type="a"), 100)
        assert [j.id for j in rest.jobs] == [j.id for j in mine[3:]] and rest.remaining == 0
        for untouched in (other_type, other_queue):
            assert (await store.get(untouched.id)).status == "pending"
        assert (await store.cancel_many(CancelFilter(queue="q", type="a"), 100)).jobs == []
        assert (await store.queue_stats("q")).depth_by_priority == {"5": 1}
        leases = await store.claim(10, None, ALL)
        assert {lease.job.id for lease in leases} == {other_type.id, other_queue.id}


async def test_running_jobs_are_left_alone_unless_forced(open_store) -> None:
    async with open_store() as store:
        await store.enqueue(new("a"))
        running = await claim_one(store)
        await store.enqueue(new("a"))
        (held,) = await store.claim(1, None, ALL, start=0)  # claimed, not started
        waiting = (await store.enqueue(new("a"))).job
        gentle = await store.cancel_many(CancelFilter(), 10)
        assert {j.id for j in gentle.jobs} == {held.job.id, waiting.id}
        assert (gentle.tokens, gentle.remaining, gentle.running) == ([held.token], 0, 1)
        assert await store.start(held) is None  # its holder is fenced out
        assert (await store.get(running.job.id)).status == "running"
        forced = await store.cancel_many(CancelFilter(statuses=FORCED), 10)
        assert [j.id for j in forced.jobs] == [running.job.id]
        assert (forced.tokens, forced.remaining, forced.running) == ([running.token], 0, 0)
        assert (gentle.killed, forced.killed) == (0, 1)
        assert await store.complete(running, None) is None
        assert (await store.stats()).counts["running"] == 0


async def test_created_before_takes_only_older_jobs(open_store, clock) -> None:
    async with open_store() as store:
        old = (await store.enqueue(new("a"))).job
        await clock.advance(0.05)
        cut = clock.now()
        await clock.advance(0.05)
        young = (await store.enqueue(new("a"))).job
        done = await store.cancel_many(CancelFilter(created_before=cut), 10)
        assert [j.id for j in done.jobs] == [old.id] and done.remaining == 0
        assert (await store.get(young.id)).status == "pending"
        page = await store.list_jobs(JobFilter(status="cancelled"), 10, 0)
        assert [j.id for j in page.items] == [old.id]
