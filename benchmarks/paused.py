"""A backlog's burn-down beside a paused queue holding many older jobs, on each store.

For each store and round, two fresh nodes in turn: one burns down N no-op jobs alone, the
other the same N after a paused queue was filled with `--paused` older jobs of the same
type (enqueued in batches). A claim should cost the same either way: a paused queue's
backlog is never walked. Prints each burn-down as a JSON line, then the medians and the
rate beside the paused backlog over the rate alone, per store.

    python -m benchmarks.paused --database-url postgresql://postgres@127.0.0.1:5432/test
"""

from __future__ import annotations

import argparse

from benchmarks.loadgen import LoadClient
from benchmarks.nodes import BenchNode
from benchmarks.snapshot import (
    burn_down,
    call,
    compare_burn_downs,
    comparison_parser,
    run_comparison,
)

HELD = "held"  # the paused queue


async def drain(store: str, dsn: str | None, n: int, paused: int, workers: int) -> float:
    """One fresh node on `store`; the rate of one burn-down of `n` jobs beside a paused
    queue of `paused` jobs."""
    node = BenchNode("--workers", str(workers), dsn=dsn, schema="goqueue", store=store)
    client = LoadClient("127.0.0.1", node.port)
    try:
        await node.ready(client)
        if paused:
            await call(client, "POST", f"/queues/{HELD}/pause")
            for i in range(0, paused, 1000):
                jobs = [
                    {"type": "bench.noop", "queue": HELD, "payload": {"i": i + j}}
                    for j in range(min(1000, paused - i))
                ]
                await call(client, "POST", "/jobs/batch", {"jobs": jobs})
        return await burn_down(client, n)
    finally:
        client.close()
        node.stop()


async def run(args: argparse.Namespace) -> None:
    async def one(store: str, dsn: str | None, paused: int) -> float:
        return await drain(store, dsn, args.n, paused, args.workers)

    await compare_burn_downs(args, "paused", args.paused, ("alone", "beside_paused"), one)


def main() -> None:
    parser = comparison_parser(__doc__)
    parser.add_argument(
        "--paused", type=int, default=60_000, help="older jobs waiting in the paused queue"
    )
    run_comparison(parser, run)


if __name__ == "__main__":
    main()
