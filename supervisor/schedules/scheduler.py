"""The scheduler: fires a node's periodic jobs (`supervisor/common/schedule.py`).

It sleeps until the next tick of any schedule, then asks the store to fire the latest
due tick of each schedule whose time has come (`Store.fire_schedule`): with PostgreSQL
the tick is the key that makes it fire once however many nodes try, so every node runs
the same scheduler and none leads. A tick fires late rather than not at all, but only
the latest due one: ticks that passed while the node was stalled are dropped, never
fired in a burst.

When it starts, ticks that passed since the schedule's last fire (or since it was last
enabled), as the store remembers it, were missed while no node ran it: `missed = "once"`
fires the latest of them once, `"skip"` none. The memory store remembers nothing across
restarts, so there nothing is missed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime

import msgspec
from goqueue.supervisor.common.catalog import Catalog
from goqueue.supervisor.common.errors import InvalidPayload, StoreError
from goqueue.supervisor.common.jobs import Job, JobSpec, resolve_spec, utcnow
from goqueue.supervisor.common.payloads import check_payload
from goqueue.supervisor.common.schedule import (
    Fired,
    Missed,
    ScheduleSpec,
    ScheduleState,
    Timetable,
    from_actors,
    merged,
)
from goqueue.supervisor.observe.metrics import Metrics
from goqueue.supervisor.store.base import NewJob, Store

log = logging.getLogger("goqueue.scheduler")

MAX_SLEEP = 60.0  # seconds: a wall clock set forward or back is noticed this soon
RETRY_AFTER = 1.0  # seconds before trying again a tick whose fire failed (store down)


@dataclass(frozen=True, slots=True)
class ScheduleView:
    """One schedule as operators see it: its declaration, where it comes from, its
    state in the store and its next tick (None when disabled)."""

    spec: ScheduleSpec
    source: str  # "config" or "actor"
    state: ScheduleState
    next_fire: datetime | None


class Scheduler:
    """Fires the node's schedules; `configure` gives it (new) schedules, `run` fires them."""

    def __init__(
        self,
        store: Store,
        enqueued: Callable[[Job], None],
        metrics: Metrics,
        *,
        clock: Callable[[], datetime] = utcnow,
        produced: Callable[[NewJob], None] | None = None,
    ) -> None:
        self.store = store
        self.enqueued = enqueued  # the engine's enqueue hooks, told of each job fired
        self.produced = produced  # --otel: a tick's job is a PRODUCER span, as an enqueue
        self.metrics = metrics
        self.clock = clock
        self.catalog = Catalog((), {})
        self.specs: dict[str, ScheduleSpec] = {}
        self.sources: dict[str, str] = {}
        self._timetables: dict[str, Timetable] = {}
        self._cursors: dict[str, datetime] = {}  # the last tick handled, by schedule
        self._started = False
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    # -- what it runs ------------------------------------------------------------------

    def configure(self, configured: Iterable[ScheduleSpec], catalog: Catalog) -> list[str]:
        """Adopt the configured schedules and those `catalog`'s actors declare (the config
        wins on a name); returns the problems of actors' schedules, and of schedules whose
        payload does not fit their typed actor, which are left out.
        A schedule new or changed counts its ticks from now; a removed one stops."""
        problems = []
        declared = {name: info.schedule for name, info in catalog.actors.items()}
        actors = []
        for spec in from_actors(declared):
            problem = spec.problem()
            if problem is None:
                actors.append(spec)
            else:
                problems.append(f"@actor({spec.type!r}): schedule: {problem}")
        configured = list(configured)
        specs = []
        for spec in merged(configured, actors):
            problem = misfit(spec, catalog)
            if problem is None:
                specs.append(spec)
            else:
                problems.append(problem)
        self.sources = {s.name: "actor" for s in actors} | {s.name: "config" for s in configured}
        now = self.clock()
        for spec in specs:
            if self.specs.get(spec.name) != spec and self._started:
                self._cursors[spec.name] = now  # added or changed: nothing missed yet
            if spec.type not in catalog.types:
                log.warning(
                    "schedule of a type this node does not run",
                    extra={"schedule": spec.name, "type": spec.type},
                )
        self.specs = {spec.name: spec for spec in specs}
        self._timetables = {spec.name: spec.timetable() for spec in specs}
        self._cursors = {n: c for n, c in self._cursors.items() if n in self.specs}
        self.catalog = catalog
        self.metrics.declare_schedules(self.specs)
        self._wakeup.set()
        return problems

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        """Run in the background until `stop`."""
        if self._task is None:
            self._task = asyncio.ensure_future(self.run())

    async def stop(self) -> None:
        """Fire nothing more (a fire under way finishes or is rolled back)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def run(self) -> None:
        """Recover what was missed, then fire each tick as it comes."""
        await self.recover()
        while True:
            delay = await self.tick()
            self._wakeup.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), min(MAX_SLEEP, delay))

    async def recover(self) -> None:
        """Start each schedule's count of ticks from what the store remembers."""
        while True:
            try:
                states = await self.store.schedule_states()
                break
            except StoreError as exc:
                log.warning("reading the schedules failed; retrying", extra={"err": str(exc)})
                await asyncio.sleep(RETRY_AFTER)
        now = self.clock()
        for name, spec in list(self.specs.items()):
            if name in self._cursors or name not in self.specs:
                continue  # configured again, or removed, while recovering
            state = states.get(name)
            since = [t for t in (state.last_fire, state.enabled_at) if t] if state else []
            self._cursors[name] = max(since) if since else now
            missed = self._timetables[name].latest_at(now)
            if since and missed is not None and missed > self._cursors[name]:
                if spec.missed == Missed.SKIP:
                    log.info("missed ticks skipped", extra={"schedule": name})
                    self._cursors[name] = missed
                else:
                    await self._fire(name, missed, missed=True)
        self._started = True

    # -- firing ------------------------------------------------------------------------

    async def tick(self) -> float:
        """Fire each schedule's latest due tick; the seconds until the next is due."""
        now = self.clock()
        delays = [MAX_SLEEP]
        for name in list(self.specs):
            timetable = self._timetables[name]
            cursor = self._cursors.setdefault(name, now)
            due = timetable.latest_at(now)
            if due is not None and due > cursor:
                if timetable.next_after(cursor) < due:
                    log.warning("ticks dropped: the node was stalled", extra={"schedule": name})
                if not await self._fire(name, due):
                    delays.append(RETRY_AFTER)
                    continue
            delays.append((timetable.next_after(now) - self.clock()).total_seconds())
        return max(0.0, min(delays))

    async def _fire(self, name: str, tick: datetime, *, missed: bool = False) -> bool:
        """Ask the store to fire `tick`; False if it could not answer (try again later)."""
        spec = self.specs[name]
        try:
            new = self._new_job(spec)
            fired, job = await self.store.fire_schedule(name, tick, new, missed=missed)
        except StoreError as exc:
            log.warning(
                "schedule fire failed; retrying",
                extra={"schedule": name, "tick": tick.isoformat(), "err": str(exc)},
            )
            return False
        self._cursors[name] = max(tick, self._cursors.get(name, tick))
        if fired == Fired.FIRED and job is not None:
            self.metrics.schedule_fired(name)
            self.enqueued(job)
            extra = {"schedule": name, "tick": tick.isoformat(), "job_id": job.id}
            if missed:
                log.info("schedule fired a tick missed while no node ran", extra=extra)
            else:
                log.debug("schedule fired", extra=extra)
        return True

    def _new_job(self, spec: ScheduleSpec) -> NewJob:
        """The job of one tick, with the actor's and the server's defaults."""
        job = JobSpec(
            type=spec.type,
            queue=spec.queue,
            priority=spec.priority,
            payload=msgspec.Raw(msgspec.json.encode(spec.payload)),
            concurrency_key=spec.concurrency_key,
        )
        resolved = resolve_spec(job, self.catalog.actors.get)
        new = NewJob(spec=resolved, max_retries=resolved.max_retries)
        if self.produced is not None:
            self.produced(new)
        return new

    # -- for the API -------------------------------------------------------------------

    async def views(self) -> list[ScheduleView]:
        """Every schedule of this node, by name, with its state in the store."""
        states = await self.store.schedule_states()
        now = self.clock()
        views = []
        for name, spec in sorted(self.specs.items()):
            state = states.get(name) or ScheduleState(name=name)
            next_fire = self._timetables[name].next_after(now) if state.enabled else None
            views.append(ScheduleView(spec, self.sources.get(name, "config"), state, next_fire))
        return views

    async def set_enabled(self, name: str, enabled: bool) -> ScheduleView | None:
        """Enable or disable schedule `name` (None if this node has no such schedule).
        Enabled again, it fires from its next tick on: the ticks it was off were not
        missed."""
        if name not in self.specs:
            return None
        state = await self.store.set_schedule_enabled(name, enabled)
        if enabled:
            self._cursors[name] = max(self._cursors.get(name, self.clock()), self.clock())
            self._wakeup.set()
        next_fire = self._timetables[name].next_after(self.clock()) if state.enabled else None
        return ScheduleView(self.specs[name], self.sources.get(name, "config"), state, next_fire)


def misfit(spec: ScheduleSpec, catalog: Catalog) -> str | None:
    """Why `spec`'s payload does not fit its typed actor (a schedule fires it unattended,
    so it is checked once, when the schedules are adopted), or None."""
    info = catalog.actors.get(spec.type)
    if info is None or info.shape is None:
        return None
    try:
        check_payload(info.shape, info.keyword, msgspec.Raw(msgspec.json.encode(spec.payload)))
    except InvalidPayload as exc:
        return f"schedule {spec.name!r}: {exc}"
    return None
