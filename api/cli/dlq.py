"""`goqueue dlq`: list, show, replay and purge dead letters, one by id or every letter a
filter selects (`goqueue dlq replay --all --type email`). A thin layer over
`goqueue.Client.dlq`, as the other client commands (`client`)."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, TypeAlias, cast

from goqueue.api.cli.common import (
    EXIT_OK,
    EXIT_USAGE,
    add_paging,
    command,
    plain,
    print_json,
    rfc3339,
)
from goqueue.api.cli.output import (
    DEAD_COLUMNS,
    JOB_FIELD_ORDER,
    dead_row,
    fields,
    page_footer,
    table,
    without_tracebacks,
)
from goqueue.client import core
from goqueue.client.sync import Client

if TYPE_CHECKING:
    from goqueue.api.cli.common import Subparsers

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"([0-9]+(?:\.[0-9]+)?)([smhdw])")
_FILTERS = ("type", "queue", "error", "before", "after", "older_than", "newer_than")
Bulk: TypeAlias = tuple[object, int, int]  # the answer, letters taken, matching left


def duration(text: str) -> timedelta:
    """`90s`, `15m`, `12h`, `7d`, `2w`: a positive length of time."""
    match = _DURATION.fullmatch(text.strip())
    if match is None or float(match[1]) <= 0:
        raise argparse.ArgumentTypeError(
            f"not a duration: {text} (a number and s, m, h, d or w: 7d, 12h)"
        )
    return timedelta(seconds=float(match[1]) * _UNITS[match[2]])


def selection(args: argparse.Namespace, now: datetime) -> core.DeadSelection:
    """The filters given: `--older-than 7d` is `before` a week ago, `--newer-than` is
    `after`."""
    filters: core.DeadSelection = {}
    for name in ("type", "queue", "error", "before", "after"):
        value = getattr(args, name)
        if value is not None:
            filters[name] = value
    if args.older_than is not None:
        filters["before"] = now - args.older_than
    if args.newer_than is not None:
        filters["after"] = now - args.newer_than
    return filters


def bulk_filters(args: argparse.Namespace, now: datetime) -> core.DeadFilters:
    """The filters of `--all`; with none at all, every letter (`all=true`)."""
    chosen = selection(args, now)
    return cast(core.DeadFilters, chosen) if chosen else {"all": True}


def _bulk_usage(args: argparse.Namespace, verb: str) -> str | None:
    """What is wrong with the way `replay`/`purge` was asked for, if anything."""
    filtered = [f"--{n.replace('_', '-')}" for n in _FILTERS if getattr(args, n) is not None]
    if args.id is not None and (args.all or filtered or args.limit is not None):
        return f"give a dead letter's ID, or --all with filters, not both ({verb})"
    if args.id is None and not args.all:
        hint = f" (with {' '.join(filtered)})" if filtered else ""
        return f"give a dead letter's ID, or --all{hint} to {verb} every matching letter"
    return _times_usage(args)


def _times_usage(args: argparse.Namespace) -> str | None:
    if args.older_than is not None and args.before is not None:
        return "give --older-than or --before, not both"
    if args.newer_than is not None and args.after is not None:
        return "give --newer-than or --after, not both"
    return None


@command
def cmd_dlq_list(client: Client, args: argparse.Namespace) -> int:
    """GET /dlq as a table (the job's type, queue, attempts and last error inline)."""
    if (problem := _times_usage(args)) is not None:
        print(f"goqueue dlq list: {problem}", file=sys.stderr)
        return EXIT_USAGE
    filters = selection(args, datetime.now(UTC))
    page = client.dlq.page(limit=args.limit, offset=args.offset, **filters)
    if args.json:
        return print_json(page)
    data = plain(page)
    letters = data["dead_letters"]
    if letters:
        print(table([dead_row(d) for d in letters], DEAD_COLUMNS))
    print(page_footer("dead letters", len(letters), data))
    return EXIT_OK


@command
def cmd_dlq_show(client: Client, args: argparse.Namespace) -> int:
    """GET /dlq/{id} (the letter's id or its job's): the letter, every attempt's error,
    then the job snapshot."""
    dead = client.dlq.get(args.id)
    if args.json:
        return print_json(dead)
    data = plain(dead)
    head = {k: v for k, v in data.items() if k != "job"}
    head, traceback = without_tracebacks(head)
    print(fields(head, ("id", "job_id", "created_at", "errors")))
    if traceback:
        print(traceback)
    # The snapshot's own `errors` repeat the letter's, shown just above.
    snapshot = {k: v for k, v in data["job"].items() if k != "errors"}
    print("job:")
    print(fields(snapshot, JOB_FIELD_ORDER, indent="  "))
    return EXIT_OK


@command
def cmd_dlq_replay(client: Client, args: argparse.Namespace) -> int:
    """POST /dlq/{id}/replay, or POST /dlq/replay with filters (`--all`)."""

    def every(filters: core.DeadFilters, limit: int | None) -> Bulk:
        replayed = client.dlq.replay_many(limit=limit, **filters)
        return replayed, replayed.replayed, replayed.remaining

    def one(dead_id: str) -> tuple[object, str]:
        job = client.dlq.replay(dead_id)
        return job, f"dead letter {dead_id} replayed as job {job.id}"

    return _one_or_every(args, "replay", "replayed", one, every)


@command
def cmd_dlq_purge(client: Client, args: argparse.Namespace) -> int:
    """DELETE /dlq/{id}, or DELETE /dlq with filters (`--all`)."""

    def every(filters: core.DeadFilters, limit: int | None) -> Bulk:
        purged = client.dlq.purge_many(limit=limit, **filters)
        return purged, purged.purged, purged.remaining

    def one(dead_id: str) -> tuple[object, str]:
        purged_id = client.dlq.purge(dead_id)
        return {"purged": purged_id}, f"dead letter {purged_id} purged"

    return _one_or_every(args, "purge", "purged", one, every)


def _one_or_every(
    args: argparse.Namespace,
    verb: str,
    done: str,
    one: Callable[[str], tuple[object, str]],
    every: Callable[[core.DeadFilters, int | None], Bulk],
) -> int:
    """`replay` or `purge`: the letter `args.id` (`one` gives the answer and its line),
    or with `--all` every letter the filters select (`every`, `--limit` at most)."""
    if (problem := _bulk_usage(args, verb)) is not None:
        print(f"goqueue dlq {verb}: {problem}", file=sys.stderr)
        return EXIT_USAGE
    if args.id is None:
        answer, count, remaining = every(bulk_filters(args, datetime.now(UTC)), args.limit)
        line = f"{done} {_letters(count)} ({remaining} matching left)"
    else:
        answer, line = one(args.id)
    if args.json:
        return print_json(answer)
    print(line)
    return EXIT_OK


def _letters(n: int) -> str:
    return f"{n} dead letter{'' if n == 1 else 's'}"


def add_dlq(subparsers: Subparsers, common: argparse.ArgumentParser) -> None:
    """`goqueue dlq list|show ID|replay ID|purge ID`, and `replay|purge --all [filters]`."""
    dlq = subparsers.add_parser("dlq", help="dead letters: list, show, replay, purge")
    actions = dlq.add_subparsers(dest="dlq_action", metavar="ACTION", required=True)

    p = actions.add_parser("list", parents=[common], help="list dead letters, newest first")
    add_paging(p)
    _add_filters(p.add_argument_group("only the letters (every filter given must match)"))
    p.set_defaults(func=cmd_dlq_list)

    p = actions.add_parser(
        "show", parents=[common], help="show a dead letter with every attempt's error"
    )
    p.add_argument("id", metavar="ID", help="the dead letter's id, or its job's id")
    p.set_defaults(func=cmd_dlq_show)

    for name, func, text in (
        ("replay", cmd_dlq_replay, "enqueue a fresh job from a dead letter, or from each match"),
        ("purge", cmd_dlq_purge, "delete a dead letter, or every match"),
    ):
        p = actions.add_parser(name, parents=[common], help=text)
        p.add_argument("id", metavar="ID", nargs="?", help="the dead letter's id, or its job's id")
        _add_bulk_options(p, name)
        p.set_defaults(func=func)


def _add_bulk_options(parser: argparse.ArgumentParser, verb: str) -> None:
    bulk = parser.add_argument_group(
        f"{verb} every matching letter (oldest first; every filter given must match)"
    )
    bulk.add_argument(
        "--all",
        action="store_true",
        help=f"{verb} every dead letter the filters select (all of them with no filter)",
    )
    _add_filters(bulk)
    bulk.add_argument(
        "--limit",
        type=int,
        metavar="N",
        help="at most N letters, in one request (default: every match)",
    )


def _add_filters(bulk: argparse._ArgumentGroup) -> None:
    bulk.add_argument("--type", metavar="T", help="only letters of jobs of this type")
    bulk.add_argument("--queue", metavar="Q", help="only letters of jobs of this queue")
    bulk.add_argument(
        "--error", metavar="TEXT", help="only letters whose last error contains TEXT (any case)"
    )
    bulk.add_argument(
        "--older-than", type=duration, metavar="AGE", help="only letters older than AGE (7d)"
    )
    bulk.add_argument(
        "--newer-than", type=duration, metavar="AGE", help="only letters newer than AGE (1h)"
    )
    bulk.add_argument("--before", type=rfc3339, metavar="TIME", help="dead-lettered before")
    bulk.add_argument("--after", type=rfc3339, metavar="TIME", help="dead-lettered after")
