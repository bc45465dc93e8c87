"""`goqueue jobs cancel --queue Q [--type T]` and `goqueue queues clear Q`: cancel the
unfinished jobs a filter selects, through `goqueue.Client.cancel_many` (`POST
/jobs/cancel`). Running jobs are left alone, and counted, unless `--force`."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from goqueue.api.cli.common import (
    EXIT_DECLINED,
    EXIT_OK,
    EXIT_USAGE,
    command,
    print_json,
    rfc3339,
)
from goqueue.api.wire import MAX_BULK_CANCEL, BulkCancelled
from goqueue.client import core
from goqueue.client.sync import Client

if TYPE_CHECKING:
    from goqueue.api.cli.common import Subparsers


def _filters(args: argparse.Namespace) -> core.CancelFilters:
    """The filters and switches given on the command line."""
    filters: core.CancelFilters = {}
    if args.queue is not None:
        filters["queue"] = args.queue
    if args.type is not None:
        filters["type"] = args.type
    if getattr(args, "created_before", None) is not None:
        filters["created_before"] = args.created_before
    if args.pending_only:
        filters["status"] = "pending"
    if args.force:
        filters["force"] = True
    return filters


def summary(done: BulkCancelled, *, more_hint: str) -> str:
    """What a bulk cancel did, in a line or three an operator can act on."""
    noun = "job" if done.cancelled == 1 else "jobs"
    lines = [f"cancelled {done.cancelled} {noun}"]
    if done.killed == 1:
        lines[0] += " (1 running: its worker is being killed)"
    elif done.killed:
        lines[0] += f" ({done.killed} running: their workers are being killed)"
    if done.remaining:
        lines.append(f"{done.remaining} matching left: {more_hint}")
    if done.running:
        lines.append(f"{done.running} running left alone: add --force to kill them")
    return "\n".join(lines)


@command
def cmd_jobs_cancel(client: Client, args: argparse.Namespace) -> int:
    """POST /jobs/cancel once, with the filters given (at most --limit jobs)."""
    filters = _filters(args)
    if not filters.keys() - {"force"} and not args.all:
        print(
            "goqueue jobs cancel: give a filter (--queue, --type, --pending, "
            "--created-before) or --all to cancel every unfinished job",
            file=sys.stderr,
        )
        return EXIT_USAGE
    if args.all:
        filters["all"] = True
    if args.limit is not None:
        filters["limit"] = args.limit
    done = client.cancel_many(**filters)
    if args.json:
        return print_json(done)
    print(summary(done, more_hint="run it again, or raise --limit"))
    return EXIT_OK


@command
def cmd_queue_clear(client: Client, args: argparse.Namespace) -> int:
    """Cancel every pending job of a queue (running ones too with --force), after a
    confirmation unless --yes: POST /jobs/cancel until none matching is left."""
    if not args.yes and not _confirmed(args):
        print("goqueue queues clear: nothing cancelled", file=sys.stderr)
        return EXIT_DECLINED
    filters = _filters(args)
    filters["limit"] = MAX_BULK_CANCEL
    total = BulkCancelled(0, 0, 0, 0)
    while True:  # each call takes at most MAX_BULK_CANCEL; ends when a call takes none
        done = client.cancel_many(**filters)
        total = BulkCancelled(
            total.cancelled + done.cancelled,
            total.killed + done.killed,
            done.remaining,
            done.running,
        )
        if not done.remaining or not done.cancelled:
            break
    if args.json:
        return print_json(total)
    print(f"queue {args.queue}: " + summary(total, more_hint="changing meanwhile; run it again"))
    return EXIT_OK


def _confirmed(args: argparse.Namespace) -> bool:
    """Ask on the terminal (or read the answer from standard input)."""
    what = "pending and running" if args.force else "pending"
    of_type = f" of type {args.type}" if args.type else ""
    print(f"cancel every {what} job{of_type} in queue {args.queue}? [y/N] ", end="", flush=True)
    try:
        answer = sys.stdin.readline()
        piped = not sys.stdin.isatty()
    except (OSError, ValueError):
        answer, piped = "", True
    if piped:
        print()  # a terminal echoed the answer's newline; a pipe did not
    return answer.strip().lower() in ("y", "yes")


def _add_force(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--force", action="store_true", help="cancel running jobs too: their workers are killed"
    )


def add_jobs_cancel(jobs: argparse.ArgumentParser, common: argparse.ArgumentParser) -> Subparsers:
    """`goqueue jobs cancel [filters]`; the actions of `jobs`, for its caller to add
    `list` to."""
    actions = jobs.add_subparsers(dest="jobs_action", metavar="ACTION", required=False)
    p = actions.add_parser(
        "cancel",
        parents=[common],
        help="cancel the unfinished jobs a filter selects, oldest first",
        description="Cancel pending jobs in bulk (one request, at most --limit, oldest "
        "first); running ones are left alone unless --force.",
    )
    p.add_argument("--queue", metavar="Q", help="only jobs of this queue")
    p.add_argument("--type", metavar="T", help="only jobs of this type")
    p.add_argument("--pending", dest="pending_only", action="store_true", help="only pending jobs")
    p.add_argument(
        "--created-before", type=rfc3339, metavar="RFC3339", help="only jobs created before"
    )
    p.add_argument(
        "--limit",
        type=int,
        metavar="N",
        help=f"at most N jobs (default 100, at most {MAX_BULK_CANCEL})",
    )
    p.add_argument("--all", action="store_true", help="every unfinished job (no filter)")
    _add_force(p)
    p.set_defaults(func=cmd_jobs_cancel)
    return actions


def add_queues_clear(queues: Subparsers, common: argparse.ArgumentParser) -> None:
    """`goqueue queues clear Q [--type T] [--force] [--yes]`."""
    p = queues.add_parser(
        "clear",
        parents=[common],
        help="cancel every pending job of a queue (asks first, unless --yes)",
    )
    p.add_argument("queue", metavar="QUEUE")
    p.add_argument("--type", metavar="T", help="only jobs of this type")
    p.add_argument("--yes", action="store_true", help="do not ask for a confirmation")
    _add_force(p)
    p.set_defaults(func=cmd_queue_clear, pending_only=False)
