"""Python function calls per job in the end-to-end phase (in memory unless
`--database-url` says otherwise), the count no noise
moves: cProfile of the supervisor (`python -m cProfile -m goqueue.api.cli.main serve`),
(calls for 5,000 jobs - calls for 1,000 jobs) / 4,000, so that boot and shutdown cancel.

    python -m benchmarks.calls [--jobs 1000 5000] [--workers 2] [--producers 1] [--files]

`--files` lists the project's files a job crosses in the supervisor: those whose
functions are called at least once per job, with their calls per job. "Once" allows for
a call the larger run made one fewer time than it had jobs (a keep-alive connection's
first request, say), so a file on every job's path is never left out by that.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pstats
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks import cost
from benchmarks.bench import NOOP, WARM_UP, _until_done
from benchmarks.loadgen import LoadClient
from benchmarks.nodes import CHECKOUT

ONCE = 0.99  # calls per job from which a file counts as on the trip


async def profiled_run(
    jobs: int, workers: int, out: Path, database_url: str, producers: int = 1
) -> None:
    """One profiled node: warm up, `jobs` no-op jobs from `producers`, all done, stop."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("GOQUEUE_")}
    env.pop("DATABASE_URL", None)
    env["PYTHONPATH"] = str(CHECKOUT)
    cmd = [
        sys.executable, "-m", "cProfile", "-o", str(out), "-m", "goqueue.api.cli.main",
        "serve", "--host", "127.0.0.1", "--port", str(port), "--actors", "benchmarks.actors",
        "--log-level", "warning", "--max-pending", "1000000", "--workers", str(workers),
        "--database-url", database_url,
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env)
    client = LoadClient("127.0.0.1", port)
    try:
        for _ in range(600):
            try:
                if (await client.request("GET", "/ready"))[0] == 200:
                    break
            except OSError:
                pass
            await asyncio.sleep(0.05)
        raw = client.build("POST", "/jobs", NOOP)
        await cost.produce(client, raw, WARM_UP, 1)
        await _until_done(client, WARM_UP, None)
        await cost.produce(client, raw, jobs, producers)
        await _until_done(client, WARM_UP + jobs, None)
    finally:
        client.close()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, nargs=2, default=(1000, 5000))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--database-url", default="memory://", help="the store (memory://)")
    parser.add_argument("--keep", help="write the larger run's profile here")
    parser.add_argument("--files", action="store_true", help="list the files a job crosses")
    parser.add_argument("--producers", type=int, default=1, help="concurrent producers")
    args = parser.parse_args()
    small, large = args.jobs
    calls = {}
    by_file: dict[int, dict[str, int]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n in (small, large):
            out = Path(tmp) / f"{n}.prof"
            asyncio.run(profiled_run(n, args.workers, out, args.database_url, args.producers))
            stats = pstats.Stats(str(out))
            calls[n] = stats.total_calls  # type: ignore[attr-defined]  # untyped in typeshed
            by_file[n] = _calls_by_file(stats)
            if args.keep and n == large:
                Path(args.keep).write_bytes(out.read_bytes())
    per_job = (calls[large] - calls[small]) / (large - small)
    print(f"calls: {calls}; per job: {per_job:.1f}")
    if args.files:
        crossed = {
            name: (by_file[large].get(name, 0) - by_file[small].get(name, 0)) / (large - small)
            for name in by_file[large]
        }
        trip = sorted((name for name, n in crossed.items() if n >= ONCE), key=crossed.__getitem__)
        print(f"files a job crosses: {len(trip)}")
        for name in reversed(trip):
            print(f"  {crossed[name]:7.1f}  {name}")


def _calls_by_file(stats: pstats.Stats) -> dict[str, int]:
    """Calls into each of the checkout's files (relative paths)."""
    totals: dict[str, int] = {}
    root = str(CHECKOUT) + os.sep
    entries = stats.stats  # type: ignore[attr-defined]  # untyped in typeshed
    for (filename, _line, _name), (_cc, calls, *_rest) in entries.items():
        if filename.startswith(root) and not ("/benchmarks/" in filename or "/.venv/" in filename):
            name = filename[len(root) :]
            totals[name] = totals.get(name, 0) + calls
    return totals


if __name__ == "__main__":
    main()
