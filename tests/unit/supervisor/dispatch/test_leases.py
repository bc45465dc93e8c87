"""The lease chores against a real in-memory store on a clock moved by hand; the
dispatcher and the pool are fakes that only say what they hold and record kills."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import msgspec
import pytest
from goqueue.supervisor.common.enums import KillReason, Status
from goqueue.supervisor.common.jobs import JobSpec, Lease
from goqueue.supervisor.dispatch.leases import Leases, prune_every
from goqueue.supervisor.store.base import NewJob
from goqueue.supervisor.store.memory.store import MemoryStore

pytestmark = pytest.mark.timeout(10)


class Clock:
    def __init__(self) -> None:
        self.at = datetime(2026, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.at


@dataclass
class FakeDispatcher:
    held: list[Lease] = field(default_factory=list)
    stopped: list[tuple[str, KillReason]] = field(default_factory=list)
    renewals: list[tuple[list[str], float]] = field(default_factory=list)
    stale: int = 0
    woken: int = 0
    backs: int = 0  # times told the store answers again

    def held_leases(self) -> list[Lease]:
        return list(self.held)

    def retry_delay(self, attempt: int) -> float:
        return 10.0 * attempt

    def release_stale(self) -> int:
        return self.stale

    def renewed(self, leases: list[Lease], at: float) -> None:
        self.renewals.append(([x.token for x in leases], at))

    def stop_lease(self, token: str, reason: KillReason) -> bool:
        self.stopped.append((token, reason))
        return True

    def wake(self) -> None:
        self.woken += 1

    def store_back(self) -> None:
        self.backs += 1


@dataclass
class FakeWorker:
    pid: int


@dataclass
class FakePool:
    holders: dict[str, FakeWorker] = field(default_factory=dict)
    kills: list[tuple[int, KillReason]] = field(default_factory=list)

    def holding(self, token: str) -> FakeWorker | None:
        return self.holders.get(token)

    def kill(self, worker: FakeWorker, reason: KillReason) -> None:
        self.kills.append((worker.pid, reason))


async def claimed(store: MemoryStore, n: int) -> list[Lease]:
    spec = msgspec.convert({"type": "a"}, JobSpec)
    for _ in range(n):
        await store.enqueue(NewJob(spec=spec, max_retries=3))
    return await store.claim(n, None, {"a": n})


async def test_held_leases_outlive_their_term_and_lost_ones_are_reported_and_killed() -> None:
    clock = Clock()
    store = MemoryStore(lease_seconds=30, clock=clock)
    running, in_hand, cancelled = await claimed(store, 3)
    dispatcher, pool = FakeDispatcher([running, in_hand, cancelled]), FakePool()
    pool.holders = {running.token: FakeWorker(11), cancelled.token: FakeWorker(12)}
    leases = Leases(store, dispatcher, pool)
    await store.cancel(cancelled.job.id, force=True)
    clock.at += timedelta(seconds=20)
    lost = await leases.heartbeat(30)
    assert lost == [cancelled.token]
    clock.at += timedelta(seconds=20)  # 40 s after the claim: past the first term
    await leases.reap()
    assert dispatcher.woken == 0  # nothing expired: the heartbeat extended both
    assert (await store.get(running.job.id)).status == Status.RUNNING
    leases.kill_lost(lost)  # the dispatcher kills its worker, or takes it back from a queue
    assert dispatcher.stopped == [(cancelled.token, KillReason.LEASE_LOST)]


async def test_a_lease_nobody_extends_is_reaped_and_the_dispatcher_woken() -> None:
    clock = Clock()
    store = MemoryStore(lease_seconds=30, clock=clock)
    [orphan] = await claimed(store, 1)
    leases = Leases(store, FakeDispatcher(), FakePool())
    clock.at += timedelta(seconds=31)
    await leases.reap()
    assert leases.dispatcher.woken == 1
    assert (await store.get(orphan.job.id)).status == Status.PENDING


async def test_prune_removes_finished_jobs_past_retention_only() -> None:
    clock = Clock()
    store = MemoryStore(clock=clock)
    [old] = await claimed(store, 1)
    await store.complete(old, None)
    clock.at += timedelta(hours=2)
    [recent] = await claimed(store, 1)
    await store.complete(recent, None)
    leases = Leases(store, FakeDispatcher(), FakePool())
    assert await leases.prune(3600, now=clock()) == 1
    assert await store.get(old.job.id) is None and await store.get(recent.job.id) is not None


def test_a_short_retention_is_pruned_often_and_a_long_one_once_a_minute() -> None:
    assert prune_every(15) == 1.5  # a job outlives 15 s by at most about 1.5 s
    assert prune_every(2) == 1.0  # never more than once a second
    assert prune_every(7 * 86400) == 60.0  # the default: once a minute


async def test_after_the_store_comes_back_reaping_waits_a_lease_for_holders_to_extend() -> None:
    clock = Clock()
    store = MemoryStore(lease_seconds=30, clock=clock)
    [held] = await claimed(store, 1)
    ticks = [100.0]
    dispatcher = FakeDispatcher([held])
    leases = Leases(store, dispatcher, FakePool(), monotonic=lambda: ticks[0])
    leases.unreachable()  # an outage: the holder could not extend its lease
    clock.at += timedelta(seconds=31)
    await leases.reap(30)
    leases.reachable()
    leases.reachable()
    assert dispatcher.backs == 1  # held writes are told once, when the store came back
    ticks[0] += 29
    await leases.reap(30)  # back for less than a lease: holders may still extend
    assert (await store.get(held.job.id)).status == Status.RUNNING
    assert await leases.heartbeat(30) == []  # the holder extends it after all
    assert dispatcher.renewals == [([held.token], 129.0)]
    ticks[0] += 2
    await leases.reap(30)
    assert (await store.get(held.job.id)).status == Status.RUNNING
    clock.at += timedelta(seconds=31)  # now nobody extends it: reaped
    await leases.reap(30)
    assert (await store.get(held.job.id)).status == Status.PENDING
