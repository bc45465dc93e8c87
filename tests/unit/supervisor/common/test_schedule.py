"""Schedules as declared: cron and period timetables (time zones, DST as cronsim
defines it), what makes a declaration invalid, and how the config file and actors
declare them; rate limits too, declared the same ways."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from goqueue.actors.errors import ActorDefinitionError
from goqueue.actors.registry import actor
from goqueue.supervisor.common.catalog import Catalog
from goqueue.supervisor.common.errors import ConfigError
from goqueue.supervisor.common.rates import Rate, StartTimes, parse_rate
from goqueue.supervisor.common.schedule import (
    Missed,
    ScheduleSpec,
    fire_detail,
    from_actors,
    merged,
)
from goqueue.supervisor.settings import config
from hypothesis import given
from hypothesis import strategies as st

pytestmark = pytest.mark.timeout(10)

PARIS = ZoneInfo("Europe/Paris")


def at(text: str) -> datetime:
    return datetime.fromisoformat(text)


def cron(expression: str, timezone: str = "UTC") -> ScheduleSpec:
    return ScheduleSpec(name="s", type="t", cron=expression, timezone=timezone)


def test_every_seconds_ticks_on_multiples_of_the_period_since_the_epoch() -> None:
    every = ScheduleSpec(name="s", type="t", every_seconds=30).timetable()
    assert every.next_after(at("2030-01-31T09:00:07Z")) == at("2030-01-31T09:00:30Z")
    assert every.next_after(at("2030-01-31T09:00:30Z")) == at("2030-01-31T09:01:00Z")
    assert every.latest_at(at("2030-01-31T09:00:30Z")) == at("2030-01-31T09:00:30Z")
    assert every.latest_at(at("2030-01-31T09:00:29.9Z")) == at("2030-01-31T09:00:00Z")


def test_cron_next_and_latest_tick_in_utc() -> None:
    hourly = cron("0 * * * *").timetable()
    assert hourly.next_after(at("2030-01-31T09:00:00Z")) == at("2030-01-31T10:00:00Z")
    assert hourly.next_after(at("2030-01-31T09:59:59.5Z")) == at("2030-01-31T10:00:00Z")
    assert hourly.latest_at(at("2030-01-31T10:00:00Z")) == at("2030-01-31T10:00:00Z")
    assert hourly.latest_at(at("2030-01-31T10:00:00.7Z")) == at("2030-01-31T10:00:00Z")
    assert hourly.latest_at(at("2030-01-31T09:59:59.9Z")) == at("2030-01-31T09:00:00Z")
    weekdays = cron("30 8 * * mon-fri").timetable()  # 2030-02-01 is a Friday
    assert weekdays.next_after(at("2030-02-01T09:00:00Z")) == at("2030-02-04T08:30:00Z")


def test_cron_reads_its_time_in_its_time_zone_winter_and_summer() -> None:
    nine = cron("0 9 * * *", "Europe/Paris").timetable()
    assert nine.next_after(at("2030-01-31T00:00:00Z")) == at("2030-01-31T08:00:00Z")
    assert nine.next_after(at("2030-07-01T00:00:00Z")) == at("2030-07-01T07:00:00Z")
    assert nine.next_after(at("2030-07-01T00:00:00Z")).tzinfo == UTC


def test_dst_as_cronsim_defines_it() -> None:
    """Debian cron's rules: a time skipped when clocks go forward runs at the jump; a
    time repeated when they go back runs once."""
    half_past_two = cron("30 2 * * *", "Europe/Paris").timetable()
    spring = half_past_two.next_after(datetime(2030, 3, 31, 0, 0, tzinfo=PARIS))
    assert spring.astimezone(PARIS).isoformat() == "2030-03-31T03:00:00+02:00"
    autumn = datetime(2030, 10, 27, 0, 0, tzinfo=PARIS)
    first = half_past_two.next_after(autumn)
    assert first.astimezone(PARIS).isoformat() == "2030-10-27T02:30:00+02:00"
    second = half_past_two.next_after(first)
    assert second.astimezone(PARIS).isoformat() == "2030-10-28T02:30:00+01:00"
    hourly = cron("0 * * * *", "Europe/Paris").timetable()  # every real hour, no gap
    ticks = [hourly.next_after(at("2030-10-26T23:30:00Z"))]
    for _ in range(3):
        ticks.append(hourly.next_after(ticks[-1]))
    assert [b - a for a, b in itertools.pairwise(ticks)] == [timedelta(hours=1)] * 3


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"cron": "61 * * * *"}, "cron: Bad minute"),
        ({"cron": "0 0 * * * *"}, "cron: expected five fields"),
        ({"cron": "@hourly"}, "cron: expected five fields"),
        ({}, "give exactly one of cron and every_seconds"),
        ({"cron": "* * * * *", "every_seconds": 5}, "give exactly one of cron and every_seconds"),
        ({"every_seconds": 0}, "every_seconds: must be an integer from 1"),
        ({"cron": "* * * * *", "timezone": "Mars/Base"}, "timezone: unknown time zone"),
        ({"every_seconds": 1, "priority": 11}, "priority: must be an integer from 0 to 10"),
        ({"every_seconds": 1, "queue": "a b"}, "queue: must be 1-200 characters"),
    ],
)
def test_invalid_declarations_name_the_problem(fields: dict, problem: str) -> None:
    spec = ScheduleSpec(name="s", type="t", **fields)
    assert (spec.problem() or "").startswith(problem), spec.problem()


def test_the_config_file_declares_schedules(tmp_path: Path) -> None:
    path = tmp_path / "goqueue.toml"
    path.write_text(
        "[[schedules]]\n"
        'name = "hourly-report"\ntype = "report"\ncron = "0 * * * *"\n'
        'timezone = "Europe/Paris"\npayload = {rounds = 1000}\n'
        "[[schedules]]\n"
        'name = "ping"\ntype = "email"\nevery_seconds = 30\nmissed = "skip"\npriority = 9\n'
    )
    settings = config.load(None, {"GOQUEUE_CONFIG": str(path)})
    report, ping = settings.schedules
    assert report.name == "hourly-report" and report.payload == {"rounds": 1000}
    assert report.missed == Missed.ONCE and report.timezone == "Europe/Paris"
    assert ping.every_seconds == 30 and ping.missed == Missed.SKIP and ping.priority == 9


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ('name = "a"\ntype = "t"\ncron = "0 0 32 * *"', "schedules[0] (a): cron: Bad day"),
        ('name = "a"\ntype = "t"', "schedules[0] (a): give exactly one of cron"),
        ('name = "a"\ntype = "t"\nevery_second = 1', "schedules[0]: Object contains unknown"),
        ('name = "a"\ntype = "t"\nevery_seconds = 1\nmissed = "all"', "schedules[0]: Invalid"),
        ('name = "a"\ntype = "t"\nevery_seconds = "5"', "schedules[0]: Expected `int"),
    ],
)
def test_a_bad_schedule_in_the_file_is_a_config_error_naming_it(
    tmp_path: Path, table: str, message: str
) -> None:
    path = tmp_path / "goqueue.toml"
    path.write_text(f"[[schedules]]\n{table}\n")
    with pytest.raises(ConfigError) as info:
        config.load(None, {"GOQUEUE_CONFIG": str(path)})
    assert str(info.value).startswith(message), info.value


def test_two_schedules_of_one_name_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "goqueue.toml"
    one = '[[schedules]]\nname = "a"\ntype = "t"\nevery_seconds = 1\n'
    path.write_text(one * 2)
    with pytest.raises(ConfigError, match="the name 'a' is taken"):
        config.load(None, {"GOQUEUE_CONFIG": str(path)})


def test_an_actor_declares_a_schedule_named_after_its_type_and_the_config_wins() -> None:
    @actor("report", schedule="0 * * * *")
    def report(payload, ctx):  # type: ignore[no-untyped-def]
        return None

    assert report.info().schedule == "0 * * * *"
    (declared,) = from_actors({"report": "0 * * * *", "email": None})
    assert declared == ScheduleSpec(name="report", type="report", cron="0 * * * *")
    configured = ScheduleSpec(name="report", type="report", every_seconds=60)
    other = ScheduleSpec(name="zz", type="email", every_seconds=5)
    assert merged([other, configured], [declared]) == [configured, other]


@pytest.mark.parametrize("bad", ["0 * * *", "every hour", 5, "0 * * * * *"])
def test_an_actor_schedule_of_the_wrong_shape_fails_at_import(bad: object) -> None:
    with pytest.raises(ActorDefinitionError, match="five-field cron expression"):
        actor("report", schedule=bad)


def test_a_fired_jobs_event_detail() -> None:
    tick = datetime(2030, 1, 31, 10, 0, tzinfo=PARIS)
    assert fire_detail("r", tick, False) == "schedule r at 2030-01-31T09:00:00Z"
    assert fire_detail("r", tick, True) == "schedule r at 2030-01-31T09:00:00Z, missed"


# -- rate limits (declared as schedules are: in the config and on actors) ---------------


@pytest.mark.parametrize(
    ("text", "limit", "period"),
    [("100/s", 100, 1.0), ("6000/m", 6000, 60.0), (" 2 / h ", 2, 3600.0)],
)
def test_rates_read_as_starts_per_period(text: str, limit: int, period: float) -> None:
    rate = parse_rate(text)
    assert (rate.limit, rate.period) == (limit, period)
    assert rate.interval == period / limit and rate.guard == min(0.05, period / limit / 5)


@pytest.mark.parametrize("bad", ["100", "0/s", "10/d", "1.5/s", "x/s", 10, "2000000/s"])
def test_unreadable_rates_are_refused(bad: object) -> None:
    with pytest.raises(ValueError):
        parse_rate(bad)


def test_rate_limits_in_the_file_and_on_actors_the_config_winning(tmp_path: Path) -> None:
    path = tmp_path / "goqueue.toml"
    path.write_text('[rate_limits]\nemail = "20/s"\n')
    settings = config.load(None, {"GOQUEUE_CONFIG": str(path)})
    assert settings.rate_limits == {"email": "20/s"}
    email = actor("email", rate_limit="5/s")(lambda payload, ctx: None)
    report = actor("report", rate_limit="6000/m")(lambda payload, ctx: None)
    catalog = Catalog([email.info(), report.info()], {}, settings.rate_limits)
    assert catalog.rates == {"email": Rate(20, 1.0), "report": Rate(6000, 60.0)}
    path.write_text('[rate_limits]\nemail = "fast"\n')
    with pytest.raises(ConfigError, match="rate_limits: email: expected STARTS/s"):
        config.load(None, {"GOQUEUE_CONFIG": str(path)})
    with pytest.raises(ActorDefinitionError, match="rate_limit must be N/s, N/m or N/h"):
        actor("x", rate_limit="5 per second")


def test_memory_pacing_grants_missed_starts_and_takes_back_unused_ones() -> None:
    times = StartTimes()
    rate = Rate(4, 1.0)  # a start every 0.25 s
    taken = times.take("a", rate, 2, now=100.0)
    assert (taken.granted, taken.tat) == (2, 100.5) and taken.seconds_left == pytest.approx(0.5)
    assert times.take("a", rate, 5, now=100.3).granted == 0
    times.give_back("a", 100.5, 1)  # as if only one had been taken: the next is due at 100.25
    assert times.take("a", rate, 5, now=100.3).granted == 1
    assert times.take("a", rate, 5, now=101.1).granted == 3  # due at 100.55, 100.8, 101.05
    assert times.take("a", rate, 9, now=200.0).granted == 4  # idle: the limit, never more


@given(
    st.lists(st.tuples(st.floats(0.0, 0.6), st.integers(0, 12), st.integers(0, 12)), max_size=80)
)
def test_paced_starts_in_any_sliding_period_are_at_most_the_limit_plus_one(
    steps: list[tuple[float, int, int]],
) -> None:
    times, rate, now, started = StartTimes(), Rate(5, 1.0), 1000.0, []
    for gap, want, unused in steps:
        now += gap
        taken = times.take("a", rate, want, now)
        unused = min(unused, taken.granted)
        times.give_back("a", taken.tat, unused)
        started += [now] * (taken.granted - unused)
    started.sort()
    for i, at in enumerate(started):
        assert len([t for t in started[i:] if t - at <= rate.period]) <= rate.limit + 1
