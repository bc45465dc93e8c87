"""The memory store's claims by key (`PendingHeaps`): a claim looks at a window of a
type's keys, not at every key, and keys take turns, least lately taken first."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from goqueue.supervisor.common.jobs import JobSpec
from goqueue.supervisor.store.base import NewJob
from goqueue.supervisor.store.memory.heaps import PendingHeaps
from goqueue.supervisor.store.memory.store import MemoryStore

pytestmark = pytest.mark.timeout(30)


def new(key: str | None, job_type: str = "k") -> NewJob:
    return NewJob(spec=JobSpec(type=job_type, concurrency_key=key), max_retries=0)


class Looks:
    """Counts the heaps a claim looks at (`PendingHeaps.next_of` calls)."""

    def __init__(self, heaps: PendingHeaps) -> None:
        self.count = 0
        self._next_of = heaps.next_of
        heaps.next_of = self  # type: ignore[method-assign]

    def __call__(self, *args: object) -> object:
        self.count += 1
        return self._next_of(*args)  # type: ignore[arg-type]


async def test_a_claim_looks_at_a_window_of_keys_not_at_every_key() -> None:
    store = MemoryStore()
    await store.register_node({"k": None}, key_limits={"k": 1})
    for i in range(3000):
        await store.enqueue(new(f"key-{i % 1000}"))
    looks = Looks(store._pending)
    for _ in range(50):
        leases = await store.claim(2, None, {"k": 2})
        assert len(leases) == 2
        for lease in leases:
            await store.complete(lease, None)
    assert looks.count < 50 * 40, looks.count  # a window of 12 keys, not 1,000


async def test_keys_take_turns_least_lately_taken_first_though_each_has_room() -> None:
    store = MemoryStore()
    await store.register_node({"k": None}, key_limits={"k": 5})
    for key in "abc":
        for _ in range(3):
            await store.enqueue(new(key))
    order = []
    for _ in range(9):
        (lease,) = await store.claim(1, None, {"k": 1})
        order.append(lease.job.concurrency_key)
        await store.complete(lease, None)  # each key has room again: turns alone decide
    assert "".join(map(str, order)) == "abcabcabc"


async def test_a_key_rule_added_by_a_reload_holds_for_the_jobs_waiting() -> None:
    store = MemoryStore()
    await store.register_node({"k": None})
    for key in "aab":
        await store.enqueue(new(key))
    await store.register_node({"k": None}, key_limits={"k": 1})  # a reload adds the rule
    leases = await store.claim(3, None, {"k": 3})
    assert sorted(str(x.job.concurrency_key) for x in leases) == ["a", "b"]  # one of each


async def test_a_delayed_job_due_before_anyone_asked_is_answered_once_then_the_next() -> None:
    now = [datetime(2026, 1, 1, tzinfo=UTC)]
    store = MemoryStore(clock=lambda: now[0])
    await store.register_node({"k": None})
    soon, later = now[0] + timedelta(seconds=1), now[0] + timedelta(seconds=5)
    for run_at in (soon, later):
        await store.enqueue(NewJob(spec=JobSpec(type="k", run_at=run_at), max_retries=0))
    assert store.next_due_at() == soon
    now[0] += timedelta(seconds=2)  # no worker was free to claim it meanwhile
    assert store.next_due_at() == soon  # a timer set for it wakes the dispatcher at once
    assert store.next_due_at() == later  # not again: no spinning on a time past
    (lease,) = await store.claim(1, None, {"k": 1})
    assert lease.job.run_at == soon
