"""What one job costs, in counts that noise moves little: supervisor CPU per job (from
/proc before and after), the bare handler's CPU per request in the same phase, and on
PostgreSQL the commits and rows written per job (`pg_stat_database` deltas of a database
the node has to itself)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from benchmarks.loadgen import LoadClient
from benchmarks.nodes import CHECKOUT, normal_priority

CEILING_BODY = b'{"type":"bench.noop","payload":{"key":"k"}}'
PG_COUNTERS = ("xact_commit", "tup_inserted", "tup_updated")


def cpu_seconds(pid: int) -> float:
    """User + system CPU a process has used so far (/proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def produce(client: LoadClient, raw: bytes, n: int, producers: int) -> float:
    """Send `n` prebuilt requests from `producers` concurrent keep-alive connections,
    each one request at a time; the seconds it took. Every answer must be 201."""
    share = [n // producers + (1 if i < n % producers else 0) for i in range(producers)]

    async def producer(count: int) -> None:
        for _ in range(count):
            status, body = await client.send(raw)
            if status != 201:
                raise RuntimeError(f"enqueue answered {status}: {body[:200]!r}")

    started = time.monotonic()
    await asyncio.gather(*(producer(c) for c in share))
    return time.monotonic() - started


async def ceiling(n: int, producers: int) -> dict[str, Any]:
    """The bare handler (`benchmarks.ceiling`) taking `n` jobs from `producers`: its rate
    and CPU per request."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(CHECKOUT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.ceiling", str(port)],
        env=env,
        preexec_fn=normal_priority if os.geteuid() == 0 else None,
    )
    client = LoadClient("127.0.0.1", port)
    try:
        await _until_up(client, proc)
        raw = client.build("POST", "/jobs", CEILING_BODY)
        await produce(client, raw, min(n, 500), producers)  # warm up
        before = cpu_seconds(proc.pid)
        seconds = await produce(client, raw, n, producers)
        used = cpu_seconds(proc.pid) - before
    finally:
        client.close()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    return {
        "jobs": n,
        "producers": producers,
        "jobs_per_s": n / seconds,
        "cpu_us_per_request": used / n * 1e6,
    }


async def _until_up(client: LoadClient, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("the ceiling server exited")
        try:
            if (await client.request("GET", "/health"))[0] == 200:
                return
        except OSError:
            pass
        await asyncio.sleep(0.05)
    raise RuntimeError("the ceiling server did not start")


# -- PostgreSQL work per job ----------------------------------------------------------------


@contextmanager
def own_database(dsn: str) -> Iterator[str]:
    """A fresh database on `dsn`'s server for one node alone (its pg_stat_database row
    counts only that node's work); yields its DSN, drops it afterwards."""
    import psycopg

    name = f"goqueue_bench_{uuid.uuid4().hex[:8]}"
    parts = urlsplit(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    try:
        yield urlunsplit(parts._replace(path=f"/{name}"))
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def pg_counters(dsn: str) -> dict[str, int]:
    """Commits and rows inserted and updated so far in `dsn`'s database. Read once the
    node has stopped: a backend flushes its counts when it exits."""
    import psycopg

    name = urlsplit(dsn).path.lstrip("/")
    admin = urlunsplit(urlsplit(dsn)._replace(path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute(
            f"SELECT {', '.join(PG_COUNTERS)} FROM pg_stat_database WHERE datname = %s", (name,)
        ).fetchone()
    return dict(zip(PG_COUNTERS, row or (0, 0, 0), strict=True))


def per_job(total: dict[str, int], idle: dict[str, int], jobs: int) -> dict[str, float]:
    """(a run with `jobs` jobs) minus (a run with none), per job."""
    return {key: (total[key] - idle[key]) / jobs for key in PG_COUNTERS}
