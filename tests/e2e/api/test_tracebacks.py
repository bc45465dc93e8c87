"""A failed attempt keeps its traceback: the last frames and the exception, bounded by
`--max-traceback-bytes`, in `GET /jobs/{id}` (each attempt's error), in the job's
`attempt_failed` events, in the dead letter and in `goqueue job`, on both stores."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

from tests.conftest import Node, wait_for

pytestmark = pytest.mark.timeout(90)

ERROR = "TypeError: '<=' not supported between instances of 'str' and 'int'"


def failed_job(node: Node, depth: int) -> dict[str, Any]:
    """A `nested_raise` job that failed both its attempts."""
    job = node.enqueue(type="nested_raise", payload={"limit": "x", "depth": depth})
    return node.wait_status(job["id"], "failed")


def test_each_failed_attempt_keeps_its_traceback(make_store_node: Callable[..., Node]) -> None:
    node = make_store_node()
    job = failed_job(node, depth=2)
    assert job["last_error"] == ERROR
    assert [e["attempt"] for e in job["errors"]] == [1, 2]
    for error in job["errors"]:
        tb = error["traceback"]
        assert tb.startswith("Traceback (most recent call last):\n"), tb
        assert "in nested_raise" in tb and tb.count("in _check_limit") == 3
        assert "child.py" not in tb  # the worker's own frames say nothing about the job
        assert "in _compare\n    return left <= right" in tb
        assert tb.rstrip().endswith(ERROR)
    events = node.get(f"/jobs/{job['id']}/events").body["events"]
    failed = [e for e in events if e["event"] == "attempt_failed"]
    assert [e["traceback"] for e in failed] == [e["traceback"] for e in job["errors"]]
    assert all(e["traceback"] is None for e in events if e["event"] != "attempt_failed")
    dead = wait_for(lambda: node.get(f"/dlq/{job['id']}").body, what="the dead letter")
    assert dead["errors"] == job["errors"]


def test_a_deep_traceback_keeps_its_last_frames_within_the_bound(
    make_store_node: Callable[..., Node],
) -> None:
    node = make_store_node("--max-traceback-bytes", "1500")
    job = failed_job(node, depth=200)
    tb = job["errors"][-1]["traceback"]
    assert len(tb.encode()) <= 1500
    assert tb.startswith("Traceback (most recent call last):\n  ... ")
    assert "earlier parts omitted" in tb and "in nested_raise" not in tb  # the oldest frames
    assert "in _compare" in tb and tb.rstrip().endswith(ERROR)  # the newest and the error


def test_zero_keeps_none_and_retry_or_fail_keep_none(make_node: Callable[..., Node]) -> None:
    node = make_node("--max-traceback-bytes", "0")
    job = failed_job(node, depth=1)
    assert [e.get("traceback") for e in job["errors"]] == [None, None]
    assert "traceback" not in job["errors"][0]  # left out, not null
    assert job["last_error"] == ERROR
    other = make_node()
    failed = other.enqueue(type="failnow")
    errors = other.wait_status(failed["id"], "failed")["errors"]
    assert "traceback" not in errors[0]  # Fail is an answer, not a crash


def test_goqueue_job_prints_the_traceback(node: Node) -> None:
    job = failed_job(node, depth=1)
    shown = subprocess.run(
        [sys.executable, "-m", "goqueue.api.cli.main", "job", job["id"], "--url", node.url],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert shown.returncode == 0, shown.stderr
    table, block = shown.stdout.split("traceback (attempt 2):\n")
    assert "TRACEBACK" not in table and "in _compare" not in table  # a row a line
    assert "    return left <= right" in block and block.rstrip().endswith(ERROR)
    assert all(line.startswith("  ") for line in block.splitlines())
