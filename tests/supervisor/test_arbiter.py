"""The arbiter's answers to worker lifecycle events, on a node of fakes (no processes):
which restarts are counted under which reason, and when a replacement is spawned."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from goqueue.supervisor.arbiter import Arbiter
from goqueue.supervisor.catalog import Catalog
from goqueue.supervisor.config import Settings
from goqueue.supervisor.history import History
from goqueue.supervisor.metrics import Metrics
from goqueue.supervisor.node import Node
from goqueue.supervisor.vocab import KillReason, RestartReason, WorkerState

pytestmark = pytest.mark.timeout(10)


@dataclass(eq=False)
class FakeWorker:
    pid: int = 99
    slot: int = 1
    kill_reason: KillReason | None = None
    exitcode: int | None = -9
    state: WorkerState = WorkerState.STOPPING
    retire: bool = False
    lease: Any = None
    generation: int = 0


@dataclass
class FakePool:
    """No live workers; counts spawns."""

    spawned: int = 0
    workers: list[FakeWorker] = field(default_factory=list)
    listener: Any = None

    def listen(self, *, workers: Any = None, jobs: Any = None) -> None:
        self.listener = workers

    def __iter__(self) -> Any:
        return iter(self.workers)

    def spawn(self, generation: int, modules: Any = None) -> FakeWorker:
        self.spawned += 1
        return FakeWorker()

    def count(self, *states: WorkerState) -> int:
        return 0


@dataclass
class FakeDispatcher:
    woken: int = 0
    catalog: Catalog = field(default_factory=lambda: Catalog((), {}))

    def wake(self) -> None:
        self.woken += 1


def restarts(metrics: Metrics, reason: RestartReason) -> float:
    value = metrics.registry.get_sample_value(
        "goqueue_worker_restarts_total", {"reason": reason.value}
    )
    return 0.0 if value is None else value


def arbiter() -> tuple[Arbiter, FakePool, FakeDispatcher, Metrics]:
    settings = Settings(workers=1)
    pool, dispatcher, metrics = FakePool(), FakeDispatcher(), Metrics()
    parts: dict[str, Any] = dict.fromkeys(
        ("store", "engine", "hooks", "webhooks", "leases", "http"), None
    )
    node = Node(
        settings=settings,
        pool=pool,
        dispatcher=dispatcher,
        metrics=metrics,
        history=History(),
        reload_settings=lambda: settings,
        **parts,
    )
    made = Arbiter(node)
    assert pool.listener is made  # the arbiter hears worker events, not job events
    return made, pool, dispatcher, metrics


@pytest.mark.parametrize(
    ("reason", "counted"),
    [
        (None, RestartReason.CRASH),
        (KillReason.TIMEOUT, RestartReason.TIMEOUT),
        (KillReason.CANCEL, RestartReason.CANCEL),
        (KillReason.LEASE_LOST, RestartReason.LEASE_LOST),
    ],
)
def test_a_worker_that_died_is_counted_and_replaced(
    reason: KillReason | None, counted: RestartReason
) -> None:
    arb, pool, dispatcher, metrics = arbiter()
    arb.worker_exited(FakeWorker(kill_reason=reason))
    assert restarts(metrics, counted) == 1
    assert sum(restarts(metrics, r) for r in RestartReason) == 1
    assert pool.spawned == 1 and dispatcher.woken == 1


@pytest.mark.parametrize("reason", [KillReason.STOPPED, KillReason.RECYCLE, KillReason.SHUTDOWN])
def test_a_worker_ended_on_purpose_is_not_counted_again_when_it_exits(
    reason: KillReason,
) -> None:
    arb, pool, _, metrics = arbiter()
    arb.worker_exited(FakeWorker(kill_reason=reason, exitcode=0))
    assert sum(restarts(metrics, r) for r in RestartReason) == 0
    assert pool.spawned == 1  # still replaced, up to the target


def test_recycling_is_counted_when_decided_and_the_successor_starts_at_once() -> None:
    arb, pool, _, metrics = arbiter()
    arb.worker_recycled(FakeWorker(kill_reason=KillReason.RECYCLE))
    assert restarts(metrics, RestartReason.RECYCLE) == 1 and pool.spawned == 1


def test_repeated_crashes_respawn_at_once_then_back_off() -> None:
    arb, pool, _, _ = arbiter()
    for _ in range(3):
        arb.worker_exited(FakeWorker())
    assert pool.spawned == 3
    arb.worker_exited(FakeWorker())  # the fourth crash in a row: wait ~1.6 s first
    assert pool.spawned == 3
