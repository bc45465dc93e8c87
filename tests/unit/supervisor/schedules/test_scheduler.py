"""The scheduler on its own, with a clock moved by hand and the memory store (which
here also stands for what PostgreSQL remembers across a restart: a second scheduler on
the same store is the node started again). Milliseconds, no sleeping."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import msgspec
import pytest
from goqueue.actors.protocol import ActorInfo
from goqueue.supervisor.common.catalog import Catalog
from goqueue.supervisor.common.reads import JobFilter
from goqueue.supervisor.common.schedule import Missed, ScheduleSpec
from goqueue.supervisor.observe.metrics import Metrics
from goqueue.supervisor.schedules.scheduler import MAX_SLEEP, Scheduler
from goqueue.supervisor.store.memory.store import MemoryStore

pytestmark = pytest.mark.timeout(10)

START = datetime(2030, 1, 31, 9, 0, 3, tzinfo=UTC)
CATALOG = Catalog([ActorInfo("t", queue="reports", priority=8), ActorInfo("a")], {})


class Clock:
    def __init__(self) -> None:
        self.at = START

    def now(self) -> datetime:
        return self.at

    def advance(self, seconds: float) -> None:
        self.at += timedelta(seconds=seconds)


def every(seconds: int, missed: Missed = Missed.ONCE, **fields: object) -> ScheduleSpec:
    return ScheduleSpec(name="s", type="t", every_seconds=seconds, missed=missed, **fields)


def make(clock: Clock, store: MemoryStore | None = None) -> tuple[Scheduler, MemoryStore]:
    store = store or MemoryStore("n", clock=clock.now)
    return Scheduler(store, lambda job: None, Metrics(), clock=clock.now), store


async def details(store: MemoryStore) -> list[str]:
    """Each job's `enqueued` detail, oldest first."""
    page = await store.list_jobs(JobFilter(), 1000, 0)
    return [(await store.events(job.id))[0].detail or "" for job in reversed(page.items)]


async def test_it_sleeps_until_the_next_tick_then_fires_it_with_the_actors_defaults() -> None:
    clock = Clock()
    scheduler, store = make(clock)
    assert scheduler.configure([every(10, payload={"n": 1})], CATALOG) == []
    await scheduler.recover()
    assert await scheduler.tick() == pytest.approx(7.0)  # 09:00:03 -> 09:00:10
    assert await details(store) == []
    clock.advance(7.2)  # woken a little late: it still fires
    assert await scheduler.tick() == pytest.approx(9.8)
    (job,) = (await store.list_jobs(JobFilter(), 10, 0)).items
    assert job.type == "t" and job.queue == "reports" and job.priority == 8
    assert msgspec.json.decode(job.payload) == {"n": 1}
    assert await details(store) == ["schedule s at 2030-01-31T09:00:10Z"]
    assert await scheduler.tick() == pytest.approx(9.8)  # the same tick never again
    assert len(await details(store)) == 1
    view = (await scheduler.views())[0]
    assert view.state.last_job_id == job.id and view.next_fire == START + timedelta(seconds=17)
    assert view.source == "config"


async def test_a_stalled_node_fires_only_the_latest_tick_never_a_burst() -> None:
    clock = Clock()
    scheduler, store = make(clock)
    scheduler.configure([every(10)], CATALOG)
    await scheduler.recover()
    clock.advance(65)  # six ticks passed while the loop was stalled
    await scheduler.tick()
    assert await details(store) == ["schedule s at 2030-01-31T09:01:00Z"]


@pytest.mark.parametrize("missed", [Missed.ONCE, Missed.SKIP])
async def test_ticks_missed_while_no_node_ran(missed: Missed) -> None:
    clock = Clock()
    first, store = make(clock)
    first.configure([every(10, missed)], CATALOG)
    await first.recover()
    clock.advance(7)
    await first.tick()  # fires 09:00:10
    clock.advance(33)  # the node is down from 09:00:11 to 09:00:43: 20, 30, 40 missed
    again, _ = make(clock, store)
    again.configure([every(10, missed)], CATALOG)
    await again.recover()
    fired = await details(store)
    if missed == Missed.ONCE:
        assert fired[1:] == ["schedule s at 2030-01-31T09:00:40Z, missed"]
    else:
        assert fired[1:] == []
    clock.advance(7)
    await again.tick()  # the next tick, as usual
    assert (await details(store))[-1] == "schedule s at 2030-01-31T09:00:50Z"


async def test_a_new_schedule_misses_nothing_and_a_disabled_one_fires_nothing() -> None:
    clock = Clock()
    scheduler, store = make(clock)
    scheduler.configure([every(10)], CATALOG)
    await scheduler.recover()
    view = await scheduler.set_enabled("s", False)
    assert view is not None and not view.state.enabled and view.next_fire is None
    assert await scheduler.set_enabled("nope", False) is None
    clock.advance(7)
    await scheduler.tick()
    assert await details(store) == []
    clock.advance(30)  # off for three ticks, then on again at 09:00:40
    await scheduler.set_enabled("s", True)
    again, _ = make(clock, store)  # and started again: the off ticks were not missed
    again.configure([every(10)], CATALOG)
    await again.recover()
    assert await details(store) == []
    clock.advance(10)
    await again.tick()
    assert await details(store) == ["schedule s at 2030-01-31T09:00:50Z"]


async def test_reconfigure_adds_changes_and_removes_schedules() -> None:
    clock = Clock()
    scheduler, store = make(clock)
    actors = Catalog([*CATALOG.actors.values(), ActorInfo("report", schedule="0 * * * *")], {})
    scheduler.configure([every(10)], actors)
    await scheduler.recover()
    assert [v.spec.name for v in await scheduler.views()] == ["report", "s"]
    assert [v.source for v in await scheduler.views()] == ["actor", "config"]
    changed = ScheduleSpec(name="s", type="a", every_seconds=5)
    added = ScheduleSpec(name="x", type="a", every_seconds=20)
    scheduler.configure([changed, added], Catalog(CATALOG.actors.values(), {}))
    assert sorted(scheduler.specs) == ["s", "x"]
    clock.advance(2)  # 09:00:05: the changed one fires; report is gone
    assert await scheduler.tick() == pytest.approx(5.0)
    assert await details(store) == ["schedule s at 2030-01-31T09:00:05Z"]


async def test_an_invalid_actor_schedule_is_left_out_and_named() -> None:
    scheduler, _ = make(Clock())
    bad = Catalog([ActorInfo("report", schedule="61 * * * *")], {})
    assert scheduler.configure([], bad) == [
        "@actor('report'): schedule: cron: Bad minute in '61 * * * *'"
    ]
    assert scheduler.specs == {}


async def test_with_nothing_to_fire_it_sleeps_the_longest_it_may() -> None:
    scheduler, _ = make(Clock())
    scheduler.configure([], CATALOG)
    await scheduler.recover()
    assert await scheduler.tick() == MAX_SLEEP
