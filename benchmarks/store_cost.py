"""A store's own CPU per job, without HTTP and without workers: what each store adds to
the supervisor's share of a job, and on PostgreSQL what the driver alone costs for the
same statements (the floor any code over psycopg starts from).

Jobs go `concurrency` at a time on one event loop (1: the one-producer case, each job
its own transactions; 8: many producers, whose calls share them): enqueued (started at
once where a lone enqueue is, as for a waiting worker), the rest claimed together, then
completed. The process's CPU (`getrusage`, user + system) per job, over `--jobs` jobs
after a warm-up; medians of `--rounds` rounds. SQLite also prints its transactions and
fsyncs per job, and with `--statements` each statement's time per job.

    python -m benchmarks.store_cost [--stores memory sqlite postgres]
        [--concurrency 1 8] [--jobs 4000] [--rounds 3] [--statements]
        [--database-url postgresql://...]  # throwaway databases there, dropped after
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec
import psycopg
import uvloop
from goqueue.supervisor.common.jobs import JobSpec
from goqueue.supervisor.store.base import NewJob, StartNow
from goqueue.supervisor.store.memory.store import MemoryStore
from goqueue.supervisor.store.postgres import rows as pg_rows
from goqueue.supervisor.store.postgres.sql.statements import Sql, Statements
from goqueue.supervisor.store.postgres.store import PostgresStore
from goqueue.supervisor.store.sqlite.store import SqliteStore

from benchmarks.cost import own_database

SPEC = msgspec.json.decode(b'{"type":"noop","payload":{"key":"w"}}', type=JobSpec)
START = StartNow(types=frozenset({"noop"}))
WARM_UP = 200
NODE = "store-cost"


def cpu_now() -> float:
    """User + system CPU this process has used so far, in seconds."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def sent(jobs: int, concurrency: int) -> int:
    """How many jobs `measure` sends in all, its warm-up included."""
    return (WARM_UP // concurrency + jobs // concurrency) * concurrency


async def measure(batch: Callable[[int], Awaitable[None]], jobs: int, concurrency: int) -> float:
    """CPU microseconds per job of `jobs` jobs, `concurrency` at a time."""
    for _ in range(WARM_UP // concurrency):
        await batch(concurrency)
    started = cpu_now()
    for _ in range(jobs // concurrency):
        await batch(concurrency)
    return (cpu_now() - started) / (jobs // concurrency * concurrency) * 1e6


def store_jobs(store: Any) -> Callable[[int], Awaitable[None]]:
    """`k` jobs through `store` at once: enqueued (started at once where the store does
    that for a lone call, as for a waiting worker), those left pending claimed together,
    then all completed."""

    async def batch(k: int) -> None:
        new = NewJob(spec=SPEC, max_retries=3, start=START)
        enqueued = await asyncio.gather(*(store.enqueue(new) for _ in range(k)))
        leases = [e.lease for e in enqueued if e.lease is not None]
        if len(leases) < k:
            missing = k - len(leases)
            leases += await store.claim(missing, None, {"noop": missing})
        assert len(leases) == k, "a job enqueued was neither started nor claimed"
        result = msgspec.Raw(b"null")
        await asyncio.gather(*(store.complete(lease, result) for lease in leases))

    return batch


class Timed:
    """A SQLite connection that times each statement (`--statements`)."""

    def __init__(self, conn: Any, times: dict[str, list[float]]) -> None:
        self._conn = conn
        self._times = times

    def execute(self, sql: str, *args: Any) -> Any:
        return self._timed(self._conn.execute, sql, args)

    def executemany(self, sql: str, *args: Any) -> Any:
        return self._timed(self._conn.executemany, sql, args)

    def _timed(self, call: Callable[..., Any], sql: str, args: tuple[Any, ...]) -> Any:
        started = time.perf_counter()
        try:
            return call(sql, *args)
        finally:
            entry = self._times[" ".join(sql.split())[:64]]
            entry[0] += 1
            entry[1] += time.perf_counter() - started

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


# A round's CPU per job, and what it prints.
Round = tuple[float, str]


async def memory_cost(jobs: int, concurrency: int) -> Round:
    store = MemoryStore(NODE, max_pending=None)
    await store.open()
    cpu = await measure(store_jobs(store), jobs, concurrency)
    return cpu, f"{cpu:6.1f} us"


async def sqlite_cost(jobs: int, concurrency: int, statements: bool) -> Round:
    with tempfile.TemporaryDirectory() as folder:
        store = SqliteStore(str(Path(folder) / "cost.db"), NODE, max_pending=None)
        await store.reserve()
        await store.open()
        times: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
        if statements:
            store.db._conn = Timed(store.db._conn, times)  # type: ignore[assignment]
        try:
            before = (store.db.transactions, store.db.syncs)
            cpu = await measure(store_jobs(store), jobs, concurrency)
            n = sent(jobs, concurrency)  # the counts and timings include the warm-up
            transactions = (store.db.transactions - before[0]) / n
            syncs = (store.db.syncs - before[1]) / n
        finally:
            await store.close()
    lines = [f"{cpu:6.1f} us  ({transactions:.2f} transactions, {syncs:.2f} fsyncs a job)"]
    for text, (calls, seconds) in sorted(times.items(), key=lambda kv: -kv[1][1])[:8]:
        lines.append(f"      {seconds / n * 1e6:6.1f} us a job, {calls / n:5.2f} a job  {text}")
    return cpu, "\n".join(lines)


async def postgres_cost(server: str, jobs: int, concurrency: int) -> Round:
    with own_database(server) as url:
        store = PostgresStore(url, NODE)
        await store.open()
        try:
            cpu = await measure(store_jobs(store), jobs, concurrency)
        finally:
            await store.close()
    return cpu, f"{cpu:6.1f} us"


async def driver_cost(server: str, jobs: int) -> Round:
    """The same two statements, one job at a time, from psycopg alone: an autocommit
    connection for each, as the store's lanes, with the store's adapters (in a database
    the store migrated)."""
    with own_database(server) as url:
        store = PostgresStore(url, NODE)
        await store.open()
        await store.close()
        return await _driver_jobs(url, jobs)


async def _driver_jobs(url: str, jobs: int) -> Round:
    sql = Statements("goqueue")
    add, complete = sql[Sql.ADD_JOB_STARTED], sql[Sql.COMPLETE_UNHOOKED]
    options = {"autocommit": True, "context": pg_rows.adapters()}
    enqueuing = await psycopg.AsyncConnection.connect(url, **options)
    completing = await psycopg.AsyncConnection.connect(url, **options)
    for conn in (enqueuing, completing):
        await conn.execute("SELECT set_config('TimeZone', 'UTC', false)")

    async def one(_k: int) -> None:
        params = pg_rows.insert_params(SPEC, 3, None) | {
            "node": NODE,
            "token": str(uuid.uuid4()),
            "lease": 30.0,
            "live": 90.0,
            "types": "{noop}",
            "queues": None,
            "floor_at": "{NULL}",
            "floor_seq": "{NULL}",
        }
        await (await enqueuing.execute(add, params)).fetchone()
        done = {"id": params["id"], "token": params["token"], "result": None, "node": NODE}
        await (await completing.execute(complete, done)).fetchone()

    try:
        cpu = await measure(one, jobs, 1)
        return cpu, f"{cpu:6.1f} us"
    finally:
        await enqueuing.close()
        await completing.close()


async def run(args: argparse.Namespace) -> None:
    url = args.database_url or os.environ.get("GOQUEUE_BENCH_DATABASE_URL")
    for name in args.stores:
        if name == "postgres" and not url:
            print("postgres: skipped (give --database-url)")
            continue
        for k in args.concurrency:
            rounds: list[Round] = []
            for _ in range(args.rounds):
                if name == "memory":
                    rounds.append(await memory_cost(args.jobs, k))
                elif name == "sqlite":
                    rounds.append(await sqlite_cost(args.jobs, k, args.statements))
                else:
                    rounds.append(await postgres_cost(url, args.jobs, k))
            print(f"{name:8s} {k} at a time: {_median(rounds)}")
        if name == "postgres":
            rounds = [await driver_cost(url, args.jobs) for _ in range(args.rounds)]
            print(f"psycopg alone, the same two statements, 1 at a time: {_median(rounds)}")


def _median(rounds: list[Round]) -> str:
    """What the median round (by CPU per job) printed, and every round's CPU."""
    median = sorted(rounds)[len(rounds) // 2][1]
    return median + f"  (rounds: {', '.join(f'{cpu:.1f}' for cpu, _ in rounds)})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stores", nargs="+", default=["memory", "sqlite", "postgres"])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--jobs", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--statements", action="store_true", help="SQLite: time each statement")
    parser.add_argument("--database-url", help="PostgreSQL: throwaway databases on its server")
    uvloop.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
