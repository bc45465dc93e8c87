"""`Waiters`: requests waiting for a job to finish, woken by outcomes recorded on this
node at once and by a poll of the store for the rest. Fakes for the store's read."""

from __future__ import annotations

import asyncio

import msgspec
import pytest
from goqueue.supervisor.common.enums import Status
from goqueue.supervisor.common.errors import StoreUnavailable
from goqueue.supervisor.common.jobs import Job, JobSpec, Outcome, utcnow
from goqueue.supervisor.waiters import Waiters

from tests.conftest import stays_true_async, wait_for_async

pytestmark = pytest.mark.timeout(10)


def job(status: Status = Status.PENDING) -> Job:
    made = Job.from_spec(JobSpec(type="t"), now=utcnow(), max_retries=0)
    return msgspec.structs.replace(made, status=status)


class Store:
    """Jobs by id, read as a store would (or failing, when `down`)."""

    def __init__(self) -> None:
        self.jobs: dict[str, Job] = {}
        self.reads = 0
        self.down = False

    async def read(self, job_id: str) -> Job | None:
        self.reads += 1
        if self.down:
            raise StoreUnavailable("down")
        return self.jobs.get(job_id)


async def test_an_outcome_recorded_here_wakes_its_waiters_at_once() -> None:
    store = Store()
    waiters = Waiters(store.read, poll=60)
    pending = job()
    assert waiters.quiet  # nobody waits: told of no outcome
    with waiters.watching(pending.id) as first, waiters.watching(pending.id) as second:
        assert not waiters.quiet
        retried = msgspec.structs.replace(pending, status=Status.PENDING)
        waiters.after_outcome(Outcome(retried, []))
        await asyncio.sleep(0)
        assert not first.done()  # a retry is not an end
        done = msgspec.structs.replace(pending, status=Status.DONE)
        waiters.after_outcome(Outcome(done, []))
        assert first.result() is done and second.result() is done
        assert waiters.quiet
    assert len(waiters) == 0 and store.reads == 0
    await waiters.close()


async def test_a_cancel_wakes_its_waiters() -> None:
    waiters = Waiters(Store().read, poll=60)
    pending = job()
    with waiters.watching(pending.id) as finished:
        cancelled = msgspec.structs.replace(pending, status=Status.CANCELLED)
        waiters.after_cancel(cancelled, force=False)
        assert (await finished) is cancelled
    await waiters.close()


async def test_the_poll_finds_outcomes_recorded_elsewhere_and_stops_when_nobody_waits() -> None:
    store = Store()
    waiters = Waiters(store.read, poll=0.01)
    pending = job()
    store.jobs[pending.id] = pending
    with waiters.watching(pending.id) as finished:
        await wait_for_async(lambda: store.reads >= 2, timeout=2, what="two polls")
        assert not finished.done() and store.reads >= 2
        store.down = True  # a failed read is skipped, not fatal
        failing_from = store.reads
        await wait_for_async(
            lambda: store.reads >= failing_from + 2, timeout=2, what="polls on after a failed read"
        )
        store.down = False
        store.jobs[pending.id] = msgspec.structs.replace(pending, status=Status.FAILED)
        failed = await asyncio.wait_for(finished, 1)
        assert failed is not None and failed.status == Status.FAILED
    poller = waiters._poller
    assert poller is not None
    await asyncio.wait_for(poller, 1)  # no waiter left: the poll ends by itself
    reads = store.reads
    await stays_true_async(lambda: store.reads == reads, for_seconds=0.05, what="no more reads")
    assert store.reads == reads


async def test_draining_ends_every_wait_and_refuses_new_ones() -> None:
    waiters = Waiters(Store().read, poll=0.01)
    with waiters.watching(job().id) as finished:
        waiters.release_all()
        assert (await finished) is None
    with waiters.watching(job().id) as later:
        assert later.done() and later.result() is None
    await waiters.close()
    assert waiters._poller is None or waiters._poller.done()
