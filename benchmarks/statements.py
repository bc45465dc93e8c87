"""Where PostgreSQL spends a job: each statement's share of a burn-down, of the batch
enqueues that filled it, and of jobs sent one at a time by one producer (each enqueued,
run and finished on its own) and of sixteen producers sending at once, per job, from
`pg_stat_statements`.

The shared server does not load `pg_stat_statements`, and its settings are not ours to
change, so this makes a throwaway cluster of its own (the installed server's `initdb`, a
free loopback port, autovacuum off as on the shared server, removed afterwards) and runs
one node on it. For each phase it prints the rate, the cluster's CPU per job, and per job
the statements' execution time, buffers read and WAL records, first in total (top-level
statements) and then for the statements that cost most, those run inside functions and
triggers included (marked `>`).

    python -m benchmarks.statements [-n 20000] [--workers 2] [--top 12]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, TypeVar

import psycopg

from benchmarks.bench import NOOP, _until_done
from benchmarks.cost import produce
from benchmarks.loadgen import LoadClient
from benchmarks.nodes import BenchNode
from benchmarks.snapshot import drain, fill
from tests.pgcluster import PgCluster, private_cluster

SETTINGS = {
    "shared_preload_libraries": "pg_stat_statements",
    "pg_stat_statements.track": "all",  # statements inside functions and triggers too
    "pg_stat_statements.max": "5000",
    "autovacuum": "off",
    "shared_buffers": "128MB",
}
T = TypeVar("T")
TOTALS = """
    SELECT coalesce(sum(total_exec_time), 0), coalesce(sum(shared_blks_hit + shared_blks_read), 0),
        coalesce(sum(wal_records), 0), coalesce(sum(wal_bytes), 0)
    FROM pg_stat_statements WHERE toplevel"""
TOP = """
    SELECT calls, total_exec_time, shared_blks_hit + shared_blks_read, wal_records, toplevel,
        regexp_replace(query, '\\s+', ' ', 'g')
    FROM pg_stat_statements WHERE query NOT LIKE '%%pg_stat_statements%%'
    ORDER BY total_exec_time DESC LIMIT %s"""


def cluster_cpu(cluster: PgCluster) -> float:
    """CPU seconds used so far by the cluster's server processes still running."""
    postmaster = int((cluster.data / "postmaster.pid").read_text().split()[0])
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(entry) == postmaster or int(fields[1]) == postmaster:
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


def report(
    admin: psycopg.Connection[Any], phase: str, n: int, seconds: float, cpu: float, top: int
) -> None:
    """Print one phase's figures per job (`n` jobs in `seconds`, `cpu` cluster seconds)."""
    exec_ms, blocks, wal, wal_bytes = admin.execute(TOTALS).fetchone() or (0, 0, 0, 0)
    print(
        f"\n{phase}: {n / seconds:,.0f} jobs/s; per job: server CPU {cpu * 1e6 / n:.0f} us,"
        f" statements {float(exec_ms) * 1000 / n:.1f} us, {float(blocks) / n:.1f} buffers,"
        f" {float(wal) / n:.1f} WAL records ({float(wal_bytes) / n:.0f} bytes)"
    )
    print(f"{'calls':>7} {'us':>7} {'buffers':>7} {'WAL':>5}   statement (per job)")
    for calls, ms, blks, recs, toplevel, query in admin.execute(TOP, (top,)).fetchall():
        mark = " " if toplevel else ">"
        print(
            f"{calls / n:7.3f} {ms * 1000 / n:7.1f} {float(blks) / n:7.1f} {float(recs) / n:5.1f}"
            f" {mark} {query[:110]}"
        )


async def run(args: argparse.Namespace) -> None:
    with (
        private_cluster(SETTINGS) as cluster,
        psycopg.connect(cluster.dsn, autocommit=True) as admin,
    ):
        admin.execute("CREATE EXTENSION pg_stat_statements")
        admin.execute("CREATE DATABASE bench")
        dsn = cluster.dsn.rsplit("/", 1)[0] + "/bench"
        node = BenchNode("--workers", str(args.workers), dsn=dsn, schema="goqueue")
        client = LoadClient("127.0.0.1", node.port)
        post = client.build("POST", "/jobs", NOOP)
        one = args.n // 4

        async def phase(name: str, n: int, work: Awaitable[T]) -> T:
            """Run `work` (not started yet) as one phase, reported per job of its `n`."""
            admin.execute("SELECT pg_stat_statements_reset()")
            cpu, started = cluster_cpu(cluster), time.monotonic()
            out = await work
            spent = time.monotonic() - started, cluster_cpu(cluster) - cpu
            report(admin, name, n, *spent, args.top)
            return out

        async def sent(producers: int, n: int, done: int) -> None:
            await produce(client, post, n, producers)
            await _until_done(client, done, None)

        try:
            await node.ready(client)
            last, before = await phase("batch enqueues", args.n, fill(client, args.n))
            await phase("burn-down", args.n, drain(client, args.n, last, before))
            await phase("one producer, end to end", one, sent(1, one, args.n + one))
            done = args.n * 2 + one
            await phase("sixteen producers, end to end", args.n, sent(16, args.n, done))
        finally:
            client.close()
            node.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=20_000, help="jobs in the backlog")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--top", type=int, default=12, help="statements listed per phase")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
