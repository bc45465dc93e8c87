"""A handler's log lines and printed output come out in the node's log naming the job."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.conftest import wait_for

pytestmark = pytest.mark.timeout(60)


def records(node: Any, job_id: str) -> list[dict[str, Any]]:
    """The node log's JSON lines that name `job_id`."""
    found = []
    for line in node.logs().splitlines():
        if job_id in line:
            entry = json.loads(line)  # a torn or non-JSON line fails here
            if entry.get("job_id") == job_id:
                found.append(entry)
    return found


def test_logging_and_prints_inside_a_handler_name_the_job(make_node: Any) -> None:
    node = make_node()
    job = node.enqueue(type="chatty", payload={"word": "hi", "fail_first": True}, queue="q1")
    node.wait_status(job["id"], "done")

    def both_attempts() -> list[dict[str, Any]] | None:
        found = records(node, job["id"])
        said = [r for r in found if r["msg"] == "chatty says hi"]
        return found if {r["attempt"] for r in said} == {1, 2} else None

    found = wait_for(both_attempts, what="the handler's warning, from both attempts")
    warning = next(r for r in found if r["msg"] == "chatty says hi")
    assert warning["level"] == "warning" and warning["logger"] == "chatty"
    assert warning["type"] == "chatty" and warning["queue"] == "q1"
    assert isinstance(warning["worker_pid"], int)
    first = [r for r in found if r["attempt"] == 1]
    printed = [(r["logger"], r["msg"]) for r in first if r["logger"] in ("stdout", "stderr")]
    assert printed == [
        ("stdout", "printed line one"),
        ("stdout", "printed line two"),
        ("stderr", "to stderr"),
        ("stdout", "no newline yet"),  # a partial line goes out as its attempt ends
    ]


def test_the_node_log_level_holds_in_workers(make_node: Any) -> None:
    node = make_node("--log-level", "error")
    job = node.enqueue(type="chatty", payload={"word": "quiet"})
    node.wait_status(job["id"], "done")
    wait_for(
        lambda: any(r["msg"] == "printed line one" for r in records(node, job["id"])),
        what="the printed line (printed output is kept at any level)",
    )
    assert not any(r["msg"] == "chatty says quiet" for r in records(node, job["id"]))
