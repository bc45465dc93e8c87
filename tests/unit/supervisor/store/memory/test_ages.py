"""The memory store's longest wait by queue (`OldestByQueue`): right after retries and
claims, and bounded however many jobs pass through a queue while an old one waits."""

from __future__ import annotations

from datetime import timedelta

import pytest
from goqueue.supervisor.common.jobs import JobSpec, utcnow
from goqueue.supervisor.store.base import NewJob
from goqueue.supervisor.store.memory.store import MemoryStore

pytestmark = pytest.mark.timeout(30)


def new(priority: int, queue: str = "q", delay: float | None = None) -> NewJob:
    spec = JobSpec(type="a", queue=queue, priority=priority, delay_seconds=delay)
    return NewJob(spec=spec, max_retries=3)


async def test_the_oldest_wait_survives_a_flood_of_newer_jobs_without_growing() -> None:
    now = [utcnow()]
    store = MemoryStore(clock=lambda: now[0])
    await store.enqueue(new(0))  # old and low: waits while the flood passes
    now[0] += timedelta(seconds=30)
    for _ in range(2000):
        await store.enqueue(new(9))
        (lease,) = await store.claim(1, None, {"a": 1})
        assert lease.job.priority == 9
        await store.complete(lease, None)
    depths = await store.queue_depths(10)
    assert depths.waiting == {"q": 30.0}
    assert len(store._ages.heaps["q"]) < 200  # stale entries are compacted away


async def test_a_retried_job_waits_from_its_new_run_at_and_an_emptied_queue_is_forgotten() -> None:
    now = [utcnow()]
    store = MemoryStore(clock=lambda: now[0])
    await store.enqueue(new(5))
    await store.enqueue(new(5, queue="later", delay=60))
    now[0] += timedelta(seconds=10)
    (lease,) = await store.claim(1, frozenset({"q"}), {"a": 1})
    assert (await store.queue_depths(10)).waiting == {"later": 0.0}
    await store.fail(lease, "again", now[0] + timedelta(seconds=5))
    assert (await store.queue_depths(10)).waiting == {"q": 0.0, "later": 0.0}  # not due yet
    now[0] += timedelta(seconds=7)
    assert (await store.queue_depths(10)).waiting == {"q": 2.0, "later": 0.0}
    (lease,) = await store.claim(1, frozenset({"q"}), {"a": 1})
    await store.complete(lease, None)
    assert "q" not in store._ages.heaps
