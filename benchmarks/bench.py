"""`goqueue bench` (or `python -m benchmarks`): start real nodes on loopback, drive them,
print what they did.

Phases, each bounded in time: open-loop enqueue latency at fixed rates, the highest
sustained enqueue rate (single and batch), end-to-end throughput of no-op jobs with 1 and
with 16 concurrent keep-alive producers (beside the bare-handler ceiling, `ceiling.py`, in
the same phase, with supervisor CPU per job against the ceiling's CPU per request, and on
PostgreSQL the commits and rows written per job: `cost.py`), the hard-timeout kill and
replacement delays, and supervisor memory per pending job.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import uvloop

from benchmarks import cost
from benchmarks.loadgen import LoadClient
from benchmarks.nodes import close, otel_sink, with_node
from benchmarks.report import print_table

NOOP = b'{"type":"bench.noop"}'
HELD = b'{"type":"bench.noop","queue":"bench-held"}'
PRODUCERS = (1, 16)  # concurrent keep-alive producers in the end-to-end phases
WARM_UP = 200  # jobs through a node before an end-to-end phase is measured


def add_bench_command(commands: argparse._SubParsersAction) -> None:
    """Register `goqueue bench`."""
    bench = commands.add_parser(
        "bench",
        help="benchmark GoQueue on this machine (starts its own nodes on loopback)",
        description="Start nodes on 127.0.0.1, measure enqueue latency, throughput, "
        "hard-timeout kills and memory, print a table and write JSON.",
    )
    bench.add_argument(
        "--database-url",
        default=os.environ.get("TEST_DATABASE_URL"),
        help="also run the PostgreSQL phases against this DSN "
        "(default: TEST_DATABASE_URL; a throwaway schema is used and dropped)",
    )
    bench.add_argument(
        "--stores",
        default="memory,sqlite,postgres",
        help="which stores to measure (default: memory,sqlite,postgres)",
    )
    bench.add_argument(
        "--jobs", type=int, default=20_000, help="jobs for the end-to-end phase (default 20000)"
    )
    bench.add_argument(
        "--pending",
        type=int,
        default=100_000,
        help="pending jobs for the memory phase (default 100000)",
    )
    bench.add_argument(
        "--seconds", type=float, default=5.0, help="length of each rate phase (default 5)"
    )
    bench.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    bench.add_argument(
        "--phases",
        default="latency,e2e,timeout,memory",
        help="which phases to run (default: latency,e2e,timeout,memory)",
    )
    bench.add_argument(
        "--otel",
        action="store_true",
        help="run the nodes with --otel, exporting to OTEL_EXPORTER_OTLP_ENDPOINT or, "
        "unset, to a sink on loopback that answers every export and keeps nothing",
    )
    bench.add_argument("--output", default="bench-results.json", help="JSON results file")
    bench.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    # The open-loop generator spins to send on time; on a 2-core machine that spinning
    # would steal CPU from the node under test, so it yields to it (niceness 10).
    if os.geteuid() == 0:
        os.setpriority(os.PRIO_PROCESS, 0, 10)
    results = {"machine": _machine(args.database_url), "stores": {}}
    if args.otel:
        results["machine"]["otel"] = os.environ.setdefault(
            "OTEL_EXPORTER_OTLP_ENDPOINT", otel_sink()
        )
    for store in [s.strip() for s in args.stores.split(",") if s.strip()]:
        if store == "postgres" and not args.database_url:
            print("skipping postgres: no --database-url / TEST_DATABASE_URL", file=sys.stderr)
            continue
        dsn = args.database_url if store == "postgres" else None
        args.store = store  # the nodes of this round: memory, a SQLite file, or PostgreSQL
        results["stores"][store] = uvloop.run(_bench_store(args, dsn))
    Path(args.output).write_text(json.dumps(results, indent=2))
    print_table(results)
    print(f"\nwrote {args.output}")
    return 0


def _machine(dsn: str | None) -> dict[str, Any]:
    info: dict[str, Any] = {
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "date": datetime.now().isoformat(timespec="seconds"),
    }
    if dsn:
        try:
            import psycopg

            with psycopg.connect(dsn, connect_timeout=3) as conn:
                info["postgresql"] = conn.execute("SHOW server_version").fetchone()[0]
                info["fsync"] = conn.execute("SHOW fsync").fetchone()[0]
        except Exception as exc:
            info["postgresql"] = f"unreachable: {exc}"
    return info


# -- phases -------------------------------------------------------------------------------


async def _bench_store(args: argparse.Namespace, dsn: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    name = args.store
    phases = {p.strip() for p in args.phases.split(",")}
    if "latency" in phases:
        await _rates(args, dsn, out)
    for producers in PRODUCERS if "e2e" in phases else ():
        print(f"[{name}] end to end, {producers} producer(s) ...", file=sys.stderr)
        phase = await _end_to_end(args, dsn, producers)
        phase["ceiling"] = await cost.ceiling(args.jobs, producers)
        phase["cpu_ratio"] = phase["cpu_us_per_job"] / phase["ceiling"]["cpu_us_per_request"]
        phase["ceiling_ratio"] = phase["jobs_per_s"] / phase["ceiling"]["jobs_per_s"]
        out["end_to_end" if producers == 1 else f"end_to_end_{producers}"] = phase
    if "timeout" in phases:
        print(f"[{name}] hard timeouts ...", file=sys.stderr)
        out["hard_timeout"] = await _hard_timeout(args, dsn)
    if not dsn and "memory" in phases:
        print(f"[{name}] memory ...", file=sys.stderr)
        out["memory"] = await _memory(args)
    return out


async def _rates(args: argparse.Namespace, dsn: str | None, out: dict[str, Any]) -> None:
    name = args.store
    print(f"[{name}] enqueue latency and rates ...", file=sys.stderr)
    node, client, ctx = await with_node(args, dsn, "--queues", "default")
    try:
        for rate in (200, 2000):
            out[f"latency_{rate}"] = await _open_loop(client, rate, args.seconds)
        out["max_single"] = await _closed_loop(client, args.seconds, batch=0)
        out["max_batch"] = await _closed_loop(client, args.seconds, batch=1000)
    finally:
        await close(node, client, ctx)


async def _open_loop(client: LoadClient, rate: int, seconds: float) -> dict[str, Any]:
    """Send on a fixed schedule; latency counts from the scheduled time, so a slow
    answer delays nothing else and shows up in full (no coordinated omission)."""
    clock = time.perf_counter  # uvloop's loop.time() only has millisecond resolution
    total = int(rate * seconds)
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    raw = client.build("POST", "/jobs", HELD)

    async def one(scheduled: float) -> None:
        try:
            status, _ = await client.send(raw)
        except OSError:
            status = 0
        statuses[status] = statuses.get(status, 0) + 1
        latencies.append(clock() - scheduled)

    start = clock() + 0.05
    tasks = []
    for i in range(total):
        scheduled = start + i / rate
        while (delay := scheduled - clock()) > 0:
            # sleep coarsely, then yield to the loop until the exact send time
            await asyncio.sleep(delay - 0.001 if delay > 0.0015 else 0)
        tasks.append(asyncio.ensure_future(one(scheduled)))
    await asyncio.wait_for(asyncio.gather(*tasks), timeout=seconds + 30)
    latencies.sort()
    ok = statuses.get(201, 0)
    return {
        "rate": rate,
        "requests": total,
        "success": ok / total,
        "p50_ms": _pct(latencies, 50),
        "p95_ms": _pct(latencies, 95),
        "p99_ms": _pct(latencies, 99),
        "max_ms": latencies[-1] * 1000,
    }


def _pct(sorted_values: list[float], p: float) -> float:
    index = min(len(sorted_values) - 1, int(len(sorted_values) * p / 100))
    return sorted_values[index] * 1000


async def _closed_loop(client: LoadClient, seconds: float, batch: int) -> dict[str, Any]:
    """As fast as the node answers: 16 connections for singles, 2 for batches."""
    concurrency = 2 if batch else 16
    body = b'{"jobs":[' + b",".join([HELD] * batch) + b"]}" if batch else HELD
    raw = client.build("POST", "/jobs/batch" if batch else "/jobs", body)
    accepted = 0
    errors = 0
    deadline = time.monotonic() + seconds

    async def producer() -> None:
        nonlocal accepted, errors
        while time.monotonic() < deadline:
            status, payload = await client.send(raw)
            if batch and status == 200:
                accepted += payload.count(b'"status":201')
            elif status == 201:
                accepted += 1
            else:
                errors += 1

    started = time.monotonic()
    await asyncio.wait_for(asyncio.gather(*(producer() for _ in range(concurrency))), seconds + 60)
    elapsed = time.monotonic() - started
    return {"jobs_per_s": accepted / elapsed, "errors": errors, "batch": batch or 1}


async def _end_to_end(args: argparse.Namespace, dsn: str | None, producers: int) -> dict[str, Any]:
    """N no-op jobs, one per request from `producers` concurrent keep-alive connections
    (each one request at a time), to the last done; with the supervisor's CPU per job. On
    PostgreSQL the node has a database to itself, and a second node that only boots and
    takes the warm-up jobs is subtracted from its pg_stat_database counts."""
    if dsn is None:
        return await _timed_run(args, None, producers, args.jobs)
    with cost.own_database(dsn) as idle_dsn:
        await _timed_run(args, idle_dsn, producers, 0)
        idle = cost.pg_counters(idle_dsn)
    with cost.own_database(dsn) as run_dsn:
        out = await _timed_run(args, run_dsn, producers, args.jobs)
        out["pg_per_job"] = cost.per_job(cost.pg_counters(run_dsn), idle, args.jobs)
    return out


async def _timed_run(
    args: argparse.Namespace, dsn: str | None, producers: int, n: int
) -> dict[str, Any]:
    node, client, ctx = await with_node(args, dsn)
    stopped = False
    try:
        raw = client.build("POST", "/jobs", NOOP)
        await cost.produce(client, raw, WARM_UP, min(producers, WARM_UP))
        await _until_done(client, WARM_UP, None)
        if n == 0:
            return {}
        before = cost.cpu_seconds(node.proc.pid)
        loop_before = _loop_series((await client.request("GET", "/metrics"))[1])
        started = time.monotonic()
        enqueue_seconds = await cost.produce(client, raw, n, producers)
        last = await _enqueue(client, NOOP)
        done = await _until_done(client, WARM_UP + n + 1, last)
        elapsed = time.monotonic() - started
        used = cost.cpu_seconds(node.proc.pid) - before
        loop_after = _loop_series((await client.request("GET", "/metrics"))[1])
        await close(node, client, ctx)  # a backend flushes its statistics as it exits
        stopped = True
        return {
            "jobs": n,
            "producers": producers,
            "done": done - WARM_UP,
            "seconds": elapsed,
            "jobs_per_s": n / elapsed,
            "enqueue_per_s": n / enqueue_seconds,
            "cpu_us_per_job": used / (n + 1) * 1e6,
            "workers": args.workers,
            "loop": _loop_split(loop_before, loop_after, n + 1),
        }
    finally:
        if not stopped:
            await close(node, client, ctx)


_LOOP_SERIES = re.compile(
    r'^goqueue_loop_(busy_seconds_total\{work="(\w+)"\}|lag_seconds_bucket\{le="([^"]+)"\}) (\S+)$',
    re.M,
)


def _loop_series(metrics: bytes) -> dict[str, float]:
    """The loop's busy seconds by work (`busy:http`...) and its lag buckets (`le:0.01`...)
    from a /metrics page."""
    out = {}
    for match in _LOOP_SERIES.finditer(metrics.decode()):
        _, work, bound, value = match.groups()
        out[f"busy:{work}" if work else f"le:{bound}"] = float(value)
    return out


def _loop_split(before: dict[str, float], after: dict[str, float], jobs: int) -> dict[str, Any]:
    """Between two scrapes: the loop's time per job by kind of work (µs), and the bound
    of the lag bucket that held the 99th percentile of its samples (seconds)."""
    per_job = {
        key.split(":", 1)[1]: (after[key] - before.get(key, 0.0)) / jobs * 1e6
        for key in after
        if key.startswith("busy:")
    }
    buckets = sorted(
        (float(key[3:]), after[key] - before.get(key, 0.0))
        for key in after
        if key.startswith("le:")
    )
    total = buckets[-1][1] if buckets else 0.0
    p99 = next((bound for bound, count in buckets if count >= 0.99 * total), float("nan"))
    return {"us_per_job": per_job, "lag_p99_s": p99, "lag_samples": total}


async def _until_done(client: LoadClient, total: int, last: str | None) -> int:
    """Wait until `total` jobs are done or failed (the last one first, with a long-poll
    that costs the store no query per check); the count done."""
    if last is not None:
        await client.request("GET", f"/jobs/{last}?wait=60")
    stats = client.build("GET", "/stats")
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        counts = json.loads((await client.send(stats))[1])["counts"]
        if counts["done"] + counts["failed"] >= total:
            return int(counts["done"])
        await asyncio.sleep(0.05)
    raise RuntimeError(f"jobs not done in time: {counts}")


async def _hard_timeout(args: argparse.Namespace, dsn: str | None) -> dict[str, Any]:
    """Deadline -> hung worker dead, and death -> a replacement taking a job (1 worker)."""
    node, client, ctx = await with_node(args, dsn, "--workers", "1")
    kills: list[float] = []
    replacements: list[float] = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for i in range(5):
                pidfile = Path(tmp, f"hang-{i}")
                hang = {
                    "type": "bench.hang",
                    "timeout_seconds": 0.5,
                    "payload": {"pidfile": str(pidfile)},
                }
                hang_id = await _enqueue(client, json.dumps(hang).encode())
                next_id = await _enqueue(client, NOOP)
                pid = await _wait_file(pidfile)
                started = await _job_field(client, hang_id, "started_at")
                dead_at = await _wait_dead(pid, timeout=10)
                kills.append(dead_at - (started + 0.5))
                # finished_at, not started_at: with claim-ahead (PostgreSQL) a job is
                # "started" when claimed into the node's buffer, before a worker has it
                next_done = await _job_field(client, next_id, "finished_at")
                replacements.append(next_done - dead_at)
    finally:
        await close(node, client, ctx)
    return {
        "deadline_to_dead_ms": [round(k * 1000, 1) for k in kills],
        "dead_to_next_job_done_ms": [round(r * 1000, 1) for r in replacements],
        "median_kill_ms": statistics.median(kills) * 1000,
        "median_replace_ms": statistics.median(replacements) * 1000,
    }


async def _wait_file(path: Path, timeout: float = 10.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text():
            return int(path.read_text())
        await asyncio.sleep(0.005)
    raise RuntimeError(f"{path} never appeared")


async def _wait_dead(pid: int, timeout: float) -> float:
    """Busy-watch /proc until the process is gone or a zombie; returns the wall time."""
    deadline = time.monotonic() + timeout
    stat = Path(f"/proc/{pid}/stat")
    while time.monotonic() < deadline:
        try:
            if stat.read_text().split(") ", 1)[1][0] == "Z":
                return time.time()
        except (FileNotFoundError, ProcessLookupError):
            return time.time()
        await asyncio.sleep(0.001)
    raise RuntimeError(f"worker {pid} still alive")


async def _enqueue(client: LoadClient, body: bytes) -> str:
    status, answer = await client.request("POST", "/jobs", body)
    if status != 201:
        raise RuntimeError(f"enqueue answered {status}: {answer[:200]!r}")
    return json.loads(answer)["id"]


async def _job_field(client: LoadClient, job_id: str, field: str, timeout: float = 10.0) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = json.loads((await client.request("GET", f"/jobs/{job_id}"))[1]).get(field)
        if value:
            return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        await asyncio.sleep(0.01)
    raise RuntimeError(f"job {job_id} has no {field}")


async def _memory(args: argparse.Namespace) -> dict[str, Any]:
    """Supervisor RSS before and after `--pending` jobs that nobody serves."""
    node, client, ctx = await with_node(args, None, "--queues", "default")
    try:
        before = node.rss_kb()
        body = b'{"jobs":[' + b",".join([HELD] * 1000) + b"]}"
        batch = client.build("POST", "/jobs/batch", body)
        for _ in range(args.pending // 1000):
            await client.send(batch)
        await asyncio.sleep(0.5)
        after = node.rss_kb()
        pending = json.loads((await client.request("GET", "/stats"))[1])["counts"]["pending"]
    finally:
        await close(node, client, ctx)
    return {
        "pending": pending,
        "rss_before_mb": before / 1024,
        "rss_after_mb": after / 1024,
        "bytes_per_job": (after - before) * 1024 / max(1, pending),
    }
