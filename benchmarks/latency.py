"""Enqueue latency at fixed rates, measured by a third-party load generator (Debian's
`hey`), GoQueue beside the bare HTTP handler of the side-by-side harness in one run:

    python -m benchmarks.latency [--rates 200 2000] [--seconds 15] [--rounds 3]
        [--stores memory sqlite postgres] [--peers ../shared/bench-peers]

Each round starts every system afresh in turn (the ceiling, then each store), warms it
up, and has `hey` post `{"type": "noop", ...}` at the rate for `--seconds` with 20
connections; the table gives medians over the rounds of hey's p50 and p99, and each
system's p99 as a ratio to the ceiling's. The ceiling is the harness's
`ceiling_server.py` (it needs the harness's venv: `./setup.sh` there), GoQueue runs
`goqueue serve --workers 2` with the harness's no-op actor (each job an INCR in Redis).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from benchmarks.nodes import CHECKOUT

HEY = shutil.which("hey") or "hey"
BODY = json.dumps({"type": "noop", "payload": {"key": "goqueue-latency"}})
CONNECTIONS = 20
PG_DSN = os.environ.get("TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_up(url: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer in 30 s")


def start(system: str, peers: Path, folder: Path) -> tuple[subprocess.Popen[bytes], str]:
    """One system under test, started and answering; its process and base URL."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(peers)}
    if system == "ceiling":
        python = Path(os.environ.get("PEERS_VENV", Path.home() / ".cache/goqueue-bench-peers/venv"))
        cmd = [str(python / "bin/python"), str(peers / "ceiling_server.py"), str(port)]
        health = f"http://127.0.0.1:{port}/health"
    else:
        url = {
            "memory": "memory://",
            "sqlite": f"sqlite:///{folder / 'latency.db'}",
            "postgres": PG_DSN,
        }[system]
        cmd = [
            sys.executable, "-m", "goqueue.api.cli.main", "serve", "--port", str(port),
            "--workers", "2", "--actors", "goqueue_actors", "--database-url", url,
            "--log-level", "warning", "--max-pending", "1000000",
        ]  # fmt: skip
        if system == "postgres":
            cmd += ["--database-schema", f"latency_{os.getpid()}"]
        health = f"http://127.0.0.1:{port}/ready"
    proc = subprocess.Popen(cmd, env=env, cwd=folder, stdout=subprocess.DEVNULL)
    wait_up(health, proc)
    return proc, f"http://127.0.0.1:{port}/jobs"


def hey(url: str, rate: int, seconds: float) -> dict[str, float]:
    """`hey` at `rate` requests/s for `seconds`: p50, p99 (ms) and the rate it reached."""
    per_connection = max(1, rate // CONNECTIONS)
    cmd = [HEY, "-z", f"{seconds}s", "-c", str(CONNECTIONS), "-q", str(per_connection)]
    cmd += ["-m", "POST", "-T", "application/json", "-d", BODY, url]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    quantiles = {int(p): float(s) * 1000 for p, s in re.findall(r"(\d+)% in ([\d.]+) secs", out)}
    statuses = dict(re.findall(r"\[(\d+)\]\s+(\d+) responses", out))
    reached = re.search(r"Requests/sec:\s+([\d.]+)", out)
    rps = float(reached.group(1)) if reached else 0.0
    non201 = sum(int(n) for code, n in statuses.items() if code != "201")
    return {"p50": quantiles[50], "p99": quantiles[99], "rps": rps, "non201": non201}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", type=int, nargs="+", default=[200, 2000])
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--stores", nargs="+", default=["memory", "sqlite", "postgres"])
    parser.add_argument("--peers", type=Path, default=CHECKOUT.parent / "shared/bench-peers")
    args = parser.parse_args()
    systems = ["ceiling", *args.stores]
    results: dict[tuple[int, str], list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for _ in range(args.rounds):
            for rate in args.rates:
                for system in systems:
                    proc, url = start(system, args.peers.resolve(), folder)
                    try:
                        hey(url, 200, 2)  # warm up
                        results.setdefault((rate, system), []).append(hey(url, rate, args.seconds))
                    finally:
                        proc.terminate()
                        proc.wait(timeout=30)
                    for leftover in folder.glob("latency.db*"):
                        leftover.unlink()
    print(f"\nhey, {CONNECTIONS} connections, {args.seconds:g} s a run, medians of {args.rounds}")
    print("| rate | system | p50 ms | p99 ms | p99 / ceiling's | reached/s | non-201 |")
    print("|--:|---|--:|--:|--:|--:|--:|")
    for rate in args.rates:
        ceiling = statistics.median(r["p99"] for r in results[(rate, "ceiling")])
        for system in systems:
            runs = results[(rate, system)]
            p50 = statistics.median(r["p50"] for r in runs)
            p99 = statistics.median(r["p99"] for r in runs)
            rps = statistics.median(r["rps"] for r in runs)
            bad = sum(r["non201"] for r in runs)
            print(
                f"| {rate} | {system} | {p50:.2f} | {p99:.2f} | {p99 / ceiling:.2f} "
                f"| {rps:,.0f} | {bad} |"
            )


if __name__ == "__main__":
    main()
