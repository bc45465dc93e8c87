"""Enqueues with an `Idempotency-Key` against none, on each store.

For each round and store, two fresh nodes in turn: P producers (one by default) send N
`bench.noop` jobs between them, each a request at a time on its own connection, waiting
for its 201; first without a key, then each with a fresh `Idempotency-Key`. Times the
enqueues until the last job is done, and reads the supervisor's CPU from `/proc`. Prints
each run as a JSON line, then the medians and the keyed run's figures over the keyless
one per store.

    python -m benchmarks.idempotent --database-url postgresql://postgres@127.0.0.1:5432/test
    python -m benchmarks.idempotent --producers 16 --stores postgres --database-url …
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import uuid
from typing import Any

from benchmarks.cost import cpu_seconds
from benchmarks.loadgen import LoadClient
from benchmarks.nodes import BenchNode
from benchmarks.snapshot import call, comparison_parser, each_run, run_comparison

BODY = b'{"type": "bench.noop", "payload": {}}'


def post(key: str | None) -> bytes:
    """One `POST /jobs` of a no-op job, with `key` as its `Idempotency-Key`."""
    return LoadClient.build("POST", "/jobs", BODY, {"Idempotency-Key": key} if key else None)


async def produce(client: LoadClient, n: int, keyed: bool) -> None:
    """One producer: `n` enqueues, one at a time."""
    for _ in range(n):
        status, answer = await client.send(post(uuid.uuid4().hex if keyed else None))
        if status != 201:
            raise RuntimeError(f"POST /jobs answered {status}: {answer[:300]!r}")


async def one_run(
    store: str, dsn: str | None, n: int, keyed: bool, workers: int, producers: int
) -> dict[str, Any]:
    """A fresh node; `n` enqueues from `producers` at once; jobs/s and supervisor CPU
    per job."""
    node = BenchNode("--workers", str(workers), dsn=dsn, schema="goqueue", store=store)
    client = LoadClient("127.0.0.1", node.port)
    try:
        await node.ready(client)
        for _ in range(200):  # warm up: connections, prepared statements
            await client.send(post(uuid.uuid4().hex if keyed else None))
        cpu, started = cpu_seconds(node.proc.pid), time.perf_counter()
        share = n // producers
        await asyncio.gather(*(produce(client, share, keyed) for _ in range(producers)))
        n = share * producers
        while (await call(client, "GET", "/stats"))["counts"]["done"] < n + 200:
            await asyncio.sleep(0.01)
        took = time.perf_counter() - started
        cpu = cpu_seconds(node.proc.pid) - cpu
        return {"jobs_per_s": round(n / took), "cpu_us_per_job": round(cpu / n * 1e6)}
    finally:
        client.close()
        node.stop()


async def run(args: argparse.Namespace) -> None:
    async def one(store: str, dsn: str | None, keyed: bool) -> dict[str, float]:
        return await one_run(store, dsn, args.n, keyed, args.workers, args.producers)

    runs = await each_run(args, "keyed", (False, True), one)
    summary: dict[str, Any] = {}
    for store in args.stores:
        figures = {}
        for keyed, label in ((False, "none"), (True, "keyed")):
            done = runs[(store, keyed)]
            figures[label] = {
                name: statistics.median(r[name] for r in done)
                for name in ("jobs_per_s", "cpu_us_per_job")
            }
        none, keyed_ = figures["none"], figures["keyed"]
        summary[store] = figures | {
            "rate_ratio": round(keyed_["jobs_per_s"] / none["jobs_per_s"], 2),
            "cpu_ratio": round(keyed_["cpu_us_per_job"] / none["cpu_us_per_job"], 2),
        }
    head = {"n": args.n, "producers": args.producers, "rounds": args.rounds}
    print(json.dumps(head | summary))


def main() -> None:
    parser = comparison_parser(__doc__, 3000, "enqueues per run")
    parser.add_argument("--producers", type=int, default=1)
    run_comparison(parser, run)


if __name__ == "__main__":
    main()
