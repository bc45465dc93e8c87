"""The arbiter's answers to worker lifecycle events, on a node of fakes (no processes):
which restarts are counted under which reason, and when a replacement is spawned."""

from __future__ import annotations

import asyncio
import errno
import logging
import signal
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from goqueue.actors.protocol import ActorInfo, Ready
from goqueue.supervisor import arbiter as arbiter_module
from goqueue.supervisor import startup as startup_module
from goqueue.supervisor.arbiter import Arbiter
from goqueue.supervisor.common.catalog import Catalog
from goqueue.supervisor.common.enums import KillReason, RestartReason, WorkerState
from goqueue.supervisor.common.errors import StoreUnavailable
from goqueue.supervisor.common.lifecycle import Lifecycle, NodePhase
from goqueue.supervisor.node import Node
from goqueue.supervisor.observe.history import History
from goqueue.supervisor.observe.metrics import Metrics
from goqueue.supervisor.settings.config import Settings
from goqueue.supervisor.store.base import NodeLinks
from goqueue.supervisor.workers.events import Listeners

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
    listeners: Listeners = field(default_factory=Listeners)

    @property
    def listener(self) -> Any:
        return self.listeners.workers

    def listen(self, listeners: Listeners) -> None:
        self.listeners = listeners

    def __iter__(self) -> Any:
        return iter(self.workers)

    def spawn(self, generation: int, modules: Any = None) -> FakeWorker:
        self.spawned += 1
        worker = FakeWorker(pid=1000 + self.spawned, state=WorkerState.BOOTING)
        worker.generation = generation
        self.workers.append(worker)
        return worker

    def stop(self, worker: FakeWorker) -> None:
        worker.state = WorkerState.STOPPING

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


class FakeScheduler:
    """Periodic jobs: none in these tests."""

    def configure(self, configured: Any, catalog: Catalog) -> list[str]:
        return []

    def start(self) -> None:
        """Nothing to fire."""

    async def stop(self) -> None:
        """Nothing to stop."""


def arbiter() -> tuple[Arbiter, FakePool, FakeDispatcher, Metrics]:
    settings = Settings(workers=1)
    pool, dispatcher, metrics = FakePool(), FakeDispatcher(), Metrics()
    parts: dict[str, Any] = dict.fromkeys(("store", "hooks", "webhooks", "leases", "http"), None)
    parts["engine"] = SimpleNamespace(tracing=None)  # the arbiter reads only whether it traces
    node = Node(
        settings=settings,
        lifecycle=Lifecycle(),
        links=NodeLinks(),
        listeners=Listeners(),
        pool=pool,
        dispatcher=dispatcher,
        metrics=metrics,
        history=History(metrics.finished),
        reload_settings=lambda: settings,
        scheduler=FakeScheduler(),  # type: ignore[arg-type]
        **parts,
    )
    made = Arbiter(node)
    assert pool.listener is made  # the arbiter hears worker events, not job events
    made._booted = True  # these tests drive a node that is up
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

    def crash() -> None:
        gone = pool.workers.pop() if pool.workers else FakeWorker()  # as the pool does
        arb.worker_exited(gone)

    for _ in range(3):
        crash()
    assert pool.spawned == 3
    crash()  # the fourth crash in a row: wait ~1.6 s first
    assert pool.spawned == 3


def test_after_a_reload_old_workers_make_way_as_new_ones_become_ready() -> None:
    arb, pool, _, metrics = arbiter()
    arb.target, arb.generation = 3, 1
    old = [FakeWorker(pid=pid, state=WorkerState.IDLE) for pid in (1, 2, 3)]
    probe = FakeWorker(pid=4, state=WorkerState.IDLE, generation=1)  # booted the new code
    pool.workers = [*old, probe]

    def serving() -> int:
        busy_or_idle = (WorkerState.IDLE, WorkerState.BUSY)
        return sum(1 for w in pool.workers if w.state in busy_or_idle and not w.retire)

    arb.manage_workers()
    assert [w.state for w in old].count(WorkerState.STOPPING) == 1 and pool.spawned == 2
    assert serving() == 3  # never fewer than the target while the new ones boot
    for expected_stopped in (2, 3):
        booting = next(w for w in pool.workers if w.state == WorkerState.BOOTING)
        booting.state = WorkerState.IDLE  # it reported Ready
        arb.manage_workers()
        assert [w.state for w in old].count(WorkerState.STOPPING) == expected_stopped
        assert serving() == 3 and pool.spawned == 2
    assert restarts(metrics, RestartReason.RELOAD) == 3


# -- spawn failures ----------------------------------------------------------------------


class FailingPool(FakePool):
    """Every spawn fails as when descriptors run out."""

    def spawn(self, generation: int, modules: Any = None) -> FakeWorker:
        self.spawned += 1
        raise OSError(errno.EMFILE, "Too many open files")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


def test_a_failing_spawn_is_logged_once_per_backoff_not_once_per_tick(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    monkeypatch.setattr(arbiter_module, "time", clock)
    arb, _, _, _ = arbiter()
    pool = FailingPool()
    arb.pool = pool  # type: ignore[assignment]
    caplog.set_level(logging.ERROR, "goqueue.arbiter")
    for _ in range(200):  # 100 s of ticks
        arb.manage_workers()
        clock.now += 0.5
    lines = [r.getMessage() for r in caplog.records if "cannot start a worker" in r.getMessage()]
    assert pool.spawned == len(lines)  # each attempt logged once, with its errno
    assert 4 <= len(lines) <= 12, lines  # 0.5 s, 1 s, 2 s ... capped at 30 s: not 200
    assert "Too many open files" in lines[0] and "retrying in" in lines[0]


# -- a node that fails, or is stopped, while it boots ------------------------------------


class Recorder:
    """Every part of a node as fakes that write down what was done to them."""

    def __init__(self, opens_failing: int = 0, registers_failing: int = 0) -> None:
        self.calls: list[str] = []
        self.opens_failing = opens_failing
        self.registers_failing = registers_failing
        self.register_error: Exception = StoreUnavailable("database down")

    # store
    node_id = "node-x"

    async def reserve(self) -> None:
        pass

    async def open(self, links: NodeLinks | None = None) -> None:
        self.calls.append("store.open")
        if self.opens_failing:
            self.opens_failing -= 1
            raise StoreUnavailable("connection refused")

    async def register_node(self, limits: Any, **key_rules: Any) -> None:
        self.calls.append("store.register")
        if self.registers_failing:
            self.registers_failing -= 1
            raise self.register_error

    async def close(self) -> None:
        self.calls.append("store.close")


class FakeHttp:
    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    async def start(self) -> None:
        self.calls.append("http.start")

    async def stop(self) -> None:
        self.calls.append("http.stop")


class FakeWebhooks:
    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    async def start(self) -> None:
        self.calls.append("webhooks.start")

    async def close(self, drain_timeout: float = 0.0) -> None:
        self.calls.append("webhooks.close")


class BootingPool(FakePool):
    """A pool whose first worker reports Ready right away."""

    def __init__(self, calls: list[str]) -> None:
        super().__init__()
        self.calls = calls

    def spawn(self, generation: int, modules: Any = None) -> FakeWorker:
        self.spawned += 1
        worker = FakeWorker(state=WorkerState.IDLE)
        ready = Ready(worker.pid, [ActorInfo("noop")])
        asyncio.get_running_loop().call_soon(self.listener.worker_ready, worker, ready)
        return worker

    async def shutdown(self, timeout: float = 5.0) -> None:
        self.calls.append("pool.shutdown")


@dataclass
class FakeEngine:
    catalog: Any = None
    released: int = 0  # waits ended by a stop

    @property
    def waiters(self) -> FakeEngine:
        return self

    def release_all(self) -> None:
        self.released += 1

    def set_catalog(self, catalog: Catalog, reserved: frozenset[str]) -> None:
        self.catalog = catalog


@dataclass
class BootDispatcher(FakeDispatcher):
    def reconfigure(self, catalog: Catalog, policy: Any) -> None:
        self.catalog = catalog


def booting(recorder: Recorder) -> tuple[Arbiter, FakeEngine]:
    settings = Settings(workers=1, shutdown_grace=1.0)
    engine, metrics = FakeEngine(), Metrics()
    node = Node(
        settings=settings,
        lifecycle=Lifecycle(),
        links=NodeLinks(),
        listeners=Listeners(),
        store=recorder,  # type: ignore[arg-type]
        pool=BootingPool(recorder.calls),  # type: ignore[arg-type]
        dispatcher=BootDispatcher(),  # type: ignore[arg-type]
        engine=engine,  # type: ignore[arg-type]
        hooks=None,  # type: ignore[arg-type]
        history=History(metrics.finished),
        metrics=metrics,
        webhooks=FakeWebhooks(recorder.calls),  # type: ignore[arg-type]
        leases=None,  # type: ignore[arg-type]
        http=FakeHttp(recorder.calls),
        scheduler=FakeScheduler(),  # type: ignore[arg-type]
        reload_settings=lambda: settings,
    )
    return Arbiter(node), engine


@pytest.fixture
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(startup_module, "BOOT_RETRY_BASE", 0.01)
    monkeypatch.setattr(startup_module, "BOOT_RETRY_CAP", 0.02)


async def test_the_store_and_the_registration_are_retried_at_boot(quick_retries: None) -> None:
    recorder = Recorder(opens_failing=3, registers_failing=2)
    arb, _ = booting(recorder)
    http = arb.node.http
    await http.start()
    await arb._boot()
    assert recorder.calls == [
        "http.start",
        *["store.open"] * 4,
        *["store.register"] * 3,
    ]
    assert arb.node.lifecycle.phase is NodePhase.SERVING and "noop" in arb.catalog.types


async def test_a_failure_while_booting_closes_what_was_opened_and_exits_non_zero(
    quick_retries: None,
) -> None:
    recorder = Recorder(registers_failing=1)
    recorder.register_error = RuntimeError("a bug")
    arb, _engine = booting(recorder)
    async with asyncio.timeout(5):
        code = await arb.run()
    assert code == arbiter_module.EXIT_FAILED
    assert recorder.calls == [
        "http.start",
        "store.open",
        "store.register",
        "http.stop",  # first: a node that will not run stops answering at once
        "pool.shutdown",
        "webhooks.close",
        "store.close",
    ]


async def test_a_stop_signal_while_the_store_is_down_ends_the_boot(quick_retries: None) -> None:
    recorder = Recorder(opens_failing=10**9)  # the database never comes up
    arb, _engine = booting(recorder)
    run = asyncio.ensure_future(arb.run())
    async with asyncio.timeout(5):
        while recorder.calls.count("store.open") < 3:
            await asyncio.sleep(0.01)
        arb._queue_signal(signal.SIGTERM)
        code = await run
    assert code == arbiter_module.EXIT_OK
    assert recorder.calls[-4:] == ["http.stop", "pool.shutdown", "webhooks.close", "store.close"]
