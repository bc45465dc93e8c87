"""Burn-downs on PostgreSQL behind a held snapshot: what a long transaction elsewhere on
the server does to a node's drain, with nobody running VACUUM by hand.

One node on a database of its own. Four burn-downs of N no-op jobs each (the queue paused,
the jobs enqueued in batches, the queue resumed, timed until all are done): the first
alone, the next two while another session holds a `REPEATABLE READ` transaction open, the
last `--after` seconds after that transaction ends. Prints one JSON line per burn-down
(its rate, and the jobs table's dead tuples and the node's own VACUUMs after it) and a
summary with each rate over the first's.

    python -m benchmarks.snapshot --database-url postgresql://postgres@127.0.0.1:5432/test
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg

from benchmarks.cost import own_database
from benchmarks.loadgen import LoadClient
from benchmarks.nodes import BenchNode


async def call(client: LoadClient, method: str, path: str, body: Any = None) -> Any:
    """One API call; its JSON answer (RuntimeError naming it on anything but a 2xx)."""
    raw = json.dumps(body).encode() if body is not None else b""
    status, answer = await client.request(method, path, raw)
    if status >= 300:
        raise RuntimeError(f"{method} {path} answered {status}: {answer[:300]!r}")
    return json.loads(answer or b"null")


def _noop(i: int) -> dict[str, Any]:
    return {"type": "bench.noop", "payload": {"i": i}}


async def fill(
    client: LoadClient, n: int, job: Callable[[int], dict[str, Any]] = _noop
) -> tuple[str, int]:
    """Pause the default queue and enqueue `n` jobs (`job(i)` each) into it, in batches:
    the last one's id, and how many jobs were done before."""
    before = (await call(client, "GET", "/stats"))["counts"].get("done", 0)
    await call(client, "POST", "/queues/default/pause")
    last = ""
    for i in range(0, n, 1000):
        jobs = [job(i + j) for j in range(min(1000, n - i))]
        answer = await call(client, "POST", "/jobs/batch", {"jobs": jobs})
        last = answer["results"][-1]["job"]["id"]
    return last, before


async def drain(client: LoadClient, n: int, last: str, before: int) -> float:
    """Resume the default queue `fill` filled and time until its `n` jobs are done
    (`last` the last of them, `before` the jobs done before): jobs/s."""
    started = time.monotonic()
    await call(client, "POST", "/queues/default/resume")
    # Jobs start in order: wait for the last, then for all (GET /stats counts the table).
    while (await call(client, "GET", f"/jobs/{last}"))["status"] != "done":
        if time.monotonic() - started > 1200:
            raise RuntimeError("the burn-down took over 20 minutes")
        await asyncio.sleep(0.05)
    while (await call(client, "GET", "/stats"))["counts"].get("done", 0) - before < n:
        await asyncio.sleep(0.05)
    return n / (time.monotonic() - started)


async def burn_down(
    client: LoadClient, n: int, job: Callable[[int], dict[str, Any]] = _noop
) -> float:
    """Enqueue `n` jobs (`job(i)` each) into the paused queue, resume it, and time the
    drain: jobs/s."""
    return await drain(client, n, *await fill(client, n, job))


def comparison_parser(
    doc: str, n: int = 20_000, n_help: str = "jobs per burn-down"
) -> argparse.ArgumentParser:
    """The options of a script built on `compare_burn_downs` (which reads `--rounds`,
    `--stores` and `--database-url`), with `-n` and `--workers` for its drains (or
    whatever a run of the script is: `n`, `n_help`)."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--database-url", help="PostgreSQL server for the postgres store")
    parser.add_argument("-n", type=int, default=n, help=n_help)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--stores", nargs="+", default=["memory", "sqlite", "postgres"])
    return parser


def run_comparison(
    parser: argparse.ArgumentParser, run: Callable[[argparse.Namespace], Awaitable[None]]
) -> None:
    """Parse the options (the postgres store needs `--database-url`) and `run` them."""
    args = parser.parse_args()
    if "postgres" in args.stores and not args.database_url:
        parser.error("--database-url is needed for the postgres store")
    asyncio.run(run(args))


async def each_run(
    args: argparse.Namespace,
    name: str,
    variants: tuple[Any, ...],
    run: Callable[[str, str | None, Any], Awaitable[dict[str, float]]],
) -> dict[tuple[str, Any], list[dict[str, float]]]:
    """For each round and store, `run(store, dsn, v)` for each of `variants` (PostgreSQL on
    a database of its own each time). Prints each run's figures as a JSON line (`name`:
    its variant), and returns them by store and variant."""
    runs: dict[tuple[str, Any], list[dict[str, float]]] = {}
    for round_ in range(args.rounds):
        for store in args.stores:
            for variant in variants:
                if store == "postgres":
                    with own_database(args.database_url) as dsn:
                        out = await run(store, dsn, variant)
                else:
                    out = await run(store, None, variant)
                runs.setdefault((store, variant), []).append(out)
                line = {"round": round_ + 1, "store": store, name: variant}
                print(json.dumps(line | {k: round(v) for k, v in out.items()}), flush=True)
    return runs


async def compare_burn_downs(
    args: argparse.Namespace,
    name: str,
    amount: int,
    labels: tuple[str, str],
    drain: Callable[[str, str | None, int], Awaitable[float]],
) -> None:
    """For each round and store, `drain(store, dsn, x)` with `x` of `name` at 0, then
    at `amount` (PostgreSQL on a database of its own each time). Prints each drain as a
    JSON line, then the medians (`labels`: without, with) and their ratio per store."""

    async def one(store: str, dsn: str | None, x: int) -> dict[str, float]:
        return {"jobs_per_s": await drain(store, dsn, x)}

    runs = await each_run(args, name, (0, amount), one)
    summary: dict[str, Any] = {}
    for store in args.stores:
        without = statistics.median(r["jobs_per_s"] for r in runs[(store, 0)])
        with_ = statistics.median(r["jobs_per_s"] for r in runs[(store, amount)])
        summary[store] = {
            labels[0]: round(without),
            labels[1]: round(with_),
            "ratio": round(with_ / without, 2),
        }
    print(json.dumps({"n": args.n, name: amount, "rounds": args.rounds} | summary))


def table_health(dsn: str, schema: str) -> dict[str, Any]:
    """The jobs table's dead tuples and VACUUM counts, as the server's statistics say."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute(
            "SELECT n_live_tup, n_dead_tup, vacuum_count, autovacuum_count"
            " FROM pg_stat_user_tables WHERE schemaname = %s AND relname = 'jobs'",
            (schema,),
        ).fetchone()
    keys = ("live_tuples", "dead_tuples", "vacuums", "autovacuums")
    return dict(zip(keys, row or (0, 0, 0, 0), strict=True))


async def run(args: argparse.Namespace) -> None:
    with own_database(args.database_url) as dsn:
        node = BenchNode("--workers", str(args.workers), dsn=dsn, schema="goqueue")
        client = LoadClient("127.0.0.1", node.port)
        holder: psycopg.Connection[Any] | None = None
        rates: list[float] = []
        try:
            await node.ready(client)
            for phase in ("first", "held", "held", "after"):
                if phase == "held" and holder is None:
                    holder = psycopg.connect(dsn)
                    holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
                    holder.execute("SELECT count(*) FROM pg_class")  # takes the snapshot
                if phase == "after" and holder is not None:
                    holder.rollback()
                    holder.close()
                    holder = None
                    await asyncio.sleep(args.after)
                rates.append(await burn_down(client, args.n))
                line = {"phase": phase, "jobs_per_s": round(rates[-1])}
                print(json.dumps(line | table_health(dsn, "goqueue")), flush=True)
        finally:
            if holder is not None:
                holder.close()
            client.close()
            node.stop()
        ratios = [round(rate / rates[0], 2) for rate in rates]
        print(json.dumps({"n": args.n, "rates": [round(r) for r in rates], "ratios": ratios}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", required=True)
    parser.add_argument("-n", type=int, default=30_000, help="jobs per burn-down")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--after", type=float, default=60.0, help="seconds after the snapshot ends")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
