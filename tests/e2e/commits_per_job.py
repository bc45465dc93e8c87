"""Commits per job, measured (issue 9's yardstick; not a test): one node with 2 workers
on a private PostgreSQL cluster, N jobs of the `logged` actor (no sleep), enqueued by one
producer one at a time (`one`) or 500 to a POST /jobs/batch (`batch`); counts
`pg_stat_database.xact_commit` from the first enqueue until every job is terminal, less
the node's background commits (measured idle for 5 s first).

    PYTHONPATH=. .venv/bin/python -m tests.e2e.commits_per_job 2000 batch
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import psycopg

from tests.e2e.conftest import NodeSet
from tests.e2e.support import unfinished
from tests.pgcluster import PgCluster, _bindir


def commits(dsn: str) -> int:
    """The database's commits so far (after the statistics are flushed)."""
    time.sleep(1.2)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_force_next_flush()")
        row = conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
        assert row is not None
        return int(row[0])


def measure(count: int, mode: str) -> str:
    bindir = _bindir()
    assert bindir is not None, "needs the PostgreSQL server binaries"
    pgbase = Path(tempfile.mkdtemp(prefix="goqueue-pg-"))
    if os.geteuid() == 0:
        shutil.chown(pgbase, "postgres", "postgres")
    cluster = PgCluster(bindir, pgbase)
    cluster.init()
    cluster.start()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            nodes = NodeSet(Path(tmp), cluster.dsn)
            node = nodes.start("--lease-seconds", "30")
            idle_from, started = commits(cluster.dsn), time.monotonic()
            time.sleep(5)
            idle_rate = (commits(cluster.dsn) - idle_from) / (time.monotonic() - started)
            before, started = commits(cluster.dsn), time.monotonic()
            job = {"type": "logged", "payload": {"dir": tmp, "seconds": 0}}
            if mode == "batch":
                for _ in range(0, count, 500):
                    assert node.post("/jobs/batch", {"jobs": [job] * 500}).status == 200
            else:
                for _ in range(count):
                    assert node.post("/jobs", job).status == 201
            while unfinished(node):
                time.sleep(0.1)
            elapsed = time.monotonic() - started
            total = commits(cluster.dsn) - before
            nodes.kill_all()
            net = total - idle_rate * (elapsed + 1.2)
            return (
                f"mode={mode} jobs={count} commits={total} per_job={total / count:.2f}"
                f" net_of_background={net / count:.2f} elapsed={elapsed:.1f}s"
            )
    finally:
        cluster.stop("immediate")
        shutil.rmtree(pgbase, ignore_errors=True)


if __name__ == "__main__":
    args = sys.argv[1:]
    print(measure(int(args[0]) if args else 1000, args[1] if len(args) > 1 else "one"))
