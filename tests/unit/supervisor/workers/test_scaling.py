"""The scaling decision, driven tick by tick with a fake clock."""

from __future__ import annotations

import pytest
from goqueue.supervisor.common.enums import WorkerState
from goqueue.supervisor.common.errors import ConfigError
from goqueue.supervisor.settings.config import load
from goqueue.supervisor.workers.scaling import Bounds, Counts, Scaler

pytestmark = pytest.mark.timeout(10)


class Pool:
    """Workers that boot in one tick; `busy` of them run jobs."""

    def __init__(self, scaler: Scaler) -> None:
        self.scaler = scaler
        self.workers = scaler.target
        self.busy = 0
        self.history: list[int] = []

    def tick(self, now: float, *, demand: int, waited: float = 0.0) -> int:
        """`demand` jobs want a worker; those beyond the workers wait `waited` seconds."""
        self.busy = min(demand, self.workers)
        target = self.scaler.decide(
            now,
            workers=self.workers,
            idle=self.workers - self.busy,
            booting=0,
            waited=waited if demand > self.workers else 0.0,
        )
        self.workers = target  # spawned ready by the next tick, or retired while idle
        self.history.append(target)
        return target


def test_a_fixed_pool_never_moves() -> None:
    scaler = Scaler(Bounds(3, 3), 1.0)
    pool = Pool(scaler)
    assert [pool.tick(t, demand=10, waited=5.0) for t in range(5)] == [3] * 5


def test_grows_one_at_a_time_up_to_max_while_jobs_wait_and_none_is_idle() -> None:
    pool = Pool(Scaler(Bounds(1, 4), 2.0))
    for t in range(8):
        pool.tick(t * 0.5, demand=8, waited=1.0)
    assert pool.history == [2, 3, 4, 4, 4, 4, 4, 4]


def test_a_job_that_has_waited_less_than_grow_after_adds_nobody() -> None:
    pool = Pool(Scaler(Bounds(1, 4), 2.0, grow_after=0.5))
    assert pool.tick(0.0, demand=3, waited=0.2) == 1


def test_no_growth_while_a_worker_boots_or_one_is_idle() -> None:
    scaler = Scaler(Bounds(1, 4), 2.0)
    assert scaler.decide(0.0, workers=2, idle=0, booting=1, waited=9.0) == 1
    assert scaler.decide(0.1, workers=2, idle=1, booting=0, waited=9.0) == 1


def test_shrinks_to_min_once_the_spare_workers_were_idle_the_whole_window() -> None:
    pool = Pool(Scaler(Bounds(1, 4), 2.0))
    for t in range(3):
        pool.tick(t * 0.5, demand=8, waited=1.0)
    assert pool.workers == 4
    counts = [pool.tick(2.0 + t * 0.5, demand=0) for t in range(6)]
    assert counts == [4, 4, 4, 4, 1, 1]  # idle from 2.0: at 4.0 the window has passed


def test_a_brief_dip_in_idleness_restarts_the_window() -> None:
    pool = Pool(Scaler(Bounds(1, 4), 2.0))
    pool.workers = pool.scaler.target = 4
    pool.tick(0.0, demand=0)
    pool.tick(1.5, demand=4)  # every worker busy for a moment
    assert pool.tick(3.0, demand=0) == 4
    assert pool.tick(4.9, demand=0) == 4
    assert pool.tick(5.0, demand=0) == 1


def test_a_steady_load_holds_a_steady_count() -> None:
    """Three jobs at a time, arriving as fast as they finish: three workers stay busy."""
    pool = Pool(Scaler(Bounds(1, 8), 2.0))
    for t in range(200):
        pool.tick(t * 0.5, demand=3, waited=1.0)
    assert pool.history[:2] == [2, 3]
    assert set(pool.history[2:]) == {3}


def test_only_the_workers_spare_all_along_are_retired() -> None:
    pool = Pool(Scaler(Bounds(1, 6), 2.0))
    pool.workers = pool.scaler.target = 6
    for t in range(10):  # two busy all along: four spare
        pool.tick(t * 0.5, demand=2)
    assert pool.workers == 2


def test_signals_move_the_bounds_and_the_target_inside_them() -> None:
    scaler = Scaler(Bounds(2, 4), 2.0)
    assert scaler.rebound(scaler.bounds.raised()) == 3
    assert scaler.bounds == Bounds(3, 5)
    scaler.rebound(scaler.bounds.lowered())
    scaler.rebound(scaler.bounds.lowered())
    assert scaler.bounds == Bounds(1, 3) and scaler.target == 3  # inside: kept
    scaler.rebound(scaler.bounds.lowered())
    assert scaler.bounds == Bounds(1, 2) and scaler.target == 2
    assert Bounds(1, 1).lowered() == Bounds(1, 1)
    assert Bounds(3, 3).lowered() == Bounds(2, 2)


@pytest.mark.parametrize(("raw", "bounds"), [("4", (4, 4)), ("1:8", (1, 8)), (" 2:2 ", (2, 2))])
def test_workers_takes_a_count_or_a_range(raw: str, bounds: tuple[int, int]) -> None:
    assert load(None, {"GOQUEUE_WORKERS": raw}).worker_bounds == bounds


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ("4:1", "MIN must not exceed MAX"),
        ("0:3", "at least 1"),
        ("1:x", "an integer N or a range MIN:MAX"),
        ("1:2:3", "an integer N or a range MIN:MAX"),
    ],
)
def test_a_bad_range_is_refused_naming_the_option(raw: str, says: str) -> None:
    with pytest.raises(ConfigError, match="workers") as caught:
        load(None, {"GOQUEUE_WORKERS": raw})
    assert says in str(caught.value)


def test_scale_down_after_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="scale_down_after"):
        load(None, {"GOQUEUE_SCALE_DOWN_AFTER": "0"})


class FakeWorker:
    def __init__(self, state: WorkerState, retire: bool = False) -> None:
        self.state, self.retire = state, retire


def test_counts_leave_out_stopping_and_retiring_workers() -> None:
    workers = [
        FakeWorker(WorkerState.IDLE),
        FakeWorker(WorkerState.BUSY),
        FakeWorker(WorkerState.BOOTING),
        FakeWorker(WorkerState.STOPPING),
        FakeWorker(WorkerState.IDLE, retire=True),
    ]
    # a stand-in for the pool's Worker, which needs a process: only these two are read
    assert Counts.of(workers) == Counts(workers=3, idle=1, booting=1)  # type: ignore[arg-type]
