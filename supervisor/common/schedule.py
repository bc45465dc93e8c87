"""Periodic jobs: what a schedule is and when it fires.

A schedule is declared in the config file (`[[schedules]]`) or on an actor
(`@actor("report", schedule="0 * * * *")`, a schedule named after the type); the config
wins for a name given in both. Its timetable is a five-field cron expression in a time
zone (parsed and stepped by cronsim, DST as cronsim defines it: Debian cron's rules), or
a fixed period counted from the Unix epoch, so every node computes the same ticks.
Ticks are the key of exactly-once firing across nodes (`supervisor/schedules/scheduler.py`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import msgspec
from cronsim import CronSim, CronSimError

_NAME = re.compile(r"[A-Za-z0-9_.:\-]{1,200}")
MAX_EVERY_SECONDS = 366 * 86_400


class Missed(StrEnum):
    """What a schedule does about ticks that passed while no node could fire them."""

    ONCE = "once"  # fire the latest missed tick once on recovery
    SKIP = "skip"  # fire nothing for them: the next tick is the next fire


class ScheduleSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One periodic job, as declared. Constructing one does not check it: `problem` does."""

    name: str
    type: str
    cron: str | None = None
    every_seconds: int | None = None
    payload: Any = None
    queue: str | None = None
    priority: int | None = None
    concurrency_key: str | None = None  # the flow-control key of every job it enqueues
    timezone: str = "UTC"
    missed: Missed = Missed.ONCE

    def problem(self) -> str | None:
        """What is wrong with this declaration (the field first), or None."""
        if not _NAME.fullmatch(self.name):
            return "name: must be 1-200 characters of letters, digits, _.:-"
        if not _NAME.fullmatch(self.type):
            return "type: must be 1-200 characters of letters, digits, _.:-"
        if (self.cron is None) == (self.every_seconds is None):
            return "give exactly one of cron and every_seconds"
        if self.every_seconds is not None:
            every = self.every_seconds
            if isinstance(every, bool) or not 1 <= every <= MAX_EVERY_SECONDS:
                return f"every_seconds: must be an integer from 1 to {MAX_EVERY_SECONDS}"
        if self.queue is not None and not _NAME.fullmatch(self.queue):
            return "queue: must be 1-200 characters of letters, digits, _.:-"
        priority = self.priority
        if priority is not None and (isinstance(priority, bool) or not 0 <= priority <= 10):
            return "priority: must be an integer from 0 to 10"
        key = self.concurrency_key
        if key is not None and (not isinstance(key, str) or not 1 <= len(key) <= 200):
            return "concurrency_key: must be 1-200 characters"
        try:
            zone(self.timezone)
        except ValueError as exc:
            return f"timezone: {exc}"
        if self.cron is not None:
            return cron_problem(self.cron)
        return None

    def timetable(self) -> Timetable:
        """When it fires. The spec must have no `problem`."""
        if self.every_seconds is not None:
            return Every(self.every_seconds)
        assert self.cron is not None
        return Cron(self.cron, zone(self.timezone))

    @property
    def when(self) -> str:
        """The timetable as people read it: `0 * * * * (Europe/Paris)`, `every 30 s`."""
        if self.cron is not None:
            return self.cron if self.timezone == "UTC" else f"{self.cron} ({self.timezone})"
        return f"every {self.every_seconds} s"


def zone(name: str) -> ZoneInfo:
    """The IANA time zone `name`; ValueError naming it if there is none."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown time zone {name!r} (an IANA name: UTC, Europe/Paris)") from None


def cron_problem(expression: str) -> str | None:
    """What is wrong with a five-field cron expression, or None."""
    if len(expression.split()) != 5:
        return f"cron: expected five fields (minute hour day month weekday), got {expression!r}"
    try:
        CronSim(expression, datetime(2000, 1, 1, tzinfo=UTC))
    except CronSimError as exc:
        return f"cron: {exc} in {expression!r}"
    return None


class Timetable:
    """The ticks of a schedule, as aware UTC datetimes."""

    def next_after(self, moment: datetime) -> datetime:
        """The first tick strictly after `moment`."""
        raise NotImplementedError

    def latest_at(self, moment: datetime) -> datetime | None:
        """The last tick at or before `moment` (None if there is none)."""
        raise NotImplementedError


class Every(Timetable):
    """Every `seconds`, on the multiples of it since the Unix epoch."""

    def __init__(self, seconds: int) -> None:
        self.seconds = seconds

    def next_after(self, moment: datetime) -> datetime:
        """The next multiple of the period after `moment`."""
        count = math.floor(moment.timestamp() / self.seconds) + 1
        return datetime.fromtimestamp(count * self.seconds, UTC)

    def latest_at(self, moment: datetime) -> datetime | None:
        """The last multiple of the period at or before `moment`."""
        count = math.floor(moment.timestamp() / self.seconds)
        return datetime.fromtimestamp(count * self.seconds, UTC)


class Cron(Timetable):
    """A five-field cron expression read in time zone `tz` (cronsim's DST rules)."""

    def __init__(self, expression: str, tz: ZoneInfo) -> None:
        self.expression = expression
        self.tz = tz

    def next_after(self, moment: datetime) -> datetime:
        """The next match after `moment`."""
        tick = next(CronSim(self.expression, moment.astimezone(self.tz)))
        return tick.astimezone(UTC)

    def latest_at(self, moment: datetime) -> datetime | None:
        """The last match at or before `moment` (cronsim's reverse iteration, which
        includes the start when it matches and carries microseconds)."""
        start = moment.astimezone(self.tz).replace(microsecond=0) + timedelta(microseconds=1)
        try:
            tick = next(CronSim(self.expression, start, reverse=True))
        except StopIteration:
            return None
        return tick.astimezone(UTC)


def from_actors(declared: Mapping[str, str | None]) -> list[ScheduleSpec]:
    """The schedules actors declare (`schedule="0 * * * *"`), each named after its type."""
    return [
        ScheduleSpec(name=job_type, type=job_type, cron=cron)
        for job_type, cron in sorted(declared.items())
        if cron is not None
    ]


def merged(
    configured: Iterable[ScheduleSpec], actors: Iterable[ScheduleSpec]
) -> list[ScheduleSpec]:
    """Every schedule a node runs: the configured ones, then the actors' whose name the
    config does not take (the config wins), by name."""
    by_name = {spec.name: spec for spec in actors}
    by_name.update((spec.name, spec) for spec in configured)
    return [by_name[name] for name in sorted(by_name)]


class ScheduleState(msgspec.Struct, frozen=True, kw_only=True):
    """What the store remembers of a schedule: whether it is enabled, its last fire
    (the tick's time) and the job that made, and when it was last enabled (ticks from
    before that were not missed: they were refused)."""

    name: str
    enabled: bool = True
    last_fire: datetime | None = None
    last_job_id: str | None = None
    enabled_at: datetime | None = None


class Fired(StrEnum):
    """The answer of a store asked to fire a tick."""

    FIRED = "fired"  # the job is stored, under this tick
    TAKEN = "taken"  # this tick (or a later one) was fired already, here or by another node
    DISABLED = "disabled"  # the schedule is disabled: nothing stored


def fire_detail(name: str, tick: datetime, missed: bool) -> str:
    """What a fired job's `enqueued` event says: `schedule report at 2030-01-31T09:00:00Z`,
    with `, missed` for a tick fired on recovery."""
    at = tick.astimezone(UTC).isoformat().replace("+00:00", "Z")
    return f"schedule {name} at {at}" + (", missed" if missed else "")
