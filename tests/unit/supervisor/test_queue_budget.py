"""The queue budget (`--max-queues`) against a store whose reads are counted: names are
read at most once per ttl, shared by concurrent callers, and counted locally between;
the node's own queues are never refused."""

from __future__ import annotations

import asyncio

import pytest
from goqueue.supervisor.common.errors import TooManyQueues
from goqueue.supervisor.common.jobs import JobSpec
from goqueue.supervisor.queue_budget import QueueBudget
from goqueue.supervisor.store.memory.store import MemoryStore

pytestmark = pytest.mark.timeout(30)


async def test_the_budget_reads_the_store_at_most_once_per_ttl() -> None:
    store = MemoryStore("n")
    reads = 0
    original = store.queue_names

    async def counted(limit: int) -> frozenset[str]:
        nonlocal reads
        reads += 1
        return await original(limit)

    store.queue_names = counted  # type: ignore[method-assign]
    budget = QueueBudget(store, limit=1000, ttl=60.0)
    await asyncio.gather(*(budget.admit(f"q{i}") for i in range(500)))
    assert reads == 1  # concurrent callers share one read; the rest are counted locally
    for i in range(500, 1000):
        await budget.admit(f"q{i}")
    with pytest.raises(TooManyQueues) as caught:
        await budget.admit_spec(JobSpec(type="t", queue="q1001"))
    assert caught.value.field == "queue" and reads == 1
    await budget.admit("q3")  # known: admitted without a read


async def test_a_full_budget_refuses_a_new_name_by_its_field_but_never_a_reserved_one() -> None:
    budget = QueueBudget(MemoryStore("n"), limit=1, reserved=frozenset({"served"}))
    await budget.admit("a")
    with pytest.raises(TooManyQueues) as caught:
        await budget.admit_spec(
            JobSpec(type="t", queue="a", on_success=JobSpec(type="u", queue="b"))
        )
    assert caught.value.field == "on_success.queue" and caught.value.limit == 1
    await budget.admit("served")
    budget.reserve(frozenset({"other"}))  # the node's queues as a reload says
    await budget.admit("other")
    with pytest.raises(TooManyQueues):
        await budget.admit("served")
