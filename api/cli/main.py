"""The `goqueue` command: `serve` runs a node, `migrate` prepares PostgreSQL or a SQLite
file, and the client commands talk to a running node over HTTP."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from goqueue.supervisor.common.errors import ConfigError
from goqueue.supervisor.observe import logs
from goqueue.supervisor.settings import config
from goqueue.supervisor.settings.config import Settings

# What `migrate` reads of the node's options; it loads them as `serve` does.
MIGRATE_OPTIONS = ("config", "database_url", "database_schema")
MIGRATE_CONNECT_TIMEOUT = 10
EXIT_FAILED = 1
EXIT_USAGE = 2

# The client's connection options, also accepted before the command (`goqueue --url U
# jobs`); given after it, they win. Here, not beside the client commands: `serve` checks
# them without loading the client.
CONNECTION_OPTIONS = ("url", "api_key", "http_timeout")


def build_parser() -> argparse.ArgumentParser:
    """The whole command line."""
    parser = argparse.ArgumentParser(
        prog="goqueue",
        description="GoQueue: a background job processor with a REST API. A supervisor "
        "process feeds worker processes it can truly kill.",
    )
    from goqueue.api.cli.jobs import add_client_commands, add_connection_options

    add_connection_options(
        parser.add_argument_group("connection (client commands; also after the command)"),
        before_command=True,
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    serve = commands.add_parser(
        "serve",
        help="run a node (API + supervisor + workers)",
        description="Run a node. Every option can also be set as GOQUEUE_<OPTION> in the "
        "environment or as a key in the TOML file given by --config; flags win over the "
        "environment, which wins over the file.",
    )
    config.add_arguments(serve)
    serve.set_defaults(func=_serve)
    migrate = commands.add_parser(
        "migrate",
        help="create or upgrade the PostgreSQL schema or SQLite file, then exit",
        description="Create or upgrade GoQueue's PostgreSQL schema or SQLite file (a "
        "sqlite:/// URL), then exit. Optional: "
        "every node does the same when it starts. Reads the database options as `serve` "
        "does: flags, then GOQUEUE_<OPTION> (or DATABASE_URL) in the environment, then "
        "the TOML file given by --config.",
    )
    config.add_arguments(
        migrate, only=MIGRATE_OPTIONS, when_unset={"database_url": "none: it must be given"}
    )
    migrate.set_defaults(func=_migrate)
    add_client_commands(commands)
    add_bench(commands, Path(__file__).resolve().parents[2])
    return parser


def add_bench(
    commands: argparse._SubParsersAction[argparse.ArgumentParser], checkout: Path
) -> None:
    """`goqueue bench` lives in the checkout's `benchmarks/`, not in the installed package:
    offer it when that folder is reachable (an editable install, or run from a checkout).
    Elsewhere it is not listed in `--help`, but still answers with what it needs."""
    if (checkout / "benchmarks" / "bench.py").is_file() and str(checkout) not in sys.path:
        sys.path.append(str(checkout))
    try:
        from benchmarks.bench import add_bench_command
    except ImportError:
        # no help=: not listed; its own --help still says what it is and what it needs
        commands.add_parser("bench", description=NO_BENCH).set_defaults(func=_no_bench)
        return
    add_bench_command(commands)


NO_BENCH = (
    "Benchmark GoQueue on this machine: start nodes on 127.0.0.1, measure enqueue latency, "
    "throughput, hard-timeout kills and memory. It needs a source checkout of GoQueue "
    "(pip install -e . there, or run python -m benchmarks from it), where --help lists its "
    "options."
)


def _no_bench(args: argparse.Namespace) -> int:
    print(
        "goqueue bench: needs a source checkout (pip install -e . there, or run "
        "python -m benchmarks from it)",
        file=sys.stderr,
    )
    return 2


def _settings(args: argparse.Namespace, command: str, prefix: str) -> Settings | int:
    """The settings `serve` or `migrate` runs with, or the exit code of a wrong command
    line (said on stderr after `command`, or `prefix` for a bad setting)."""
    if misplaced := _connection_before(args):
        return _fail(command, misplaced, EXIT_USAGE)
    try:
        return config.load(args, os.environ)
    except ConfigError as exc:
        return _fail(prefix, exc, EXIT_USAGE)


def _serve(args: argparse.Namespace) -> int:
    settings = _settings(args, "goqueue serve", "goqueue")
    if isinstance(settings, int):
        return settings
    logs.configure(settings.log_level, format=settings.log_format)
    from goqueue.api.cli.serve import serve

    return serve(settings, args)  # a failed start is one line of the node's log


def _migrate(args: argparse.Namespace) -> int:
    settings = _settings(args, "goqueue migrate", "goqueue migrate")
    if isinstance(settings, int):
        return settings
    if settings.database_url is None:
        return _fail(
            "goqueue migrate",
            "database_url: not set (give --database-url, DATABASE_URL in the environment, "
            "or database_url in the --config file)",
            EXIT_USAGE,
        )
    from goqueue.supervisor.settings.stores import StoreKind, store_url

    url = store_url(settings.database_url)
    if url.kind == StoreKind.MEMORY:
        return _fail(
            "goqueue migrate", "database_url: memory:// keeps nothing to migrate", EXIT_USAGE
        )
    if url.kind == StoreKind.SQLITE:
        return _migrate_sqlite(url.path)
    import psycopg

    schema = settings.database_schema
    try:
        applied = asyncio.run(_apply_migrations(settings.database_url, schema))
    except ValueError as exc:  # a schema name the store refuses
        return _fail("goqueue migrate", f"database_schema: {exc}", EXIT_USAGE)
    except (psycopg.Error, OSError) as exc:
        return _fail("goqueue migrate", f"PostgreSQL: {exc}", EXIT_FAILED)
    if applied:
        print(f"schema {schema!r}: applied migrations {', '.join(map(str, applied))}")
    else:
        print(f"schema {schema!r} is up to date")
    return 0


def _migrate_sqlite(path: str) -> int:
    """Open the file as a node does (lock, check, migrate), then close it."""
    from goqueue.supervisor.common.errors import BootError
    from goqueue.supervisor.store.sqlite.database import Database

    async def run() -> list[int]:
        db = Database(path)
        await db.open()
        await db.close()
        return db.applied

    try:
        applied = asyncio.run(run())
    except BootError as exc:
        return _fail("goqueue migrate", exc, EXIT_FAILED)
    if applied:
        print(f"SQLite file {path}: applied migrations {', '.join(map(str, applied))}")
    else:
        print(f"SQLite file {path} is up to date")
    return 0


async def _apply_migrations(dsn: str, schema: str) -> list[int]:
    """What a node does to its schema at start-up, on a connection of its own."""
    import psycopg
    from goqueue.supervisor.store.postgres.sql import schema as pg_schema

    async with await psycopg.AsyncConnection.connect(
        dsn,
        autocommit=True,
        connect_timeout=MIGRATE_CONNECT_TIMEOUT,
        application_name="goqueue/migrate",
    ) as conn:
        return await pg_schema.migrate(conn, schema)


def _connection_before(args: argparse.Namespace) -> str | None:
    """A complaint when client connection options came before `serve` or `migrate`
    (`goqueue --api-key K serve` must not start a node without the key it names)."""
    given = [name for name in CONNECTION_OPTIONS if getattr(args, f"global_{name}")]
    if not given:
        return None
    flags = ", ".join("--" + name.replace("_", "-") for name in given)
    return (
        f"{flags} before the command belong to the client commands; "
        f"give the node's own options after `{args.command}`"
    )


def _fail(command: str, error: object, code: int) -> int:
    """One line on stderr, whatever the error's own line breaks (psycopg adds hints)."""
    print(f"{command}: {' '.join(str(error).split())}", file=sys.stderr)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `goqueue` command."""
    args = build_parser().parse_args(argv)
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # here, where a reader that left can still be handled
    except BrokenPipeError:
        return _reader_left()
    return code


def _reader_left() -> int:
    """The reader of our output went away (`goqueue jobs | head`): that is its choice,
    not an error. Point stdout at /dev/null so the flush at exit stays quiet too."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 0


if __name__ == "__main__":
    sys.exit(main())
