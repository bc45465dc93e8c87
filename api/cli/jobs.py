"""The `goqueue` client subcommands: enqueue, inspect and manage jobs on a running node.

A thin layer over `goqueue.Client` (standard library HTTP, keep-alive, safe retries):
each command makes one call and prints its typed answer. What every command shares
(the client, exit codes, error reports, argument types) is in `client_common`; the tables
and key/value blocks printed for people are formatted in `client_output`; `--json` prints
the answer as the API sent it. The dead-letter and schedule commands are in `client_dlq`
and `client_schedules`.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from goqueue.api.cli.cancels import add_jobs_cancel, add_queues_clear
from goqueue.api.cli.common import (
    DEFAULT_HTTP_TIMEOUT,
    DEFAULT_URL,
    EXIT_HTTP_ERROR,
    EXIT_OK,
    EXIT_USAGE,
    Handler,
    add_paging,
    command,
    json_value,
    non_negative,
    plain,
    positive,
    print_json,
    rfc3339,
)
from goqueue.api.cli.dlq import add_dlq
from goqueue.api.cli.output import (
    EVENT_COLUMNS,
    JOB_COLUMNS,
    JOB_FIELD_ORDER,
    counts,
    fields,
    page_footer,
    priority_depth,
    table,
    without_tracebacks,
)
from goqueue.api.cli.schedules import add_schedules
from goqueue.client.errors import Conflict
from goqueue.client.sync import Client
from goqueue.supervisor.common.jobs import (
    DEFAULT_MAX_RETRIES,
    DEFAULT_PRIORITY,
    DEFAULT_QUEUE,
    STATUSES,
)

if TYPE_CHECKING:
    from goqueue.api.cli.common import Subparsers

_JOB_OPTIONS = (
    ("queue", "queue"),
    ("priority", "priority"),
    ("max_retries", "max_retries"),
    ("run_at", "run_at"),
    ("delay_seconds", "delay"),
    ("timeout_seconds", "timeout"),
    ("dedupe_key", "dedupe_key"),
    ("dedupe_window_seconds", "dedupe_window"),
    ("unique_key", "unique_key"),
    ("concurrency_key", "concurrency_key"),
    ("debounce_key", "debounce_key"),
    ("debounce_seconds", "debounce_seconds"),
    ("debounce_max_seconds", "debounce_max"),
    ("webhook_url", "webhook_url"),
    ("on_success", "on_success"),
    ("on_failure", "on_failure"),
    ("idempotency_key", "idempotency_key"),
)


def _job_options(args: argparse.Namespace) -> dict[str, Any]:
    """The job options given on the command line (what was not given is left out)."""
    given = {name: getattr(args, dest) for name, dest in _JOB_OPTIONS}
    return {k: v for k, v in given.items() if v is not None}


@command
def cmd_enqueue(client: Client, args: argparse.Namespace) -> int:
    """POST /jobs; an idempotent repeat (200) is reported as such."""
    if args.dedupe_window is not None and args.dedupe_key is None:
        print("goqueue enqueue: --dedupe-window needs --dedupe-key", file=sys.stderr)
        return EXIT_USAGE
    job, created = client.submit(args.type, args.payload, **_job_options(args))
    if args.json:
        return print_json(job)
    if created:
        print(f"enqueued job {job.id}")
    elif args.debounce_key is not None:
        print(f"job {job.id} not started yet takes this payload (debounced)")
    else:
        print(f"job {job.id} already exists for this Idempotency-Key (nothing enqueued)")
    print(fields(plain(job), JOB_FIELD_ORDER))
    return EXIT_OK


@command
def cmd_jobs(client: Client, args: argparse.Namespace) -> int:
    """GET /jobs with filters, newest first, as a table."""
    page = client.jobs_page(
        type=args.type,
        status=args.status,
        queue=args.queue,
        concurrency_key=args.concurrency_key,
        limit=args.limit,
        offset=args.offset,
    )
    if args.json:
        return print_json(page)
    data = plain(page)
    jobs = data["jobs"]
    if jobs:
        print(table(jobs, JOB_COLUMNS))
    print(page_footer("jobs", len(jobs), data))
    return EXIT_OK


@command
def cmd_job(client: Client, args: argparse.Namespace) -> int:
    """GET /jobs/{id} as a key/value block."""
    job = client.get(args.id)
    if args.json:
        return print_json(job)
    shown, traceback = without_tracebacks(plain(job))
    print(fields(shown, JOB_FIELD_ORDER))
    if traceback:
        print(traceback)
    return EXIT_OK


@command
def cmd_events(client: Client, args: argparse.Namespace) -> int:
    """GET /jobs/{id}/events: the job's audit trail, oldest first."""
    events = client.events(args.id)
    if args.json:
        return print_json({"events": events})
    print(table(plain(events), EVENT_COLUMNS) if events else "no events")
    return EXIT_OK


@command
def cmd_cancel(client: Client, args: argparse.Namespace) -> int:
    """DELETE /jobs/{id}, with force=true to kill a running job."""
    try:
        job = client.cancel(args.id, force=args.force)
    except Conflict as exc:
        if exc.details and exc.details.get("status") == "running" and not args.force:
            print(
                f"goqueue cancel: job {args.id} is running: add --force to kill it", file=sys.stderr
            )
            return EXIT_HTTP_ERROR
        raise
    if args.json:
        return print_json(job)
    print(f"job {job.id}: {job.status}")
    return EXIT_OK


@command
def cmd_stats(client: Client, args: argparse.Namespace) -> int:
    """GET /stats: counts by status, pending depth by queue, dead letters, workers."""
    stats = client.stats()
    if args.json:
        return print_json(stats)
    print(counts("status", stats.counts, STATUSES))
    if stats.queues:
        rows = [
            {"queue": name, "pending": sum(depth.values()), "by_priority": priority_depth(depth)}
            for name, depth in sorted(stats.queues.items())
        ]
        print()
        print(table(rows, ("queue", "pending", "by_priority")))
    workers = stats.workers
    print()
    print(f"dead letters  {stats.dead_letters}")
    print(f"workers       busy {workers.get('busy', '-')}, idle {workers.get('idle', '-')}")
    return EXIT_OK


@command
def cmd_queues(client: Client, args: argparse.Namespace) -> int:
    """GET /stats: the queues with pending jobs, deepest first."""
    stats = client.stats()
    if args.json:
        return print_json({"queues": stats.queues})
    deepest = sorted(stats.queues.items(), key=lambda item: (-sum(item[1].values()), item[0]))
    rows = [
        {"queue": name, "pending": sum(depth.values()), "by_priority": priority_depth(depth)}
        for name, depth in deepest
    ]
    if rows:
        print(table(rows, ("queue", "pending", "by_priority")))
    print(f"{len(rows)} queue{'' if len(rows) == 1 else 's'} with pending jobs")
    return EXIT_OK


@command
def cmd_queue_stats(client: Client, args: argparse.Namespace) -> int:
    """GET /queues/{name}/stats: one queue's counts."""
    stats = client.queue_stats(args.name)
    if args.json:
        return print_json(stats)
    head = {
        "queue": stats.queue,
        "paused": "yes" if stats.paused else "no",
        "pending by priority": priority_depth(stats.depth_by_priority),
    }
    print(fields(head))
    print()
    print(counts("status", stats.counts, STATUSES))
    return EXIT_OK


def _queue_switch(paused: bool) -> Handler:
    """POST /queues/{name}/pause or /resume."""

    def handler(client: Client, args: argparse.Namespace) -> int:
        stats = client.pause(args.queue) if paused else client.resume(args.queue)
        if args.json:
            return print_json(stats)
        print(f"queue {args.queue}: {'paused' if paused else 'resumed'}")
        return EXIT_OK

    handler.__doc__ = f"POST /queues/{{name}}/{'pause' if paused else 'resume'}."
    return handler


cmd_pause = command(_queue_switch(True))
cmd_resume = command(_queue_switch(False))


# --- parser ------------------------------------------------------------------------------


def add_connection_options(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup, *, before_command: bool = False
) -> None:
    """--url, --api-key and --http-timeout. Before the command they are stored apart
    (`global_url`...), so that `serve`'s own --api-key can never take them by mistake;
    after it they default to nothing at all, so they never hide the ones before it."""
    prefix = "global_" if before_command else ""
    absent = None if before_command else argparse.SUPPRESS
    parser.add_argument(
        "--url",
        dest=f"{prefix}url",
        metavar="URL",
        default=absent,
        help=f"the node's base URL (default: $GOQUEUE_URL, else {DEFAULT_URL})",
    )
    parser.add_argument(
        "--api-key",
        dest=f"{prefix}api_key",
        default=absent,
        metavar="KEY",
        help="sent as X-API-Key (default: $GOQUEUE_API_KEY, else $API_KEY)",
    )
    parser.add_argument(
        "--http-timeout",
        dest=f"{prefix}http_timeout",
        default=absent,
        type=positive,
        metavar="SECONDS",
        help=f"how long to wait for the node (default: {DEFAULT_HTTP_TIMEOUT:g})",
    )


def _common_options() -> argparse.ArgumentParser:
    """Options every client subcommand takes (a parent parser)."""
    common = argparse.ArgumentParser(add_help=False)
    add_connection_options(common.add_argument_group("connection"))
    common.add_argument("--json", action="store_true", help="print the server's JSON answer")
    return common


def _add_enqueue(subparsers: Subparsers, common: argparse.ArgumentParser) -> None:
    """`goqueue enqueue TYPE [options]`."""
    p = subparsers.add_parser("enqueue", parents=[common], help="enqueue a job")
    p.add_argument("type", metavar="TYPE", help="the job type (an actor's name)")
    p.add_argument(
        "--payload", type=json_value, metavar="JSON", help="JSON payload; @FILE or @- reads it"
    )
    p.add_argument(
        "--queue", metavar="Q", help=f"queue name (default: the actor's, else {DEFAULT_QUEUE})"
    )
    p.add_argument(
        "--priority",
        type=int,
        metavar="N",
        help=f"0 to 10, higher runs first (default: the actor's, else {DEFAULT_PRIORITY})",
    )
    p.add_argument(
        "--max-retries",
        type=int,
        metavar="N",
        help=f"retries after the first attempt (default: the actor's, else {DEFAULT_MAX_RETRIES})",
    )
    when = p.add_mutually_exclusive_group()
    when.add_argument(
        "--delay", type=non_negative, metavar="SECONDS", help="run this many seconds from now"
    )
    when.add_argument(
        "--run-at", type=rfc3339, metavar="RFC3339", help="run at this time (with an offset)"
    )
    p.add_argument(
        "--timeout",
        type=positive,
        metavar="SECONDS",
        help="seconds one attempt may run before its worker is killed (default: the actor's, "
        "else the node's --default-timeout; the HTTP timeout is --http-timeout)",
    )
    p.add_argument(
        "--dedupe-key",
        metavar="K",
        help="refuse another job with this key inside the window (needs --dedupe-window)",
    )
    p.add_argument(
        "--dedupe-window", type=positive, metavar="S", help="seconds the dedupe key blocks"
    )
    p.add_argument(
        "--unique-key",
        metavar="K",
        help="refuse another job with this key while this one is not finished (409)",
    )
    p.add_argument(
        "--concurrency-key",
        metavar="K",
        help="the job's flow-control key: its actor's key_concurrency and key_rate_limit "
        "bound the jobs sharing it",
    )
    p.add_argument(
        "--debounce-key",
        metavar="K",
        help="while a job of the type with this key has not started, replace its payload "
        "and put it off (needs --debounce-seconds)",
    )
    p.add_argument(
        "--debounce-seconds", type=positive, metavar="S", help="how long it waits for the next"
    )
    p.add_argument(
        "--debounce-max",
        type=positive,
        metavar="S",
        help="the longest a burst puts its job off, from the first enqueue",
    )
    p.add_argument(
        "--idempotency-key",
        metavar="K",
        help="sent as the Idempotency-Key header (default: a fresh one, so that a retry "
        "after a dropped connection or a 503 never enqueues twice)",
    )
    p.add_argument(
        "--webhook-url", metavar="URL", help="POSTed the job when it is done or has failed"
    )
    p.add_argument(
        "--on-success", type=json_value, metavar="JSON", help="a job to enqueue when it succeeds"
    )
    p.add_argument(
        "--on-failure",
        type=json_value,
        metavar="JSON",
        help="a job to enqueue when it fails for good",
    )
    p.set_defaults(func=cmd_enqueue)


def _add_jobs(subparsers: Subparsers, common: argparse.ArgumentParser) -> None:
    """`goqueue jobs`, `job ID`, `events ID`, `cancel ID`."""
    p = subparsers.add_parser(
        "jobs", parents=[common], help="list jobs, newest first (or cancel them in bulk)"
    )
    _add_listing(p)
    listing = add_jobs_cancel(p, common)
    _add_listing(listing.add_parser("list", parents=[common], help="list jobs, newest first"))

    p = subparsers.add_parser("job", parents=[common], help="show one job")
    p.add_argument("id", metavar="ID", help="the job's id")
    p.set_defaults(func=cmd_job)

    p = subparsers.add_parser("events", parents=[common], help="show a job's audit trail")
    p.add_argument("id", metavar="ID", help="the job's id")
    p.set_defaults(func=cmd_events)

    p = subparsers.add_parser(
        "cancel", parents=[common], help="cancel a job (a running one needs --force)"
    )
    p.add_argument("id", metavar="ID", help="the job's id")
    p.add_argument(
        "--force", action="store_true", help="cancel a running job too: its worker is killed"
    )
    p.set_defaults(func=cmd_cancel)


def _add_listing(p: argparse.ArgumentParser) -> None:
    """`goqueue jobs [list]`'s filters and paging."""
    p.add_argument("--type", metavar="T", help="only this job type")
    p.add_argument("--status", choices=STATUSES, help="only this status")
    p.add_argument("--queue", metavar="Q", help="only this queue")
    p.add_argument("--concurrency-key", metavar="K", help="only jobs with this flow-control key")
    add_paging(p)
    p.set_defaults(func=cmd_jobs)


def _add_queues(subparsers: Subparsers, common: argparse.ArgumentParser) -> None:
    """`goqueue stats`, `queue-stats NAME`, `pause QUEUE`, `resume QUEUE`."""
    p = subparsers.add_parser(
        "stats", parents=[common], help="counts by status, depth by queue, dead letters, workers"
    )
    p.set_defaults(func=cmd_stats)

    p = subparsers.add_parser(
        "queue-stats", parents=[common], help="one queue's counts and whether it is paused"
    )
    p.add_argument("name", metavar="NAME")
    p.set_defaults(func=cmd_queue_stats)

    p = subparsers.add_parser(
        "queues", parents=[common], help="queues with pending jobs; clear one (bulk cancel)"
    )
    p.set_defaults(func=cmd_queues)
    actions = p.add_subparsers(dest="queues_action", metavar="ACTION", required=False)
    actions.add_parser("list", parents=[common], help="queues with pending jobs, by depth")
    add_queues_clear(actions, common)

    p = subparsers.add_parser("pause", parents=[common], help="stop dispatching from a queue")
    p.add_argument("queue", metavar="QUEUE")
    p.set_defaults(func=cmd_pause)

    p = subparsers.add_parser("resume", parents=[common], help="dispatch from a queue again")
    p.add_argument("queue", metavar="QUEUE")
    p.set_defaults(func=cmd_resume)


def add_client_commands(subparsers: Subparsers) -> None:
    """Register the client subcommands; each sets `func(args) -> exit code`."""
    common = _common_options()
    _add_enqueue(subparsers, common)
    _add_jobs(subparsers, common)
    _add_queues(subparsers, common)
    add_dlq(subparsers, common)
    add_schedules(subparsers, common)
