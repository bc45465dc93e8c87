"""The `goqueue` client subcommands: enqueue, inspect and manage jobs on a running node.

HTTP goes through `urllib.request` only, so the client needs no event loop and no
dependency beyond the standard library. Exit codes: 0 success, 1 the server answered with
an error, 2 the server could not be reached (or the command line was wrong, as argparse).
The tables and key/value blocks printed for people are formatted in `client_output`.
"""

from __future__ import annotations

import argparse
import functools
import http.client
import json
import os
import socket
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

from goqueue.api.client_output import (
    DEAD_COLUMNS,
    EVENT_COLUMNS,
    JOB_COLUMNS,
    JOB_FIELD_ORDER,
    cell,
    counts,
    dead_row,
    fields,
    page_footer,
    priority_depth,
    table,
)
from goqueue.supervisor.jobs import DEFAULT_MAX_RETRIES, DEFAULT_PRIORITY, STATUSES

if TYPE_CHECKING:
    Subparsers: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]

DEFAULT_URL = "http://127.0.0.1:8080"
DEFAULT_HTTP_TIMEOUT = 10.0

EXIT_OK = 0
EXIT_HTTP_ERROR = 1
EXIT_UNREACHABLE = 2
EXIT_USAGE = 2  # as argparse


class ClientError(Exception):
    """A request that did not succeed; `exit_code` is what the command returns."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class HttpError(ClientError):
    """The server answered with an error status and (usually) `{"error", "details"}`."""

    def __init__(self, status: int, message: str, details: Any = None) -> None:
        super().__init__(message, EXIT_HTTP_ERROR)
        self.status = status
        self.details = details


class Unreachable(ClientError):
    """No answer: connection refused, timed out, unknown host, bad URL."""

    def __init__(self, message: str) -> None:
        super().__init__(message, EXIT_UNREACHABLE)


@dataclass(frozen=True, slots=True)
class Response:
    """A successful answer: its status (200 vs 201 matters for enqueue) and decoded JSON."""

    status: int
    data: Any


@dataclass(frozen=True, slots=True)
class Client:
    """A blocking JSON client for one node's API."""

    base_url: str
    api_key: str | None = None
    timeout: float = DEFAULT_HTTP_TIMEOUT

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, object] | None = None,
        body: object = None,
        headers: Mapping[str, str] | None = None,
    ) -> Response:
        """Send one request; raise `HttpError` or `Unreachable` unless it succeeds."""
        url = self.base_url.rstrip("/") + path + _query_string(query)
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if self.api_key:
            req.add_header("X-API-Key", self.api_key)
        for name, value in (headers or {}).items():
            req.add_header(name, value)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return Response(resp.status, _decode(resp.status, resp.read()))
        except urllib.error.HTTPError as exc:
            raise _http_error(exc) from None
        except urllib.error.URLError as exc:
            raise Unreachable(self._why_unreachable(exc.reason)) from None
        except (OSError, http.client.HTTPException) as exc:
            # A timeout while reading, or the connection dropped mid-answer.
            raise Unreachable(self._why_unreachable(exc)) from None

    def _why_unreachable(self, reason: object) -> str:
        """One line saying why the node did not answer."""
        where = self.base_url
        if isinstance(reason, ConnectionRefusedError):
            return f"cannot connect to {where}: connection refused (is `goqueue serve` running?)"
        if isinstance(reason, TimeoutError):
            return f"no answer from {where} within {self.timeout:g} s"
        if isinstance(reason, socket.gaierror):
            return f"cannot resolve the host in {where}: {reason.strerror}"
        return f"cannot reach {where}: {getattr(reason, 'strerror', None) or reason}"


def _query_string(query: Mapping[str, object] | None) -> str:
    """`?a=1&b=2` from the non-None items, or an empty string."""
    items = {k: _query_value(v) for k, v in (query or {}).items() if v is not None}
    return "?" + urllib.parse.urlencode(items) if items else ""


def _query_value(value: object) -> str:
    """Query values as the API expects them (booleans in lower case)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def _decode(status: int, raw: bytes) -> Any:
    """The JSON body of a successful answer (None when empty)."""
    if not raw.strip():
        return None
    try:
        return json.loads(raw)
    except ValueError:
        snippet = raw[:200].decode(errors="replace")
        raise HttpError(status, "the server's answer is not JSON", snippet) from None


def _http_error(exc: urllib.error.HTTPError) -> HttpError:
    """An `HttpError` carrying the server's `{"error", "details"}`, or whatever it sent."""
    try:
        raw = exc.read()
    except OSError:
        raw = b""
    try:
        body = json.loads(raw)
    except ValueError:
        body = None
    if isinstance(body, dict) and "error" in body:
        return HttpError(exc.code, str(body["error"]), body.get("details"))
    text = raw.decode(errors="replace").strip()[:200]
    return HttpError(exc.code, text or str(exc.reason))


def _segment(value: str) -> str:
    """A path segment, quoted so an id or queue name can never change the path."""
    return urllib.parse.quote(value, safe="")


# --- argument types --------------------------------------------------------------------


def _json_value(text: str) -> Any:
    """Parse a JSON option; `@FILE` reads it from a file, `@-` from standard input."""
    if text.startswith("@"):
        source = text[1:]
        try:
            text = sys.stdin.read() if source == "-" else Path(source).read_text(encoding="utf-8")
        except OSError as exc:
            raise argparse.ArgumentTypeError(f"cannot read {source}: {exc.strerror}") from None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON ({exc})") from None


def _positive(text: str) -> float:
    """A number of seconds greater than zero."""
    value = _number(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be greater than 0, not {text}")
    return value


def _non_negative(text: str) -> float:
    """A number of seconds, zero or more."""
    value = _number(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, not {text}")
    return value


def _number(text: str) -> float:
    """A finite float."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"not a finite number: {text}")
    return value


def _rfc3339(text: str) -> str:
    """An RFC 3339 time with a UTC offset (`2025-01-31T09:00:00Z`), passed on unchanged."""
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an RFC 3339 time: {text}") from None
    if parsed.tzinfo is None:
        raise argparse.ArgumentTypeError(f"needs a UTC offset (Z or +HH:MM): {text}")
    return text


# --- commands ----------------------------------------------------------------------------

Handler = Callable[[Client, argparse.Namespace], int]


def _client_from(args: argparse.Namespace) -> Client:
    """A client for the node named by --url / $GOQUEUE_URL, with the key and timeout."""
    url = args.url or os.environ.get("GOQUEUE_URL") or DEFAULT_URL
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise Unreachable(f"invalid URL {url!r}: expected http://HOST[:PORT]")
    key = args.api_key or os.environ.get("GOQUEUE_API_KEY") or os.environ.get("API_KEY")
    return Client(url, key or None, args.http_timeout or DEFAULT_HTTP_TIMEOUT)


def _report(exc: ClientError, client_has_key: bool) -> None:
    """Print a failed request to stderr: the server's message, then its details."""
    if not isinstance(exc, HttpError):
        print(f"goqueue: {exc}", file=sys.stderr)
        return
    print(f"goqueue: error: {exc} (HTTP {exc.status})", file=sys.stderr)
    if exc.details is not None:
        print(f"goqueue: details: {cell(exc.details)}", file=sys.stderr)
    if exc.status == 401 and not client_has_key:
        print("goqueue: hint: pass --api-key or set GOQUEUE_API_KEY", file=sys.stderr)


def _command(handler: Handler) -> Callable[[argparse.Namespace], int]:
    """Make a handler a subcommand: build the client, map failures to exit codes."""

    @functools.wraps(handler)
    def run(args: argparse.Namespace) -> int:
        try:
            client = _client_from(args)
        except ClientError as exc:
            _report(exc, client_has_key=False)
            return exc.exit_code
        try:
            return handler(client, args)
        except ClientError as exc:
            _report(exc, client_has_key=client.api_key is not None)
            return exc.exit_code

    return run


def _print_json(data: Any) -> int:
    """Print the server's JSON answer as it is (indented)."""
    print(json.dumps(data, indent=2))
    return EXIT_OK


def _job_body(args: argparse.Namespace) -> dict[str, Any]:
    """The POST /jobs body from the enqueue options, leaving out what was not given."""
    body = {
        "type": args.type,
        "queue": args.queue,
        "payload": args.payload,
        "priority": args.priority,
        "max_retries": args.max_retries,
        "run_at": args.run_at,
        "delay_seconds": args.delay,
        "timeout_seconds": args.timeout,
        "dedupe_key": args.dedupe_key,
        "dedupe_window_seconds": args.dedupe_window,
        "webhook_url": args.webhook_url,
        "on_success": args.on_success,
        "on_failure": args.on_failure,
    }
    return {k: v for k, v in body.items() if v is not None}


@_command
def cmd_enqueue(client: Client, args: argparse.Namespace) -> int:
    """POST /jobs; an idempotent repeat (200) is reported as such."""
    if args.dedupe_window is not None and args.dedupe_key is None:
        print("goqueue enqueue: --dedupe-window needs --dedupe-key", file=sys.stderr)
        return EXIT_USAGE
    headers = {"Idempotency-Key": args.idempotency_key} if args.idempotency_key else None
    resp = client.request("POST", "/jobs", body=_job_body(args), headers=headers)
    if args.json:
        return _print_json(resp.data)
    job = resp.data
    if resp.status == 201:
        print(f"enqueued job {job['id']}")
    else:
        print(f"job {job['id']} already exists for this Idempotency-Key (nothing enqueued)")
    print(fields(job, JOB_FIELD_ORDER))
    return EXIT_OK


@_command
def cmd_jobs(client: Client, args: argparse.Namespace) -> int:
    """GET /jobs with filters, newest first, as a table."""
    query = {
        "type": args.type,
        "status": args.status,
        "queue": args.queue,
        "limit": args.limit,
        "offset": args.offset,
    }
    page = client.request("GET", "/jobs", query=query).data
    if args.json:
        return _print_json(page)
    jobs = page.get("jobs", [])
    if jobs:
        print(table(jobs, JOB_COLUMNS))
    print(page_footer("jobs", len(jobs), page))
    return EXIT_OK


@_command
def cmd_job(client: Client, args: argparse.Namespace) -> int:
    """GET /jobs/{id} as a key/value block."""
    job = client.request("GET", f"/jobs/{_segment(args.id)}").data
    if args.json:
        return _print_json(job)
    print(fields(job, JOB_FIELD_ORDER))
    return EXIT_OK


@_command
def cmd_events(client: Client, args: argparse.Namespace) -> int:
    """GET /jobs/{id}/events: the job's audit trail, oldest first."""
    data = client.request("GET", f"/jobs/{_segment(args.id)}/events").data
    if args.json:
        return _print_json(data)
    events = data.get("events", [])
    print(table(events, EVENT_COLUMNS) if events else "no events")
    return EXIT_OK


@_command
def cmd_cancel(client: Client, args: argparse.Namespace) -> int:
    """DELETE /jobs/{id}, with force=true to kill a running job."""
    query = {"force": True} if args.force else None
    job = client.request("DELETE", f"/jobs/{_segment(args.id)}", query=query).data
    if args.json:
        return _print_json(job)
    print(f"job {job.get('id', args.id)}: {job.get('status', 'cancelled')}")
    return EXIT_OK


@_command
def cmd_stats(client: Client, args: argparse.Namespace) -> int:
    """GET /stats: counts by status, pending depth by queue, dead letters, workers."""
    stats = client.request("GET", "/stats").data
    if args.json:
        return _print_json(stats)
    print(counts("status", stats.get("counts", {}), STATUSES))
    queues = stats.get("queues", {})
    if queues:
        rows = [
            {"queue": name, "pending": sum(depth.values()), "by_priority": priority_depth(depth)}
            for name, depth in sorted(queues.items())
        ]
        print()
        print(table(rows, ("queue", "pending", "by_priority")))
    workers = stats.get("workers") or {}
    print()
    print(f"dead letters  {stats.get('dead_letters', 0)}")
    print(f"workers       busy {workers.get('busy', '-')}, idle {workers.get('idle', '-')}")
    return EXIT_OK


@_command
def cmd_queue_stats(client: Client, args: argparse.Namespace) -> int:
    """GET /queues/{name}/stats: one queue's counts."""
    stats = client.request("GET", f"/queues/{_segment(args.name)}/stats").data
    if args.json:
        return _print_json(stats)
    head = {
        "queue": stats.get("queue", args.name),
        "paused": "yes" if stats.get("paused") else "no",
        "pending by priority": priority_depth(stats.get("depth_by_priority", {})),
    }
    print(fields(head))
    print()
    print(counts("status", stats.get("counts", {}), STATUSES))
    return EXIT_OK


def _queue_switch(action: str) -> Handler:
    """POST /queues/{name}/pause or /resume."""

    def handler(client: Client, args: argparse.Namespace) -> int:
        data = client.request("POST", f"/queues/{_segment(args.queue)}/{action}").data
        if args.json:
            return _print_json(data)
        print(f"queue {args.queue}: {'paused' if action == 'pause' else 'resumed'}")
        return EXIT_OK

    handler.__doc__ = f"POST /queues/{{name}}/{action}."
    return handler


cmd_pause = _command(_queue_switch("pause"))
cmd_resume = _command(_queue_switch("resume"))


@_command
def cmd_dlq_list(client: Client, args: argparse.Namespace) -> int:
    """GET /dlq as a table (the job's type, queue, attempts and last error inline)."""
    page = client.request("GET", "/dlq", query={"limit": args.limit, "offset": args.offset}).data
    if args.json:
        return _print_json(page)
    letters = page.get("dead_letters", [])
    if letters:
        print(table([dead_row(d) for d in letters], DEAD_COLUMNS))
    print(page_footer("dead letters", len(letters), page))
    return EXIT_OK


@_command
def cmd_dlq_show(client: Client, args: argparse.Namespace) -> int:
    """GET /dlq/{id}: the letter, every attempt's error, then the job snapshot."""
    dead = client.request("GET", f"/dlq/{_segment(args.id)}").data
    if args.json:
        return _print_json(dead)
    head = {k: v for k, v in dead.items() if k != "job"}
    print(fields(head, ("id", "job_id", "created_at", "errors")))
    # The snapshot's own `errors` repeat the letter's, shown just above.
    snapshot = {k: v for k, v in (dead.get("job") or {}).items() if k != "errors"}
    print("job:")
    print(fields(snapshot, JOB_FIELD_ORDER, indent="  "))
    return EXIT_OK


@_command
def cmd_dlq_replay(client: Client, args: argparse.Namespace) -> int:
    """POST /dlq/{id}/replay: a fresh job from the letter."""
    job = client.request("POST", f"/dlq/{_segment(args.id)}/replay").data
    if args.json:
        return _print_json(job)
    print(f"dead letter {args.id} replayed as job {job['id']}")
    return EXIT_OK


@_command
def cmd_dlq_purge(client: Client, args: argparse.Namespace) -> int:
    """DELETE /dlq/{id}."""
    data = client.request("DELETE", f"/dlq/{_segment(args.id)}").data
    if args.json:
        return _print_json(data)
    print(f"dead letter {(data or {}).get('purged', args.id)} purged")
    return EXIT_OK


# --- parser ------------------------------------------------------------------------------


def _common_options() -> argparse.ArgumentParser:
    """Options every client subcommand takes (a parent parser)."""
    common = argparse.ArgumentParser(add_help=False)
    group = common.add_argument_group("connection")
    group.add_argument(
        "--url", help=f"the node's base URL (default: $GOQUEUE_URL, else {DEFAULT_URL})"
    )
    group.add_argument(
        "--api-key",
        metavar="KEY",
        help="sent as X-API-Key (default: $GOQUEUE_API_KEY, else $API_KEY)",
    )
    group.add_argument(
        "--http-timeout",
        type=_positive,
        metavar="SECONDS",
        help=f"how long to wait for the node (default: {DEFAULT_HTTP_TIMEOUT:g})",
    )
    common.add_argument("--json", action="store_true", help="print the server's JSON answer")
    return common


def _add_enqueue(subparsers: Subparsers, common: argparse.ArgumentParser) -> None:
    """`goqueue enqueue TYPE [options]`."""
    p = subparsers.add_parser("enqueue", parents=[common], help="enqueue a job")
    p.add_argument("type", metavar="TYPE", help="the job type (an actor's name)")
    p.add_argument(
        "--payload", type=_json_value, metavar="JSON", help="JSON payload; @FILE or @- reads it"
    )
    p.add_argument("--queue", metavar="Q", help="queue name (default: default)")
    p.add_argument(
        "--priority",
        type=int,
        metavar="N",
        help=f"0 to 10, higher runs first (default: {DEFAULT_PRIORITY})",
    )
    p.add_argument(
        "--max-retries",
        type=int,
        metavar="N",
        help=f"retries after the first attempt (default: the actor's, else {DEFAULT_MAX_RETRIES})",
    )
    when = p.add_mutually_exclusive_group()
    when.add_argument(
        "--delay", type=_non_negative, metavar="SECONDS", help="run this many seconds from now"
    )
    when.add_argument(
        "--run-at", type=_rfc3339, metavar="RFC3339", help="run at this time (with an offset)"
    )
    p.add_argument(
        "--timeout",
        type=_positive,
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
        "--dedupe-window", type=_positive, metavar="S", help="seconds the dedupe key blocks"
    )
    p.add_argument("--idempotency-key", metavar="K", help="sent as the Idempotency-Key header")
    p.add_argument(
        "--webhook-url", metavar="URL", help="POSTed the job when it is done or has failed"
    )
    p.add_argument(
        "--on-success", type=_json_value, metavar="JSON", help="a job to enqueue when it succeeds"
    )
    p.add_argument(
        "--on-failure",
        type=_json_value,
        metavar="JSON",
        help="a job to enqueue when it fails for good",
    )
    p.set_defaults(func=cmd_enqueue)


def _add_jobs(subparsers: Subparsers, common: argparse.ArgumentParser) -> None:
    """`goqueue jobs`, `job ID`, `events ID`, `cancel ID`."""
    p = subparsers.add_parser("jobs", parents=[common], help="list jobs, newest first")
    p.add_argument("--type", metavar="T", help="only this job type")
    p.add_argument("--status", choices=STATUSES, help="only this status")
    p.add_argument("--queue", metavar="Q", help="only this queue")
    _add_paging(p)
    p.set_defaults(func=cmd_jobs)

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

    p = subparsers.add_parser("pause", parents=[common], help="stop dispatching from a queue")
    p.add_argument("queue", metavar="QUEUE")
    p.set_defaults(func=cmd_pause)

    p = subparsers.add_parser("resume", parents=[common], help="dispatch from a queue again")
    p.add_argument("queue", metavar="QUEUE")
    p.set_defaults(func=cmd_resume)


def _add_dlq(subparsers: Subparsers, common: argparse.ArgumentParser) -> None:
    """`goqueue dlq list|show ID|replay ID|purge ID`."""
    dlq = subparsers.add_parser("dlq", help="dead letters: list, show, replay, purge")
    actions = dlq.add_subparsers(dest="dlq_action", metavar="ACTION", required=True)

    p = actions.add_parser("list", parents=[common], help="list dead letters, newest first")
    _add_paging(p)
    p.set_defaults(func=cmd_dlq_list)

    for name, func, text in (
        ("show", cmd_dlq_show, "show a dead letter with every attempt's error"),
        ("replay", cmd_dlq_replay, "enqueue a fresh job from a dead letter"),
        ("purge", cmd_dlq_purge, "delete a dead letter"),
    ):
        p = actions.add_parser(name, parents=[common], help=text)
        p.add_argument("id", metavar="ID", help="the dead letter's id")
        p.set_defaults(func=func)


def _add_paging(parser: argparse.ArgumentParser) -> None:
    """--limit / --offset for list commands (the server defaults to 50, caps at 1000)."""
    parser.add_argument("--limit", type=int, metavar="N", help="at most N (default 50)")
    parser.add_argument("--offset", type=int, metavar="N", help="skip the first N")


def add_client_commands(subparsers: Subparsers) -> None:
    """Register the client subcommands; each sets `func(args) -> exit code`."""
    common = _common_options()
    _add_enqueue(subparsers, common)
    _add_jobs(subparsers, common)
    _add_queues(subparsers, common)
    _add_dlq(subparsers, common)
