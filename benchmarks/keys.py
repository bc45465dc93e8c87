"""A backlog's burn-down with 1,000 concurrency keys against none, on each store.

For each store and round, two fresh nodes in turn: one drains N no-op jobs without a key
(`bench.noop`), the other N jobs of `bench.keyed` (`key_concurrency=1`) spread over 1,000
keys. Each drain: the queue paused, the jobs enqueued in batches, the queue resumed, timed
until the last job is done. Prints each drain as a JSON line, then the medians and the
keyed drain's rate over the keyless one per store.

    python -m benchmarks.keys --database-url postgresql://postgres@127.0.0.1:5432/test
"""

from __future__ import annotations

import argparse
from typing import Any

from benchmarks.loadgen import LoadClient
from benchmarks.nodes import BenchNode
from benchmarks.snapshot import burn_down, compare_burn_downs, comparison_parser, run_comparison


async def drain(store: str, dsn: str | None, n: int, keys: int, workers: int) -> float:
    """One fresh node on `store`; the rate of one burn-down of `n` jobs over `keys` keys."""
    node = BenchNode("--workers", str(workers), dsn=dsn, schema="goqueue", store=store)
    client = LoadClient("127.0.0.1", node.port)
    try:
        await node.ready(client)
        if not keys:
            return await burn_down(client, n)

        def job(i: int) -> dict[str, Any]:
            return {
                "type": "bench.keyed",
                "payload": {"i": i},
                "concurrency_key": f"key-{i % keys}",
            }

        return await burn_down(client, n, job)
    finally:
        client.close()
        node.stop()


async def run(args: argparse.Namespace) -> None:
    async def one(store: str, dsn: str | None, keys: int) -> float:
        return await drain(store, dsn, args.n, keys, args.workers)

    await compare_burn_downs(args, "keys", args.keys, ("none", "keys"), one)


def main() -> None:
    parser = comparison_parser(__doc__)
    parser.add_argument("--keys", type=int, default=1000)
    run_comparison(parser, run)


if __name__ == "__main__":
    main()
