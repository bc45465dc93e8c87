"""Which idle worker the pool offers for a job type (`Pool.idle_for`, `Pool.is_idle`), on
worker handles with no process behind them: the one `idle()` lists first; and a drain
waiting for idle workers hears of each one freed."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest
from goqueue.actors.protocol import Dropped
from goqueue.supervisor.common.enums import WorkerState
from goqueue.supervisor.common.jobs import Job, JobSpec, Lease
from goqueue.supervisor.settings.config import Settings
from goqueue.supervisor.workers.handle import Worker
from goqueue.supervisor.workers.pool import Pool, WorkerConfig

pytestmark = pytest.mark.timeout(10)


def pool_of(*workers: Worker) -> Pool:
    pool = Pool(asyncio.new_event_loop(), WorkerConfig.of(Settings(workers=1)))
    for worker in workers:
        pool.workers[worker.pid] = worker
    return pool


def worker(pid: int, generation: int, *types: str, state: WorkerState = WorkerState.IDLE) -> Worker:
    return Worker(
        slot=pid,
        generation=generation,
        pid=pid,
        pidfd=-1,
        channel=None,  # type: ignore[arg-type]  # never used: no process
        state=state,
        types=frozenset(types),
    )


def test_the_worker_offered_is_the_first_idle_lists_that_runs_the_type() -> None:
    old, busy, new, other = (
        worker(1, 0, "a"),
        worker(2, 1, "a", state=WorkerState.BUSY),
        worker(3, 1, "a"),
        worker(4, 1, "b"),
    )
    pool = pool_of(old, busy, new, other)
    try:
        assert pool.idle_for("a", set()) is new  # the newest generation first (a reload)
        assert next(w for w in pool.idle() if "a" in w.types) is new
        assert pool.idle_for("a", {id(new)}) is old  # a kept worker is not offered
        assert pool.idle_for("c", set()) is None
        assert pool.idle_for("b", {id(other)}) is None
    finally:
        pool.loop.close()


def test_a_worker_is_idle_only_while_it_is_the_pools_and_ready() -> None:
    idle, busy = worker(1, 0, "a"), worker(2, 0, "a", state=WorkerState.BUSY)
    pool = pool_of(idle, busy)
    try:
        assert pool.is_idle(idle) and not pool.is_idle(busy)
        assert not pool.is_idle(worker(1, 0, "a"))  # another handle with the same pid
        del pool.workers[idle.pid]  # reaped: gone from the pool
        assert not pool.is_idle(idle)
    finally:
        pool.loop.close()


def test_a_drain_hears_of_a_worker_freed_by_dropping_its_queue() -> None:
    """A worker holding only queued attempts drops them (a drain took them back): the
    drain waiting for every worker to be idle hears of it at once, not after its grace."""
    job = Job.from_spec(JobSpec(type="a"), now=datetime(2026, 1, 1, tzinfo=UTC), max_retries=0)
    held = worker(1, 0, "a")
    held.queue(Lease(job=job, token="t", owner="node", expires_at=job.run_at), 5.0, 0.0)
    pool = pool_of(held)

    async def drain() -> bool:
        waiting = asyncio.ensure_future(pool.wait_idle(30.0))
        await asyncio.sleep(0)
        pool.received(held, Dropped(job_ids=[job.id]))
        return await asyncio.wait_for(waiting, 1.0)

    try:
        assert held.state == WorkerState.BUSY
        assert pool.loop.run_until_complete(drain())
    finally:
        pool.loop.close()
