"""The nodes `goqueue bench` measures: `goqueue serve` subprocesses on free loopback
ports, each in a throwaway PostgreSQL schema (dropped afterwards) when there is a DSN.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks.loadgen import LoadClient

CHECKOUT = Path(__file__).resolve().parent.parent


def normal_priority() -> None:
    """Nodes run at normal priority even though the load generator is niced (root only)."""
    os.setpriority(os.PRIO_PROCESS, 0, 0)


class BenchNode:
    """A `goqueue serve` subprocess on a free loopback port."""

    def __init__(self, *args: str, dsn: str | None, schema: str, store: str = "memory") -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("GOQUEUE_")}
        env.pop("DATABASE_URL", None)
        # the bench actors live beside this file, outside the installed package
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(CHECKOUT), env.get("PYTHONPATH")]))
        cmd = [
            sys.executable,
            "-m",
            "goqueue.api.cli.main",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--actors",
            "benchmarks.actors",
            "--log-level",
            "warning",
            "--max-pending",
            "1000000",
            *args,
        ]
        # without a DSN: memory, or a SQLite file of this node's own (gone at stop)
        self.folder = tempfile.mkdtemp(prefix="goqueue-bench-") if not dsn else None
        if dsn:
            cmd += ["--database-url", dsn, "--database-schema", schema]
        elif store == "sqlite":
            cmd += ["--database-url", f"sqlite:///{self.folder}/bench.db"]
        else:
            cmd += ["--database-url", "memory://"]
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 (closed in stop())
        self.proc = subprocess.Popen(
            cmd,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=env,
            preexec_fn=normal_priority if os.geteuid() == 0 else None,
        )

    async def ready(self, client: LoadClient, timeout: float = 30.0) -> None:
        """Wait for /ready to answer 200."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.log.seek(0)
                raise RuntimeError(f"node exited: {self.log.read().decode()[-2000:]}")
            try:
                if (await client.request("GET", "/ready"))[0] == 200:
                    return
            except OSError:
                pass
            await asyncio.sleep(0.05)
        raise RuntimeError("node not ready in time")

    def rss_kb(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        return 0

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)


@contextmanager
def schema_of(dsn: str | None) -> Iterator[str]:
    schema = f"goqueue_bench_{uuid.uuid4().hex[:8]}"
    try:
        yield schema
    finally:
        if dsn:
            import psycopg

            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


async def with_node(args: argparse.Namespace, dsn: str | None, *flags: str):
    """Start a node in a fresh schema; returns (node, client, schema context)."""
    ctx = schema_of(dsn)
    schema = ctx.__enter__()
    if getattr(args, "otel", False):
        flags = ("--otel", *flags)
    node = BenchNode(
        "--workers", str(args.workers), *flags, dsn=dsn, schema=schema, store=args.store
    )
    client = LoadClient("127.0.0.1", node.port)
    try:
        await node.ready(client)
    except Exception:
        client.close()
        node.stop()
        ctx.__exit__(None, None, None)
        raise
    return node, client, ctx


async def close(node: BenchNode, client: LoadClient, ctx: Any) -> None:
    client.close()
    node.stop()
    ctx.__exit__(None, None, None)


def otel_sink() -> str:
    """An OTLP/HTTP endpoint on loopback that answers every export with 200 and keeps
    nothing (what a fast collector costs the node, without one); its URL."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Sink(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}"
