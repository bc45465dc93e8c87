"""A throwaway PostgreSQL cluster of a test's own, for tests that stop, crash or restart
the database. The machine's shared server is never touched: other work uses it.

The cluster is made with the installed server's `initdb` and `pg_ctl` in a temporary
folder, listens on a free loopback port, keeps PostgreSQL's durable defaults (fsync on),
and is removed afterwards. As root the server runs as the `postgres` user (PostgreSQL
refuses to run as root).
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest


def _bindir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    return Path(found[-1]).parent if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PgCluster:
    """One private cluster: `start`, `stop` (fast or immediate, i.e. a crash), `restart`."""

    def __init__(self, bindir: Path, base: Path, settings: Mapping[str, str] | None = None) -> None:
        self.bindir = bindir
        self.base = base
        self.settings = dict(settings or {})  # server settings beyond the defaults
        self.data = base / "data"
        self.port = _free_port()
        self.dsn = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.bindir / argv[0]), *argv[1:]]
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        return subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=timeout)

    def init(self) -> None:
        """initdb with trust auth for local and loopback connections."""
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8")

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        options = (
            f"-c port={self.port} -c listen_addresses=127.0.0.1"
            f" -c unix_socket_directories={self.base} -c max_connections=100"
        ) + "".join(f" -c {name}={value}" for name, value in self.settings.items())
        self._run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.base / "server.log"),
            "-o", options, "-w", "-t", "60", "start",
        )  # fmt: skip

    def stop(self, mode: str = "fast") -> None:
        """Stop the server: `fast` (clean) or `immediate` (a crash: no shutdown checkpoint)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")

    def restart(self, mode: str = "fast") -> None:
        """Stop, then start again on the same port."""
        self.stop(mode)
        self.start()

    def log(self) -> str:
        """The server's log so far (for failure messages)."""
        path = self.base / "server.log"
        return path.read_text(errors="replace") if path.exists() else ""


@contextlib.contextmanager
def private_cluster(settings: Mapping[str, str] | None = None) -> Iterator[PgCluster]:
    """A started private cluster (with `settings`), stopped and removed afterwards.
    RuntimeError when the server's binaries are not installed."""
    bindir = _bindir()
    if bindir is None:
        raise RuntimeError("no PostgreSQL server binaries (/usr/lib/postgresql/*/bin)")
    base = Path(tempfile.mkdtemp(prefix="goqueue-pg-"))
    if os.geteuid() == 0:
        shutil.chown(base, "postgres", "postgres")
    cluster = PgCluster(bindir, base, settings)
    try:
        cluster.init()
        cluster.start()
        yield cluster
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):  # already stopped
            cluster.stop("immediate")
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def pg_cluster() -> Iterator[PgCluster]:
    """A started private cluster, stopped and removed after the test."""
    if _bindir() is None:
        if os.environ.get("CI"):
            pytest.fail("a private PostgreSQL cluster needs the PostgreSQL server binaries")
        pytest.skip("SKIPPING: no PostgreSQL server binaries (/usr/lib/postgresql/*/bin)")
    with private_cluster() as cluster:
        yield cluster
