"""The store's side of periodic jobs, on both stores: a tick fires once however many
nodes try it (and never after a later one), disabling refuses ticks, and the state
(enabled, last fire, its job) reads back as written."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import msgspec
import pytest
from goqueue.supervisor.common.jobs import JobSpec
from goqueue.supervisor.common.schedule import Fired
from goqueue.supervisor.store.base import NewJob

pytestmark = pytest.mark.timeout(30)

TICK = datetime(2030, 1, 31, 9, 0, tzinfo=UTC)


def new(type: str = "a") -> NewJob:
    spec = JobSpec(type=type, queue="default", priority=5, max_retries=3)
    spec.payload = msgspec.Raw(b'{"n":1}')
    return NewJob(spec=spec, max_retries=3)


async def test_a_tick_fires_once_and_is_remembered(open_store) -> None:
    async with open_store() as store:
        fired, job = await store.fire_schedule("hourly", TICK, new())
        assert fired == Fired.FIRED and job is not None and job.status == "pending"
        assert (await store.fire_schedule("hourly", TICK, new())) == (Fired.TAKEN, None)
        earlier = TICK - timedelta(hours=1)  # never after a later tick
        assert (await store.fire_schedule("hourly", earlier, new())) == (Fired.TAKEN, None)
        state = (await store.schedule_states())["hourly"]
        assert state.enabled and state.last_fire == TICK and state.last_job_id == job.id
        events = await store.events(job.id)
        assert [e.event for e in events] == ["enqueued"]
        assert events[0].detail == "schedule hourly at 2030-01-31T09:00:00Z"
        # another schedule's tick at the same time is its own
        assert (await store.fire_schedule("other", TICK, new()))[0] == Fired.FIRED


async def test_a_missed_tick_says_so_in_its_event(open_store) -> None:
    async with open_store() as store:
        fired, job = await store.fire_schedule("s", TICK, new(), missed=True)
        assert fired == Fired.FIRED and job is not None
        (event,) = await store.events(job.id)
        assert event.detail == "schedule s at 2030-01-31T09:00:00Z, missed"


async def test_disabled_schedules_fire_nothing_until_enabled(open_store) -> None:
    async with open_store() as store:
        assert "s" not in await store.schedule_states()
        off = await store.set_schedule_enabled("s", False)
        assert not off.enabled and off.last_fire is None
        assert (await store.fire_schedule("s", TICK, new())) == (Fired.DISABLED, None)
        on = await store.set_schedule_enabled("s", True)
        assert on.enabled and on.enabled_at is not None
        again = await store.set_schedule_enabled("s", True)  # the same twice: no change
        assert again.enabled_at == on.enabled_at
        assert (await store.fire_schedule("s", TICK, new()))[0] == Fired.FIRED
        assert (await store.schedule_states())["s"].enabled


async def test_two_nodes_racing_for_one_tick_fire_it_once(open_store) -> None:
    async with open_store("node-a") as a, open_store("node-b") as b:
        ticks = [TICK + timedelta(seconds=i) for i in range(10)]
        fired = []
        for tick in ticks:  # each tick tried four times at once, from both nodes
            answers = await asyncio.gather(
                *(s.fire_schedule("race", tick, new()) for s in (a, b) * 2)
            )
            won = [job for outcome, job in answers if outcome == Fired.FIRED]
            assert len(won) == 1, answers
            assert sorted(outcome for outcome, _ in answers).count(Fired.TAKEN) == 3
            fired += won
        assert len({job.id for job in fired if job}) == len(ticks)
        assert (await a.schedule_states())["race"].last_fire == ticks[-1]
        assert (await b.schedule_states())["race"].last_job_id == fired[-1].id
