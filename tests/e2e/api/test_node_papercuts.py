"""What a node says and serves, as a new user meets it: the store named at start (and a
warning when it keeps nothing across a restart), a readable log format on a terminal,
and `/metrics` without a `*_created` series beside every counter."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import FIXTURES, Node, free_port, postgres_dsn, wait_for

pytestmark = pytest.mark.timeout(60)

FORGETS = "the in-memory store keeps nothing across a restart"


def records(node: Node) -> list[dict[str, Any]]:
    """The node's JSON log lines so far."""
    return [json.loads(line) for line in node.logs().splitlines() if line.startswith("{")]


def started(node: Node) -> dict[str, Any]:
    return wait_for(
        lambda: next((r for r in records(node) if r["msg"] == "node started"), None),
        what="the node started line",
    )


def test_a_memory_node_names_its_store_and_warns_it_forgets(
    make_node: Callable[..., Node],
) -> None:
    node = make_node("--database-url", "memory://")
    assert started(node)["store"] == "memory"
    warning = next(r for r in records(node) if r["msg"].startswith(FORGETS))
    assert warning["level"] == "warning" and "--database-url" in warning["msg"]


def test_a_postgresql_node_names_its_store_and_does_not_warn(
    make_node: Callable[..., Node],
) -> None:
    schema = f"gq_pc_{os.getpid()}_{time.monotonic_ns() % 10**6}"
    node = make_node("--database-url", postgres_dsn(), "--database-schema", schema)
    try:
        assert started(node)["store"] == "postgresql"
        assert not [r for r in records(node) if r["msg"].startswith(FORGETS)]
    finally:
        import psycopg

        node.proc.send_signal(signal.SIGTERM)
        node.proc.wait(timeout=15)
        with psycopg.connect(postgres_dsn(), autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def test_text_logs_when_asked(make_node: Callable[..., Node]) -> None:
    node = make_node("--log-format", "text", "--database-url", "memory://")
    line = wait_for(
        lambda: next((x for x in node.logs().splitlines() if "node started" in x), None),
        what="the node started line",
    )
    assert not line.startswith("{")
    stamp, level, rest = line.split(None, 2)
    assert stamp.endswith("Z") and level == "info"
    assert rest.startswith("goqueue") and ": node started  " in rest and "store=memory" in rest
    assert "workers=2" in rest


def test_text_is_the_default_on_a_terminal_and_json_elsewhere(tmp_path: Path) -> None:
    primary, secondary = pty.openpty()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GOQUEUE_")}
    env["PYTHONPATH"] = str(FIXTURES)
    argv = ["serve", "--host", "127.0.0.1", "--port", str(free_port()), "--workers", "1"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "goqueue.api.cli.main", *argv, "--actors", "testactors"],
        stdout=secondary,
        stderr=secondary,
        env=env,
        cwd=tmp_path,
    )
    os.close(secondary)
    seen = b""
    try:
        deadline = time.monotonic() + 20
        while b"node started" not in seen and time.monotonic() < deadline:
            if select.select([primary], [], [], 0.5)[0]:
                try:
                    seen += os.read(primary, 65536)
                except OSError:
                    break
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=15)
        os.close(primary)
    text = seen.decode(errors="replace")
    line = next(x for x in text.splitlines() if "node started" in x)
    assert not line.lstrip().startswith("{") and "store=sqlite" in line, text


def test_metrics_carry_no_created_series(node: Node) -> None:
    job = node.enqueue(type="noop")
    node.wait_status(job["id"], "done")
    body = node.get("/metrics").body
    assert "goqueue_jobs_total{" in body and "goqueue_worker_restarts_total" in body
    assert "_created" not in body


def test_a_lone_surrogate_is_named_not_called_truncated(node: Node) -> None:
    resp = node.post("/jobs", b'{"type": "noop", "payload": {"text": "a\\ud800b"}}')
    assert resp.status == 400, resp
    assert "truncated" not in resp.body["error"]
    assert "\\ud800 is half of a UTF-16 surrogate pair" in resp.body["error"], resp.body
    paired = node.post("/jobs", b'{"type": "noop", "payload": "\\ud83d\\ude00"}')
    assert paired.status == 201 and paired.body["payload"] == "\U0001f600"
