"""`goqueue schedules [list]`, `goqueue schedules enable NAME`, `... disable NAME`: the
node's periodic jobs, through `goqueue.Client.schedules`."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from goqueue.api.cli.common import EXIT_OK, command, plain, print_json
from goqueue.api.cli.output import table
from goqueue.client.sync import Client

if TYPE_CHECKING:
    from goqueue.api.cli.common import Subparsers

SCHEDULE_COLUMNS = ("name", "type", "when", "enabled", "next_fire", "last_fire", "last_job_id")


def schedule_row(schedule: dict[str, Any]) -> dict[str, Any]:
    """A schedule as a table row: its timetable in one column (`every 30 s`, or the cron
    expression with its time zone when not UTC)."""
    if schedule["cron"] is not None:
        when = schedule["cron"]
        if schedule["timezone"] != "UTC":
            when += f" ({schedule['timezone']})"
    else:
        when = f"every {schedule['every_seconds']} s"
    return {**schedule, "when": when, "enabled": "yes" if schedule["enabled"] else "no"}


@command
def cmd_schedules(client: Client, args: argparse.Namespace) -> int:
    """GET /schedules as a table."""
    schedules = client.schedules.list()
    if args.json:
        return print_json({"schedules": schedules})
    rows = [schedule_row(s) for s in plain(schedules)]
    if rows:
        print(table(rows, SCHEDULE_COLUMNS))
    print(f"{len(rows)} schedule{'' if len(rows) == 1 else 's'}")
    return EXIT_OK


def _switch(enabled: bool) -> Any:
    def handler(client: Client, args: argparse.Namespace) -> int:
        """POST /schedules/{name}/enable or /disable."""
        if enabled:
            schedule = client.schedules.enable(args.name)
        else:
            schedule = client.schedules.disable(args.name)
        if args.json:
            return print_json(schedule)
        state = "enabled" if schedule.enabled else "disabled"
        nxt = f"; next fire {schedule.next_fire.isoformat()}" if schedule.next_fire else ""
        print(f"schedule {schedule.name} {state}{nxt}")
        return EXIT_OK

    return command(handler)


def add_schedules(subparsers: Subparsers, common: argparse.ArgumentParser) -> None:
    """`goqueue schedules [enable NAME | disable NAME]`."""
    p = subparsers.add_parser(
        "schedules",
        parents=[common],
        help="periodic jobs: list them (next and last fire), enable, disable",
    )
    p.set_defaults(func=cmd_schedules)
    actions = p.add_subparsers(dest="schedules_action", metavar="ACTION", required=False)
    actions.add_parser("list", parents=[common], help="list them (the same as no action)")
    for name, enabled, text in (
        ("enable", True, "enable a schedule (it fires from its next tick on)"),
        ("disable", False, "disable a schedule (its ticks enqueue nothing)"),
    ):
        action = actions.add_parser(name, parents=[common], help=text)
        action.add_argument("name", metavar="NAME", help="the schedule's name")
        action.set_defaults(func=_switch(enabled))
