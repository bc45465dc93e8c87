"""The dispatcher on its own: a fake store and a fake pool, a clock and a sleep it is
handed, no processes. Each test runs in milliseconds."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import pytest
from goqueue.actors.protocol import ActorInfo, JobDone, JobFailed
from goqueue.supervisor.common.catalog import Catalog
from goqueue.supervisor.common.enums import AttemptOutcome, KillReason, Status, WorkerState
from goqueue.supervisor.common.errors import StoreUnavailable
from goqueue.supervisor.common.hooks import Hook
from goqueue.supervisor.common.jobs import Enqueued, Job, JobSpec, Lease, Outcome
from goqueue.supervisor.common.rates import Rate, Taken
from goqueue.supervisor.dispatch import in_hand as in_hand_module
from goqueue.supervisor.dispatch.attempts import Phase
from goqueue.supervisor.dispatch.dispatcher import Dispatcher
from goqueue.supervisor.dispatch.outcomes import Hooks
from goqueue.supervisor.dispatch.policy import Policy
from goqueue.supervisor.store.base import NewJob, StoreTraits
from goqueue.supervisor.workers.handle import Worker
from goqueue.supervisor.workers.pool import Handoff, Recycle

pytestmark = pytest.mark.timeout(10)

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def lease(job_type: str, priority: int = 5, *, attempts: int = 1, max_retries: int = 3) -> Lease:
    """A running lease on a fresh job of `job_type`."""
    spec = JobSpec(type=job_type, priority=priority)
    job = Job.from_spec(spec, now=NOW, max_retries=max_retries)
    job.status, job.attempts = Status.RUNNING, attempts
    return Lease(job=job, token=f"token-{job.id}", owner="node", expires_at=NOW)


class FakeStore:
    """Hands out the leases it holds, best first, within the slots asked for; records
    every call in the shared `log`, and fails writes while `down` counts down."""

    def __init__(self, log: list[Any], leases: list[Lease] | None = None) -> None:
        self.log = log
        self.leases = list(leases or [])
        self.claims: list[tuple[int, dict[str, int]]] = []
        self.down = 0
        self.window_left = 1.0  # seconds left of each rate window a start is taken from
        self.during_claim: list[Any] = []  # called while a claim is in flight
        self.hold: asyncio.Event | None = None  # the next enqueue waits for it
        self.keep_pending = False  # an enqueue to start is stored pending (a paused queue)
        self.starts: list[tuple[int | None, frozenset[str]]] = []  # each claim's starts
        self.refused_starts = 0  # the next starts fail (the store unavailable)
        self.refused_claims = 0  # the next claims fail (the store unavailable)

    async def take_starts(self, job_type: str, rate: Rate, want: int) -> Taken:
        return Taken(min(want, rate.limit), 0.0, self.window_left)

    async def return_starts(self, job_type: str, window: float, count: int) -> None:
        self.log.append(("return_starts", job_type, count))

    async def claim(
        self,
        limit: int,
        queues: frozenset[str] | None,
        slots: dict[str, int],
        start: int | None = None,
        start_types: frozenset[str] = frozenset(),
    ) -> list[Lease]:
        self.claims.append((limit, dict(slots)))
        self.starts.append((start, start_types))
        if self.refused_claims:
            self.refused_claims -= 1
            raise StoreUnavailable("database or disk is full")
        for call in self.during_claim:
            call()
        free, taken = dict(slots), []
        for held in list(self.leases):
            if len(taken) < limit and free.get(held.job.type, 0) > 0:
                free[held.job.type] -= 1
                taken.append(held)
                self.leases.remove(held)
        return taken

    def next_due_at(self) -> datetime | None:
        return None

    async def _write(self, what: str, held: Lease, status: Status) -> Outcome:
        if self.down:
            self.down -= 1
            raise StoreUnavailable("database down")
        self.log.append((what, held.job.id))
        return Outcome(msgspec.structs.replace(held.job, status=status), [])

    async def complete(self, held: Lease, result: msgspec.Raw | None) -> Outcome:
        return await self._write("complete", held, Status.DONE)

    async def fail(
        self, held: Lease, error: str, retry_at: datetime | None, traceback: str | None = None
    ) -> Outcome:
        self.log.append(("fail:args", error, retry_at))
        return await self._write("fail", held, Status.PENDING if retry_at else Status.FAILED)

    async def start(self, held: Lease) -> Lease:
        self.log.append(("start", held.job.id))
        if self.refused_starts:
            self.refused_starts -= 1
            raise StoreUnavailable("database or disk is full")
        held.job.status = Status.RUNNING
        return held

    async def release(self, held: Lease) -> bool:
        self.log.append(("release", held.job.id))
        return True

    async def enqueue(self, new: NewJob) -> Enqueued:
        """Stores it started when asked to (`new.start`) unless `keep_pending`; the first
        enqueue after `hold` is set waits for it (an enqueue in flight)."""
        hold, self.hold = self.hold, None
        if hold is not None:
            await hold.wait()
        job = Job.from_spec(new.spec, now=NOW, max_retries=new.max_retries)
        if new.start is None or self.keep_pending:
            return Enqueued(job, True)
        job.status, job.attempts = Status.RUNNING, 1
        return Enqueued(
            job, True, Lease(job=job, token=f"token-{job.id}", owner="node", expires_at=NOW)
        )


def worker(types: frozenset[str], pid: int = 4242) -> Worker:
    """A worker handle with no process behind it, booted and idle."""
    made = Worker(1, 0, pid, -1, None)  # type: ignore[arg-type]  # no pipe: nothing is sent
    made.booted(types)
    return made


@dataclass
class FakePool:
    """Workers, and a record of what was handed to which: runs (started at once),
    handoffs (queued), goes, withdrawals and kills."""

    workers: list[Worker] = field(default_factory=list)
    runs: list[tuple[Worker, Lease, float]] = field(default_factory=list)
    handoffs: list[tuple[Worker, list[Handoff]]] = field(default_factory=list)
    goes: list[tuple[Worker, list[str]]] = field(default_factory=list)
    withdrawals: list[tuple[Worker, list[str]]] = field(default_factory=list)
    kills: list[tuple[Worker, KillReason]] = field(default_factory=list)
    recycle: Recycle = field(default_factory=Recycle)
    lease_allowance: float | None = None

    def __iter__(self) -> Iterator[Worker]:
        return iter(list(self.workers))

    def idle(self) -> list[Worker]:
        return [w for w in self.workers if w.state == WorkerState.IDLE]

    def run(self, worker: Worker, held: Lease, timeout: float) -> None:
        worker.begin(held)
        self.runs.append((worker, held, timeout))

    def hand(self, worker: Worker, handoffs: list[Handoff]) -> None:
        for handoff in handoffs:
            worker.queue(handoff.lease, handoff.timeout, handoff.start_by)
        self.handoffs.append((worker, handoffs))

    def go(self, worker: Worker, job_ids: list[str]) -> None:
        self.goes.append((worker, job_ids))

    def withdraw(self, worker: Worker, job_ids: list[str]) -> None:
        self.withdrawals.append((worker, job_ids))

    def idle_for(self, job_type: str, skip: set[int]) -> Worker | None:
        return next((w for w in self.idle() if job_type in w.types and id(w) not in skip), None)

    def is_idle(self, worker: Worker) -> bool:
        return any(w is worker for w in self.idle())

    def holding(self, token: str) -> Worker | None:
        return next((w for w in self.workers if w.holds(token)), None)

    def kill(self, worker: Worker, reason: KillReason) -> None:
        self.kills.append((worker, reason))


class Recorder(Hook):
    """Appends each call it gets to the shared log, tagged with its name."""

    def __init__(self, name: str, log: list[Any]) -> None:
        self.name, self.log = name, log

    def after_start(self, job: Job) -> None:
        self.log.append((self.name, "start", job.id))

    def after_attempt(self, job_type: str, outcome: AttemptOutcome, duration: float) -> None:
        self.log.append((self.name, "attempt", job_type, outcome))

    def after_error(self, job: Job, error: str, traceback: str) -> None:
        self.log.append((self.name, "error", error))

    def after_outcome(self, outcome: Outcome) -> None:
        self.log.append((self.name, "outcome", outcome.job.id, outcome.job.status))


class Broken(Hook):
    """A hook with a bug."""

    def after_outcome(self, outcome: Outcome) -> None:
        raise RuntimeError("hook bug")


@dataclass
class Rig:
    """A dispatcher and its fakes, sharing one log of what happened, in order."""

    dispatcher: Dispatcher
    store: FakeStore
    pool: FakePool
    log: list[Any]
    sleeps: list[float]


def rig(
    *,
    actors: list[ActorInfo] | None = None,
    leases: list[Lease] | None = None,
    workers: list[Worker] | None = None,
    hooks: list[Hook] | None = None,
    prefetch: int = 0,
    ticks: list[float] | None = None,
    at_once: bool = False,
    durable: bool = True,
) -> Rig:
    log: list[Any] = []
    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)

    store = FakeStore(log, leases)
    pool = FakePool(list(workers or []))
    catalog = Catalog(actors or [ActorInfo("a"), ActorInfo("b")], {})
    dispatcher = Dispatcher(
        store,
        pool,
        catalog,
        Hooks(hooks if hooks is not None else [Recorder("hook", log)]),
        # its writes are tasks unless `at_once` (so a test sees them still held); the
        # dispatcher's drained state decides a start at enqueue
        traits=StoreTraits(durable=durable, answers_at_once=at_once, sees_ahead=False),
        policy=Policy(retry_base=1.0, retry_cap=60.0, lease_seconds=3.0),
        prefetch=prefetch,
        clock=lambda: NOW,
        sleep=sleep,
        monotonic=(lambda: ticks[0]) if ticks else (lambda: 0.0),
    )
    dispatcher.rng = dispatcher.outcomes.rng = random.Random(7)
    return Rig(dispatcher, store, pool, log, sleeps)


def both() -> frozenset[str]:
    return frozenset({"a", "b"})


def ran_on(r: Rig, held: Lease) -> Worker:
    """The worker `held` was run on (ended there, as the pool ends it before reporting)."""
    (ran,) = [w for w, x, _ in r.pool.runs if x.token == held.token]
    ran.end(0)
    return ran


async def test_claims_respect_per_type_slots_and_cost_nothing_when_drained() -> None:
    actors = [ActorInfo("a", concurrency=1), ActorInfo("b")]
    queued = [lease("a"), lease("a"), lease("b")]
    r = rig(actors=actors, leases=queued, workers=[worker(both()) for _ in range(3)])
    await r.dispatcher.fill()
    assert r.store.claims == [(3, {"a": 1, "b": 3})]
    started = [held.job.type for _, held, _ in r.pool.runs]
    assert sorted(started) == ["a", "b"]  # the second "a" waits for the one slot
    await r.dispatcher.fill()  # the last claim came back short and nothing changed since
    assert len(r.store.claims) == 1
    r.dispatcher.wake()
    await r.dispatcher.fill()
    assert r.store.claims[-1] == (1, {"b": 1})  # the "a" slot is still taken


async def test_a_claim_that_failed_gives_back_the_starts_it_took_of_a_rate_limit() -> None:
    actors = [ActorInfo("a", rate_limit="5/s"), ActorInfo("b")]
    r = rig(actors=actors, leases=[lease("a")], workers=[worker(both())])
    r.store.refused_claims = 1
    await r.dispatcher.fill()
    assert r.pool.runs == [] and ("return_starts", "a", 1) in r.log  # not spent on nothing
    r.log.clear()
    r.dispatcher.wake()
    await r.dispatcher.fill()  # the store is back: the same start is taken and used
    assert [held.job.type for _, held, _ in r.pool.runs] == ["a"]
    assert not [x for x in r.log if x[0] == "return_starts"]


async def test_a_lease_the_claim_started_waits_in_hand_if_its_worker_went_away_meanwhile() -> None:
    held = lease("a")
    leaving, other = worker(both()), worker(both())
    r = rig(leases=[held], workers=[leaving])

    def worker_swap() -> None:  # during the claim: the kept worker dies, another boots
        r.pool.workers.remove(leaving)  # reaped while idle: its state still says idle
        r.pool.workers.append(other)

    r.store.during_claim.append(worker_swap)
    await r.dispatcher.fill()
    assert [(w, x) for w, x, _ in r.pool.runs] == [(other, held)]  # charged: it still runs
    assert r.dispatcher.held_leases() == [held]


async def test_a_freed_worker_wakes_the_dispatcher_only_when_a_pass_could_do_something() -> None:
    held = lease("a")
    r = rig(leases=[held], workers=[worker(both()), worker(both())])
    await r.dispatcher.fill()  # came back short: drained as of now
    wake = r.dispatcher.wakeup.event
    wake.clear()
    r.dispatcher.job_done(held, JobDone(held.job.id, b"1", 0.5), ran_on(r, held))
    assert not wake.is_set()  # nothing in hand, nothing new: no pass
    r.dispatcher.wake()  # a job was enqueued
    assert wake.is_set()
    wake.clear()
    r.store.leases.append(lease("a"))
    r.dispatcher.nudge()  # the enqueue since the last claim is still unclaimed
    assert wake.is_set()


async def test_a_due_time_that_came_before_its_timer_fired_still_wakes_the_dispatcher() -> None:
    r = rig(workers=[worker(both())])
    now = [NOW]
    asked: list[datetime] = []  # when each pass asked the store for the next due time

    def next_due_at() -> datetime | None:
        asked.append(now[0])
        return NOW + timedelta(seconds=30) if len(asked) == 1 else None  # then past

    r.dispatcher.clock = lambda: now[0]
    r.store.next_due_at = next_due_at  # type: ignore[method-assign]

    async def passes(count: int) -> None:
        for _ in range(100):
            if len(asked) >= count:
                return
            await asyncio.sleep(0)
        raise AssertionError(asked)

    loop = asyncio.create_task(r.dispatcher.run())
    try:
        r.dispatcher.wake()
        await passes(1)  # the first pass set a timer 30 s ahead
        now[0] += timedelta(seconds=31)  # its time came; the loop has not fired it yet
        r.dispatcher.wake()  # another pass first: the store answers no time now
        await passes(3)  # the timer's wake, made by that pass: one more pass
        assert asked == [NOW, now[0], now[0]]
    finally:
        loop.cancel()


async def test_an_outcome_goes_to_the_store_then_to_each_hook_in_order() -> None:
    log: list[Any] = []
    hooks = [Recorder("first", log), Broken(), Recorder("second", log)]
    held = lease("a")
    r = rig(leases=[held], workers=[worker(both())], hooks=hooks)
    r.log = r.store.log = log
    await r.dispatcher.fill()
    r.dispatcher.job_done(held, JobDone(held.job.id, b"1", 0.5), ran_on(r, held))
    await r.dispatcher.flush(5)
    assert log == [
        ("first", "start", held.job.id),
        ("second", "start", held.job.id),
        ("first", "attempt", "a", AttemptOutcome.SUCCEEDED),
        ("second", "attempt", "a", AttemptOutcome.SUCCEEDED),
        ("complete", held.job.id),
        ("first", "outcome", held.job.id, Status.DONE),
        # the broken hook raised in between: logged, and the next hook still ran
        ("second", "outcome", held.job.id, Status.DONE),
    ]
    assert r.dispatcher.held_leases() == []


async def test_an_outcome_write_is_held_while_the_store_is_unavailable() -> None:
    held = lease("a")
    r = rig(leases=[held], workers=[worker(both())])
    await r.dispatcher.fill()
    r.store.down = 3
    r.dispatcher.job_done(held, JobDone(held.job.id, b"1", 0.5), ran_on(r, held))
    assert r.dispatcher.held_leases() == [held]  # heartbeated until its outcome is written
    await r.dispatcher.flush(5)
    assert r.dispatcher.held_leases() == []
    assert ("complete", held.job.id) in r.log
    assert r.log[-1] == ("hook", "outcome", held.job.id, Status.DONE)  # told once, after
    assert len(r.sleeps) == 3
    for waited, nominal in zip(r.sleeps, (0.2, 0.4, 0.8), strict=True):
        assert 0.75 * nominal <= waited <= 1.25 * nominal


async def test_a_store_that_never_waits_has_an_outcome_written_before_the_report_returns() -> None:
    held = lease("a")
    r = rig(leases=[held], workers=[worker(both())], at_once=True)
    await r.dispatcher.fill()
    r.dispatcher.job_done(held, JobDone(held.job.id, b"1", 0.5), ran_on(r, held))
    assert r.log[-2:] == [("complete", held.job.id), ("hook", "outcome", held.job.id, Status.DONE)]
    assert r.dispatcher.held_leases() == []
    assert not r.dispatcher.outcomes._writes  # no task was needed


async def test_a_write_that_must_wait_for_the_store_goes_on_in_a_task_holding_its_lease() -> None:
    held = lease("a")
    r = rig(leases=[held], workers=[worker(both())], at_once=True)
    waited: list[float] = []

    async def sleep(seconds: float) -> None:  # really waits, unlike the rig's
        waited.append(seconds)
        await asyncio.sleep(0)

    r.dispatcher.outcomes.sleep = sleep
    await r.dispatcher.fill()
    r.store.down = 2
    r.dispatcher.job_done(held, JobDone(held.job.id, b"1", 0.5), ran_on(r, held))
    assert r.dispatcher.held_leases() == [held]  # heartbeated until its outcome is written
    assert ("complete", held.job.id) not in r.log
    await r.dispatcher.flush(5)
    assert len(waited) == 2 and r.dispatcher.held_leases() == []
    assert r.log[-2:] == [("complete", held.job.id), ("hook", "outcome", held.job.id, Status.DONE)]


def in_hand(r: Rig) -> list[Lease]:
    """The leases in the dispatcher's hand, in order."""
    return [attempt.lease for attempt in r.dispatcher.attempts.hand]


async def into_hand(r: Rig, *leases: Lease) -> Worker:
    """Put `leases` in the dispatcher's hand the way a running node does: a worker busy
    with a job has room in its queue, so the next due jobs are claimed for it; these are
    of a type whose run time is not known yet, so none may wait in a queue, and they wait
    in hand for an idle worker. Returns the busy worker."""
    busy = worker(both(), pid=1)
    busy.begin(lease("b"))
    r.pool.workers.append(busy)
    r.dispatcher.durations.add("b", 0.002)  # it runs short: jobs may wait behind it
    r.dispatcher.depth.current = 4
    r.store.leases += leases
    await r.dispatcher.fill()
    assert in_hand(r) == list(leases)
    return busy


async def test_leases_in_hand_are_handed_out_best_first_to_workers_that_know_the_type() -> None:
    best_a, best_b, next_a = lease("a", 9), lease("b", 7), lease("a", 1)
    r = rig(prefetch=3)
    await into_hand(r, best_a, best_b, next_a)
    assert r.pool.runs == [] and r.dispatcher.held_leases() == [best_a, best_b, next_a]
    assert len(r.store.claims) == 1  # nothing more is claimed behind them meanwhile
    only_b, any_type = worker(frozenset({"b"})), worker(both())
    r.pool.workers += [only_b, any_type]
    r.dispatcher.wakeup.seen = r.dispatcher.wakeup.news  # nothing more to claim
    await r.dispatcher.fill()
    assert [(w, held) for w, held, _ in r.pool.runs] == [(only_b, best_b), (any_type, best_a)]
    assert r.dispatcher.held_leases() == [best_b, best_a, next_a]  # running, then in hand


async def test_a_failure_retries_after_backoff_until_retries_run_out() -> None:
    first, last = lease("a", attempts=1, max_retries=1), lease("a", attempts=2, max_retries=1)
    r = rig(leases=[first, last], workers=[worker(both()), worker(both())])
    await r.dispatcher.fill()
    failed = JobFailed(first.job.id, "boom", 0.1, traceback="Trace")
    r.dispatcher.job_failed(first, failed, ran_on(r, first))
    r.dispatcher.job_failed(last, JobFailed(last.job.id, "boom", 0.1), ran_on(r, last))
    await r.dispatcher.flush(5)
    retries = [entry[2] for entry in r.log if entry[0] == "fail:args"]
    assert retries[1] is None  # attempt 2 of max_retries=1: dead-lettered
    assert NOW + timedelta(seconds=0.75) <= retries[0] <= NOW + timedelta(seconds=1.25)
    assert ("hook", "error", "boom") in r.log  # only the attempt with a traceback
    assert r.log.count(("hook", "error", "boom")) == 1


async def test_a_worker_lost_to_a_timeout_fails_the_attempt_and_a_cancel_writes_nothing() -> None:
    timed_out, cancelled = lease("a"), lease("b")
    workers = [worker(both()), worker(both())]
    r = rig(leases=[timed_out, cancelled], workers=workers)
    await r.dispatcher.fill()
    by_token = {held.token: w for w, held, _ in r.pool.runs}
    assert r.dispatcher.cancel_lease(cancelled.token)
    assert r.pool.kills == [(by_token[cancelled.token], KillReason.CANCEL)]
    by_token[cancelled.token].kill_reason = KillReason.CANCEL
    by_token[timed_out.token].kill_reason = KillReason.TIMEOUT
    r.dispatcher.job_lost(cancelled, by_token[cancelled.token])
    r.dispatcher.job_lost(timed_out, by_token[timed_out.token])
    await r.dispatcher.flush(5)
    assert ("hook", "attempt", "a", AttemptOutcome.TIMEOUT) in r.log
    assert not any(entry[:2] == ("hook", "attempt") and entry[2] == "b" for entry in r.log)
    errors = [entry[2] for entry in r.log if entry[:2] == ("hook", "error")]
    assert len(errors) == 1 and errors[0].startswith("timed out after 300s; worker 4242")
    assert [entry[0] for entry in r.log if entry[0] in ("complete", "fail")] == ["fail"]
    assert r.dispatcher.held_leases() == []


async def test_a_lease_in_hand_that_may_lapse_before_its_next_heartbeat_is_handed_back() -> None:
    ticks = [10.0]
    fresh, stale = lease("a", 9), lease("a", 1)
    r = rig(prefetch=3, ticks=ticks)
    await into_hand(r, stale, fresh)  # both claimed at 10 s, lease 3 s
    r.dispatcher.renewed([fresh], 11.0)  # a heartbeat reached `fresh` only
    ticks[0] = 12.5  # stale: 2.5 s old, less than a heartbeat's interval left
    idle = worker(both())
    r.pool.workers.append(idle)
    r.dispatcher.wakeup.seen = r.dispatcher.wakeup.news  # nothing more to claim
    await r.dispatcher.fill()
    await r.dispatcher.flush(5)
    assert [held for _, held, _ in r.pool.runs] == [fresh]
    assert ("release", stale.job.id) in r.log
    assert r.dispatcher.held_leases() == [fresh]


async def test_leases_in_hand_that_wait_a_lease_for_a_worker_go_back() -> None:
    ticks = [0.0]
    waiting = [lease("a"), lease("a")]
    r = rig(prefetch=3, ticks=ticks)
    await into_hand(r, *waiting)
    r.dispatcher.renewed(waiting, 2.5)  # heartbeated, but no worker ever took them
    ticks[0] = 3.0
    assert r.dispatcher.release_stale() == 2
    await r.dispatcher.flush(5)
    assert [e for e in r.log if e[0] == "release"] == [("release", x.job.id) for x in waiting]
    assert r.dispatcher.held_leases() == []


async def in_hand_for_an_idle_worker(r: Rig, held: Lease) -> Worker:
    """`held` in hand, an idle worker for it, and nothing more to claim."""
    await into_hand(r, held)
    idle = worker(both())
    r.pool.workers.append(idle)
    r.dispatcher.wakeup.seen = r.dispatcher.wakeup.news
    return idle


async def test_a_claimed_lease_is_started_in_the_store_before_its_worker_gets_it() -> None:
    held = claimed("a")
    r = rig(prefetch=3)
    idle = await in_hand_for_an_idle_worker(r, held)
    await r.dispatcher.fill()
    assert r.pool.runs == [] and r.dispatcher.held_leases() == [held]  # being started
    await r.dispatcher.flush(5)
    assert ("start", held.job.id) in r.log
    assert [(w, x.job.status) for w, x, _ in r.pool.runs] == [(idle, Status.RUNNING)]


async def test_a_claimed_lease_whose_start_failed_waits_in_hand_for_the_retry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(in_hand_module, "RETRY_START", 0.01)
    held = claimed("a")
    r = rig(prefetch=3)
    idle = await in_hand_for_an_idle_worker(r, held)
    r.store.refused_starts = 1
    await r.dispatcher.fill()
    await r.dispatcher.flush(5)
    # not run (its start is not written), and no pass at once: it would ask again now
    assert r.pool.runs == [] and in_hand(r) == [held]
    assert not r.dispatcher.wakeup.event.is_set()
    await asyncio.wait_for(r.dispatcher.wakeup.event.wait(), timeout=5)  # the retry's wake
    await r.dispatcher.fill()
    await r.dispatcher.flush(5)
    assert r.log.count(("start", held.job.id)) == 2
    assert [(w, x.job.status) for w, x, _ in r.pool.runs] == [(idle, Status.RUNNING)]


async def test_a_worker_takes_a_lease_already_started_before_one_only_claimed() -> None:
    claimed, started = lease("a", 9), lease("a", 1)
    claimed.job.status, claimed.job.attempts = Status.CLAIMED, 0
    r = rig(prefetch=3)
    await into_hand(r, claimed, started)
    r.pool.workers.append(worker(both()))
    r.dispatcher.wakeup.seen = r.dispatcher.wakeup.news
    await r.dispatcher.fill()
    assert [x for _, x, _ in r.pool.runs] == [started]  # charged: it must run first


async def test_a_claimed_lease_of_a_rate_limited_type_goes_back_once_its_window_ended() -> None:
    ticks = [10.0]
    early, late = lease("a", 9), lease("a", 1)
    for held in (early, late):
        held.job.status, held.job.attempts = Status.CLAIMED, 0
    actors = [ActorInfo("a", rate_limit="5/s"), ActorInfo("b")]
    r = rig(actors=actors, prefetch=3, ticks=ticks)
    r.store.window_left = 0.5  # the window ends at 10.5 s; the guard makes it 10.45 s
    await into_hand(r, early, late)
    r.pool.workers.append(worker(both()))
    r.dispatcher.wakeup.seen = r.dispatcher.wakeup.news
    await r.dispatcher.fill()
    await r.dispatcher.flush(5)
    assert [x for _, x, _ in r.pool.runs] == [early]  # in its window: started
    ticks[0] = 10.46  # the window is over: `late` would start in the next one
    r.pool.workers.append(worker(both()))
    r.store.leases.clear()
    before = r.dispatcher.wakeup.news
    r.dispatcher._hand_out()
    await r.dispatcher.flush(5)
    assert [x for _, x, _ in r.pool.runs] == [early]
    assert ("release", late.job.id) in r.log and ("start", late.job.id) not in r.log
    assert r.dispatcher.wakeup.news > before  # claims again, taking a start from the new window
    assert r.dispatcher.held_leases() == [early]


async def test_a_job_may_start_at_its_enqueue_only_when_nothing_could_wait_ahead() -> None:
    actors = [ActorInfo("a"), ActorInfo("b", concurrency=1)]
    r = rig(actors=actors, workers=[worker(frozenset({"a"}))])
    d = r.dispatcher
    await d.fill()  # the store is empty: drained
    assert (await d.at_enqueue.enqueue(new_job("b"))).lease is None  # a limited type waits its turn
    assert (await d.at_enqueue.enqueue(new_job("a", delay_seconds=5))).lease is None  # not due
    started = (await d.at_enqueue.enqueue(new_job("a"))).lease
    assert started is not None
    assert r.pool.runs == []  # on the next turn: the enqueue's answer goes first
    await asyncio.sleep(0)
    assert [x for _, x, _ in r.pool.runs] == [started]
    r.pool.workers.append(worker(frozenset({"a"})))
    hold = r.store.hold = asyncio.Event()
    first = new_job("a")
    in_flight = asyncio.ensure_future(d.at_enqueue.enqueue(first))
    await asyncio.sleep(0)
    assert first.start is not None  # asked to start while its enqueue is in flight
    assert (await d.at_enqueue.enqueue(new_job("a"))).lease is None  # its only worker is kept
    hold.set()
    assert (await in_flight).lease is not None
    await asyncio.sleep(0)
    r.pool.workers.append(worker(both()))
    d.wake()  # news since the last claim: something may wait ahead in the store
    assert (await d.at_enqueue.enqueue(new_job("a"))).lease is None
    await d.fill()
    r.store.keep_pending = True
    kept = new_job("a")
    assert (await d.at_enqueue.enqueue(kept)).lease is None
    assert (
        kept.start is not None
    )  # the store kept it pending (a paused queue): the worker is free again
    r.store.keep_pending = False
    assert (await d.at_enqueue.enqueue(new_job("a"))).lease is not None


async def test_a_job_started_at_its_enqueue_is_not_run_once_its_lease_may_have_lapsed() -> None:
    """The node froze between the enqueue's answer and the hand-off on the next turn,
    for long enough that the lease may have lapsed (another node may run the job): the
    job goes into hand and back to the store, never to its worker."""
    ticks = [10.0]
    r = rig(actors=[ActorInfo("a")], workers=[worker(frozenset({"a"}))], ticks=ticks)
    d = r.dispatcher
    await d.fill()  # the store is empty: drained
    started = (await d.at_enqueue.enqueue(new_job("a"))).lease
    assert started is not None
    ticks[0] += 2.5  # frozen for most of the 3 s lease before the next turn
    await asyncio.sleep(0)
    assert r.pool.runs == []
    d._hand_out()
    await d.flush(5)
    assert r.pool.runs == [] and ("release", started.job.id) in r.log
    assert d.held_leases() == []
    fresh = (await d.at_enqueue.enqueue(new_job("a"))).lease  # no freeze: runs at once
    await asyncio.sleep(0)
    assert [x for _, x, _ in r.pool.runs] == [fresh]


# -- a worker's own queue ----------------------------------------------------------------


def claimed(job_type: str, priority: int = 5) -> Lease:
    """A lease on a fresh job, claimed (not started)."""
    held = lease(job_type, priority)
    held.job.status, held.job.attempts = Status.CLAIMED, 0
    return held


def busy_workers(r: Rig, count: int) -> list[Worker]:
    """`count` workers each running a job of type "b" (short, as "a" is: both learned)."""
    made = []
    for pid in range(count):
        w = worker(both(), pid=100 + pid)
        running = lease("b")
        w.begin(running)
        r.pool.workers.append(w)
        made.append(w)
    for job_type in ("a", "b"):
        r.dispatcher.durations.add(job_type, 0.002)
    r.dispatcher.depth.current = 4
    return made


async def test_short_jobs_are_queued_best_first_across_the_busy_workers() -> None:
    queued = [claimed("a", 9), claimed("a", 8), claimed("a", 7), claimed("a", 6)]
    r = rig(leases=list(queued), prefetch=3, durable=False)
    first, second = busy_workers(r, 2)
    await r.dispatcher.fill()
    assert r.store.claims[0] == (6, {"a": 6, "b": 6})  # room for 3 behind each running job
    handed = {w.pid: [h.lease for h in hs] for w, hs in r.pool.handoffs}
    assert handed == {first.pid: [queued[0], queued[2]], second.pid: [queued[1], queued[3]]}
    # in memory a queued attempt may run when its turn comes, with no start written first
    assert all(h.go for _, hs in r.pool.handoffs for h in hs)
    assert not any(entry[0] == "start" for entry in r.log)
    assert len(r.pool.handoffs) == 2  # one frame a worker


async def test_a_queued_attempt_is_charged_when_its_worker_says_it_starts() -> None:
    held = claimed("a")
    r = rig(leases=[held], prefetch=3, durable=False, at_once=True)
    (busy,) = busy_workers(r, 1)
    await r.dispatcher.fill()
    assert busy.queues(held.token)
    busy.end(0)
    busy.start(held.job.id)  # what the pool does when the worker says Started
    r.dispatcher.job_started(held, busy)
    assert ("start", held.job.id) in r.log and ("hook", "start", held.job.id) in r.log
    assert r.dispatcher.held_leases() == [held]


async def test_with_a_durable_store_a_queued_attempt_goes_only_once_its_start_is_written() -> None:
    held = claimed("a")
    r = rig(leases=[held], prefetch=3)
    (busy,) = busy_workers(r, 1)
    await r.dispatcher.fill()
    (handoff,) = r.pool.handoffs[0][1]
    assert not handoff.go  # it waits for its start to be written
    await r.dispatcher.flush(5)
    assert ("start", held.job.id) in r.log
    assert r.pool.goes == [(busy, [held.job.id])]


async def test_a_queue_that_starts_within_the_go_ahead_is_started_by_its_claim() -> None:
    started = [lease("a", 9), lease("a", 8)]  # as the store answers a claim that starts them
    r = rig(leases=list(started), prefetch=3)
    (busy,) = busy_workers(r, 1)  # "a" and "b" take 2 ms: 4 of them well within 50 ms
    await r.dispatcher.fill()
    assert r.store.starts == [(0, {"a", "b"})]  # every job the claim takes starts with it
    handed = [h for _, hs in r.pool.handoffs for h in hs]
    assert [h.lease for h in handed] == started and all(h.go for h in handed)
    assert not any(entry[0] == "start" for entry in r.log)  # no start written after
    busy.end(0)
    busy.start(started[0].job.id)
    r.dispatcher.job_started(started[0], busy)
    assert ("hook", "start", started[0].job.id) in r.log
    assert not any(entry[0] == "start" for entry in r.log)


async def test_a_queue_of_a_type_that_runs_longer_has_its_starts_written_as_it_goes() -> None:
    r = rig(leases=[claimed("a")], prefetch=3)
    busy_workers(r, 1)
    for _ in range(2):
        r.dispatcher.durations.add("b", 0.049)  # short, but 4 of them take over 50 ms
    await r.dispatcher.fill()
    assert r.store.starts == [(0, {"a"})]  # "b" runs too long: its starts are written after
    await r.dispatcher.flush(5)
    assert any(entry[0] == "start" for entry in r.log)


async def test_nothing_is_queued_behind_a_job_of_unknown_run_time() -> None:
    r = rig(leases=[claimed("a")], prefetch=3)
    (busy,) = busy_workers(r, 1)
    slow = lease("c")  # its type never ran here: how long it runs is not known
    busy.lease = slow
    await r.dispatcher.fill()
    assert r.store.claims == [] and r.pool.handoffs == []  # it waits for an idle worker


async def test_an_idle_worker_that_ran_short_jobs_gets_its_queue_in_the_same_claim() -> None:
    best, *behind = [lease("a", 9), claimed("a", 8), claimed("a", 7), claimed("a", 6)]
    idle = worker(both())
    idle.last_type = "a"
    r = rig(leases=[best, *behind], workers=[idle], prefetch=3, durable=False)
    r.dispatcher.durations.add("a", 0.002)
    r.dispatcher.depth.current = 4  # earlier batches came back full
    await r.dispatcher.fill()
    assert r.store.claims == [(4, {"a": 4, "b": 4})]  # one claim: its job and its queue
    assert [(w, x) for w, x, _ in r.pool.runs] == [(idle, best)]
    assert [h.lease for _, hs in r.pool.handoffs for h in hs] == behind
    assert r.dispatcher.depth.current == 4  # it came back full: the queue is still deep


async def test_a_worker_holds_no_more_of_its_usual_work_than_a_slower_short_job_allows() -> None:
    # quick jobs go as deep as the prefetch allows; jobs near the short limit hold about
    # as much work as 8 of the longest short ones: no deeper than a smaller prefetch did
    for usual, asked in ((0.002, 31), (0.04, 9)):
        busy = worker(both(), pid=1)
        busy.begin(lease("a"))
        r = rig(workers=[busy], prefetch=31, durable=False)
        r.dispatcher.durations.add("a", usual)
        r.dispatcher.depth.current = 32  # earlier batches came back full
        await r.dispatcher.fill()
        assert r.store.claims == [(asked, {"a": asked, "b": asked})], usual


async def test_an_idle_worker_whose_last_job_neared_the_short_limit_gets_a_shorter_queue() -> None:
    idle = worker(both())
    idle.last_type = "a"
    r = rig(workers=[idle], prefetch=31, durable=False)
    r.dispatcher.durations.add("a", 0.04)  # 10 of them usually take HELD_WORK (0.4 s)
    r.dispatcher.depth.current = 32
    await r.dispatcher.fill()
    assert r.store.claims[0][0] == 10  # its job and 9 behind it, not 31


async def test_an_idle_worker_whose_last_job_ran_long_is_claimed_one_job_alone() -> None:
    held = lease("a")
    idle = worker(both())
    idle.last_type = "b"
    r = rig(leases=[held, claimed("a")], workers=[idle], prefetch=3, durable=False)
    r.dispatcher.durations.add("a", 0.002)
    r.dispatcher.durations.add("b", 2.0)  # what it ran last took long: so may the next
    r.dispatcher.depth.current = 4
    await r.dispatcher.fill()
    assert r.store.claims[0] == (1, {"a": 1, "b": 1})  # its job alone, started
    assert [x for _, x, _ in r.pool.runs] == [held]


async def test_a_long_job_among_the_claimed_waits_for_an_idle_worker_and_holds_the_rest() -> None:
    first, long_one, after = claimed("a", 9), claimed("c", 8), claimed("a", 7)
    actors = [ActorInfo("a"), ActorInfo("b"), ActorInfo("c")]
    r = rig(actors=actors, leases=[first, long_one, after], prefetch=3, durable=False)
    (busy,) = busy_workers(r, 1)
    busy.types = frozenset({"a", "b", "c"})
    await r.dispatcher.fill()
    assert [h.lease for h in r.pool.handoffs[0][1]] == [first]  # FIFO: none overtakes "c"
    assert in_hand(r) == [long_one, after]
    r.store.leases.append(claimed("a", 1))
    r.dispatcher.wake()
    await r.dispatcher.fill()
    assert len(r.store.claims) == 1  # nothing more is claimed behind them
    idle = worker(frozenset({"a", "b", "c"}), pid=7)
    r.pool.workers.append(idle)
    await r.dispatcher.fill()
    await r.dispatcher.flush(5)
    assert [x for w, x, _ in r.pool.runs if w is idle] == [long_one]


async def test_a_type_that_never_ran_here_leaves_the_short_ones_started_by_the_claim() -> None:
    # what a store answers for start_types {"a", "b"}: the "a" at the claim's head
    # started, the "c" (never ran here) and everything behind it merely claimed
    head, unknown, after = lease("a", 9), claimed("c", 8), claimed("a", 7)
    actors = [ActorInfo("a"), ActorInfo("b"), ActorInfo("c")]
    r = rig(actors=actors, leases=[head, unknown, after], prefetch=3)
    (busy,) = busy_workers(r, 1)
    busy.types = frozenset({"a", "b", "c"})
    await r.dispatcher.fill()
    assert r.store.starts == [(0, {"a", "b"})]  # not "c": how long it runs is not known
    (handed,) = [h for _, hs in r.pool.handoffs for h in hs]
    assert handed.lease is head and handed.go  # started by its claim: it goes at once
    assert in_hand(r) == [unknown, after]  # FIFO: nothing overtakes "c"
    assert not any(entry[0] == "start" for entry in r.log)


async def test_no_attempt_is_queued_ahead_of_a_higher_priority_one_queued_elsewhere() -> None:
    r = rig(prefetch=3, durable=False)
    first, second = busy_workers(r, 2)
    r.dispatcher.depth.current = 8
    high = claimed("a", 9)  # the second worker holds one more, then a higher-priority one
    for queued in (claimed("a", 9), high):
        second.queue(queued, 1.0, 100.0)
        attempt = r.dispatcher.attempts.add(queued, Phase.IN_HAND, 0.0)
        r.dispatcher.attempts.move(attempt, Phase.QUEUED, worker=second)
    low = claimed("a", 3)
    r.store.leases[:] = [low]
    await r.dispatcher.fill()  # on the first worker it would come second: before `high`
    assert not any(w is first for w, _ in r.pool.handoffs)
    assert in_hand(r) == [low]


async def test_a_cancelled_queued_attempt_is_withdrawn_and_killed_if_it_started_meanwhile() -> None:
    held = claimed("a")
    r = rig(leases=[held], prefetch=3, durable=False)
    (busy,) = busy_workers(r, 1)
    await r.dispatcher.fill()
    assert r.dispatcher.cancel_lease(held.token)
    assert r.pool.withdrawals == [(busy, [held.job.id])]
    busy.end(0)
    busy.start(held.job.id)  # it started before the withdrawal reached the worker
    r.dispatcher.job_started(held, busy)
    assert r.pool.kills == [(busy, KillReason.CANCEL)]


async def test_a_dropped_attempt_goes_back_to_the_store_at_no_cost() -> None:
    held = claimed("a")
    r = rig(leases=[held], prefetch=3, durable=False)
    (busy,) = busy_workers(r, 1)
    await r.dispatcher.fill()
    busy.drop([held.job.id])
    r.dispatcher.job_dropped(held, busy)
    await r.dispatcher.flush(5)
    assert ("release", held.job.id) in r.log
    assert r.dispatcher.held_leases() == []


async def test_an_attempt_its_worker_read_too_late_to_start_goes_back_at_no_cost() -> None:
    """A node frozen right after handing a job to an idle worker: once thawed, the worker
    reads it past its `start_by` and drops it rather than run a lease that may have
    lapsed; the lease goes back to the store uncounted and the worker is idle again."""
    held = lease("a")
    r = rig(leases=[held], workers=[worker(both())])
    await r.dispatcher.fill()
    (ran,) = [w for w, x, _ in r.pool.runs if x.token == held.token]
    assert ran.drop([held.job.id]) == [held]
    assert ran.lease is None and ran.state == WorkerState.IDLE and ran.deadline is None
    r.dispatcher.job_dropped(held, ran)
    await r.dispatcher.flush(5)
    assert ("release", held.job.id) in r.log
    assert r.dispatcher.held_leases() == []


async def test_an_idle_worker_takes_attempts_queued_on_a_busy_one() -> None:
    queued = [claimed("a"), claimed("a")]
    r = rig(leases=list(queued), prefetch=3, durable=False)
    (busy,) = busy_workers(r, 1)
    await r.dispatcher.fill()
    assert [h.lease for h in r.pool.handoffs[0][1]] == queued
    idle = worker(both(), pid=9)
    r.pool.workers.append(idle)
    await r.dispatcher.fill()
    assert r.pool.withdrawals == [(busy, [queued[1].job.id])]  # the back half
    assert r.store.claims[1:] == []  # the idle worker waits for it rather than claim
    for dropped in busy.drop([queued[1].job.id]):
        r.dispatcher.job_dropped(dropped, busy)
    await r.dispatcher.fill()
    await r.dispatcher.flush(5)  # its start is written, then it runs there
    assert [(w, x) for w, x, _ in r.pool.runs] == [(idle, queued[1])]


async def test_an_idle_worker_takes_the_one_job_queued_behind_an_overrunning_one() -> None:
    queued = claimed("a")
    r = rig(leases=[queued], prefetch=3, durable=False)
    (busy,) = busy_workers(r, 1)
    await r.dispatcher.fill()
    assert busy.queues(queued.token)
    busy.attempt_started = -10.0  # its "b" (usually 2 ms) has run for 10 s
    r.pool.workers.append(worker(both(), pid=9))
    await r.dispatcher.fill()
    assert r.pool.withdrawals == [(busy, [queued.job.id])]


async def test_queued_attempts_of_a_stuck_worker_go_back_once_it_cannot_start_them() -> None:
    ticks = [0.0]
    first, second = claimed("a"), claimed("a")
    r = rig(leases=[first, second], prefetch=3, ticks=ticks)
    r.pool.lease_allowance = 1.8  # a worker silent that long is killed by its lease alarm
    (busy,) = busy_workers(r, 1)
    await r.dispatcher.fill()
    await r.dispatcher.flush(5)  # both starts written ahead: either may run
    (granted,) = [e for e in busy.queued if e.lease.token == first.token]
    unwritten = r.dispatcher.attempts.get(second.token)
    assert unwritten is not None
    unwritten.written = False  # as if it lay beyond the go-ahead
    ticks[0] = 3.5  # queued a whole lease (3 s) ago; the worker answers nothing
    r.dispatcher.release_stale()
    await r.dispatcher.flush(5)
    assert [e for e in r.log if e[0] == "release"] == [("release", second.job.id)]
    ticks[0] = granted.start_by + 1.8 + 0.6  # past its start_by by more than the allowance
    r.dispatcher.release_stale()
    await r.dispatcher.flush(5)
    assert ("release", first.job.id) in r.log
    assert r.dispatcher.held_leases() == []  # neither is heartbeated any longer


async def test_a_worker_due_for_recycling_is_handed_no_more_than_it_may_run() -> None:
    r = rig(leases=[claimed("a") for _ in range(3)], prefetch=3, durable=False)
    r.pool.recycle = Recycle(max_jobs=2)
    busy_workers(r, 1)
    await r.dispatcher.fill()
    assert sum(len(hs) for _, hs in r.pool.handoffs) == 1  # it runs one, and one more


def new_job(job_type: str, **fields: object) -> NewJob:
    spec = msgspec.json.decode(msgspec.json.encode({"type": job_type, **fields}), type=JobSpec)
    return NewJob(spec=spec, max_retries=3)
