"""Nodes on one PostgreSQL schema, for tests that kill, pause and starve them.

Every node is started as a session leader, so its process group (id = the supervisor's
pid) holds everything it started: at teardown the whole group is SIGKILLed, orphans
included, whatever the test did to it. No node is asked to drain here (other tests
check that), so a hung or half-dead node never turns a finding into a teardown error.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Node, postgres_dsn, request, start_node, wait_for
from tests.pgcluster import PgCluster

ACTORS = "testactors,faultactors"


class NodeSet:
    """A factory of nodes sharing one fresh schema of the database at `dsn`."""

    def __init__(self, directory: Path, dsn: str) -> None:
        self.directory = directory
        self.dsn = dsn
        self.schema = f"gq_faults_{uuid.uuid4().hex[:10]}"
        self.nodes: list[Node] = []

    def db_args(self, dsn: str | None = None) -> tuple[str, ...]:
        return ("--database-url", dsn or self.dsn, "--database-schema", self.schema)

    def start(
        self, *args: str, wait: bool = True, dsn: str | None = None, workers: int = 2
    ) -> Node:
        """A node with the test and fault actors, `workers` workers, on the shared schema
        (through `dsn` when given, e.g. a proxy); waits for /ready unless `wait` is off."""
        options = list(args)
        if "--actors" not in options:
            options += ["--actors", ACTORS]
        if "--workers" not in options:
            options += ["--workers", str(workers)]
        node = start_node(self.directory, *self.db_args(dsn), *options, session=True, wait=False)
        self.nodes.append(node)
        if wait:

            def ready() -> bool:
                if node.proc.poll() is not None:
                    raise AssertionError(f"node exited with {node.proc.returncode}:\n{node.logs()}")
                try:
                    return request("GET", node.url + "/ready").status == 200
                except OSError:
                    return False

            wait_for(ready, timeout=30)
        return node

    def kill_all(self) -> None:
        """SIGKILL every node's whole process group, and reap the supervisors."""
        for node in self.nodes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(node.proc.pid, signal.SIGCONT)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(node.proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                node.proc.wait(timeout=10)

    def drop_schema(self) -> None:
        import psycopg

        with (
            contextlib.suppress(psycopg.Error),
            psycopg.connect(self.dsn, autocommit=True, connect_timeout=5) as conn,
        ):
            conn.execute(f"DROP SCHEMA IF EXISTS {self.schema} CASCADE")


@pytest.fixture
def pg_nodes(tmp_path: Path) -> Iterator[NodeSet]:
    """Nodes on a fresh schema of the shared test database (never stopped by a test)."""
    nodes = NodeSet(tmp_path, postgres_dsn())
    try:
        yield nodes
    finally:
        nodes.kill_all()
        nodes.drop_schema()


@pytest.fixture
def private_nodes(tmp_path: Path, pg_cluster: PgCluster) -> Iterator[NodeSet]:
    """Nodes on a private PostgreSQL (`pg_cluster`) that the test may stop and crash."""
    nodes = NodeSet(tmp_path, pg_cluster.dsn)
    try:
        yield nodes
    finally:
        nodes.kill_all()
