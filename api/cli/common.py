"""What every `goqueue` client command shares: the client it is given, exit codes, how
a failed request is reported, JSON output, and the types of its arguments.

`command` makes a handler `(client, args) -> exit code` a subcommand: it builds the
client from the connection options and maps failures to exit codes (0 success, 1 the
server answered with an error, 2 the server could not be reached or the command line was
wrong, as argparse).
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

import msgspec
from goqueue.api.cli.output import cell
from goqueue.client import calls
from goqueue.client.errors import (
    ClientError,
    ConnectionFailed,
    InvalidJob,
    RequestError,
    Unauthorized,
)
from goqueue.client.sync import Client

if TYPE_CHECKING:
    Subparsers: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]

DEFAULT_URL = calls.DEFAULT_URL
DEFAULT_HTTP_TIMEOUT = calls.DEFAULT_TIMEOUT

EXIT_OK = 0
EXIT_HTTP_ERROR = 1
EXIT_UNREACHABLE = 2
EXIT_USAGE = 2  # as argparse
EXIT_DECLINED = 1  # a confirmation was answered no: nothing was done


def exit_code(exc: ClientError) -> int:
    """What a command returns for a failed request (a job the client refuses to send
    is a wrong command line)."""
    if isinstance(exc, InvalidJob):
        return EXIT_USAGE
    return EXIT_UNREACHABLE if isinstance(exc, ConnectionFailed) else EXIT_HTTP_ERROR


# --- argument types --------------------------------------------------------------------


def json_value(text: str) -> Any:
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


def positive(text: str) -> float:
    """A number of seconds greater than zero."""
    value = _number(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be greater than 0, not {text}")
    return value


def non_negative(text: str) -> float:
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


def rfc3339(text: str) -> str:
    """An RFC 3339 time with a UTC offset (`2025-01-31T09:00:00Z`), passed on unchanged."""
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an RFC 3339 time: {text}") from None
    if parsed.tzinfo is None:
        raise argparse.ArgumentTypeError(f"needs a UTC offset (Z or +HH:MM): {text}")
    return text


Handler = Callable[[Client, argparse.Namespace], int]


def connection(args: argparse.Namespace, name: str) -> Any:
    """A connection option: given after the command, else before it, else None."""
    value = getattr(args, name, None)
    return value if value is not None else getattr(args, f"global_{name}", None)


def _client_from(args: argparse.Namespace) -> Client:
    """A client for the node named by --url / $GOQUEUE_URL, with the key and timeout
    (ValueError for a URL that is not one)."""
    timeout = connection(args, "http_timeout") or DEFAULT_HTTP_TIMEOUT
    return Client(connection(args, "url"), connection(args, "api_key"), timeout)


def _report(exc: ClientError, client_has_key: bool) -> None:
    """Print a failed request to stderr: the server's message, then its details."""
    if not isinstance(exc, RequestError):
        print(f"goqueue: {exc}", file=sys.stderr)
        return
    if isinstance(exc, InvalidJob):
        print(f"goqueue: invalid job (not sent): {exc}", file=sys.stderr)
    else:
        print(f"goqueue: error: {exc} (HTTP {exc.status})", file=sys.stderr)
    if exc.details:
        print(f"goqueue: details: {cell(exc.details)}", file=sys.stderr)
    if isinstance(exc, Unauthorized) and not client_has_key:
        print("goqueue: hint: pass --api-key or set GOQUEUE_API_KEY", file=sys.stderr)


def command(handler: Handler) -> Callable[[argparse.Namespace], int]:
    """Make a handler a subcommand: build the client, map failures to exit codes."""

    @functools.wraps(handler)
    def run(args: argparse.Namespace) -> int:
        try:
            client = _client_from(args)
        except ValueError as exc:
            print(f"goqueue: {exc}", file=sys.stderr)
            return EXIT_UNREACHABLE
        try:
            return handler(client, args)
        except ClientError as exc:
            _report(exc, client_has_key=client.api_key is not None)
            return exit_code(exc)
        finally:
            client.close()

    return run


def plain(value: Any) -> Any:
    """A typed answer as JSON-like builtins (what the API sent)."""
    return msgspec.to_builtins(value)


def print_json(data: Any) -> int:
    """Print the server's answer as JSON (indented)."""
    print(json.dumps(plain(data), indent=2))
    return EXIT_OK


def add_paging(parser: argparse.ArgumentParser) -> None:
    """--limit / --offset for list commands (the server defaults to 50, caps at 1000)."""
    parser.add_argument("--limit", type=int, metavar="N", help="at most N (default 50)")
    parser.add_argument("--offset", type=int, metavar="N", help="skip the first N")
