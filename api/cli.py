"""The `goqueue` command: `serve` runs a node, `migrate` prepares PostgreSQL, and the
client commands talk to a running node over HTTP."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from goqueue.supervisor import config, logs
from goqueue.supervisor.arbiter import EXIT_BOOT_ERROR
from goqueue.supervisor.errors import ConfigError


def build_parser() -> argparse.ArgumentParser:
    """The whole command line."""
    parser = argparse.ArgumentParser(
        prog="goqueue",
        description="GoQueue: a background job processor with a REST API. A supervisor "
        "process feeds worker processes it can truly kill.",
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
        "migrate", help="create or upgrade the PostgreSQL schema, then exit"
    )
    migrate.add_argument("--database-url", default=None, help="PostgreSQL DSN (env DATABASE_URL)")
    migrate.add_argument(
        "--database-schema",
        default=None,
        help="schema holding GoQueue's tables (env GOQUEUE_DATABASE_SCHEMA; default goqueue)",
    )
    migrate.set_defaults(func=_migrate)
    from goqueue.api.client import add_client_commands

    add_client_commands(commands)
    _add_bench_command(commands)
    return parser


def _add_bench_command(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
) -> None:
    """`goqueue bench` lives in the checkout's `benchmarks/`, not in the installed package:
    offer it when that folder is reachable (an editable install, or run from a checkout)."""
    checkout = Path(__file__).resolve().parent.parent
    if (checkout / "benchmarks" / "bench.py").is_file() and str(checkout) not in sys.path:
        sys.path.append(str(checkout))
    try:
        from benchmarks.bench import add_bench_command
    except ImportError:
        bench = commands.add_parser("bench", help="benchmark GoQueue (needs a source checkout)")
        bench.set_defaults(func=_no_bench)
        return
    add_bench_command(commands)


def _no_bench(args: argparse.Namespace) -> int:
    print(
        "goqueue bench: needs a source checkout (pip install -e . there, or run "
        "python -m benchmarks from it)",
        file=sys.stderr,
    )
    return 2


def _serve(args: argparse.Namespace) -> int:
    try:
        settings = config.load(args, os.environ)
    except ConfigError as exc:
        print(f"goqueue: {exc}", file=sys.stderr)
        return 2
    logs.configure(settings.log_level)
    from goqueue.api.node import serve

    code = serve(settings, args)
    if code == EXIT_BOOT_ERROR:
        print(
            "goqueue: cannot start: the actor modules failed to load (see the log above)",
            file=sys.stderr,
        )
    return code


def _migrate(args: argparse.Namespace) -> int:
    dsn = (
        args.database_url
        or os.environ.get("GOQUEUE_DATABASE_URL")
        or os.environ.get("DATABASE_URL")
    )
    if not dsn:
        print("goqueue migrate: --database-url or DATABASE_URL is required", file=sys.stderr)
        return 2
    from goqueue.supervisor.store.postgres import PostgresStore

    schema = args.database_schema or os.environ.get("GOQUEUE_DATABASE_SCHEMA") or "goqueue"
    try:
        config.Settings(database_url=dsn, database_schema=schema, workers=1)
    except ConfigError as exc:
        print(f"goqueue migrate: {exc}", file=sys.stderr)
        return 2

    async def run() -> None:
        store = PostgresStore(dsn, "migrate", schema=schema)
        await store.open()
        await store.close()

    asyncio.run(run())
    print(f"schema {schema!r} is up to date")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `goqueue` command."""
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
