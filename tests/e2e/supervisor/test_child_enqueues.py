"""Jobs that talk to their supervisor from inside a real worker: `ctx.enqueue` creates
child jobs through the pipe (validated as POST /jobs is, `parent_id` set), and
`ctx.progress` shows in GET /jobs/{id} while the job runs. On both stores."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import Node, postgres_dsn, stop_node, wait_for

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(params=["memory", "postgres"])
def node(request: pytest.FixtureRequest, make_node: Callable[..., Node]) -> Iterator[Node]:
    if request.param == "memory":
        yield make_node()
        return
    dsn, schema = postgres_dsn(), f"gq_children_{uuid.uuid4().hex[:10]}"
    made = make_node("--database-url", dsn, "--database-schema", schema)
    yield made
    stop_node(made)
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def test_ctx_enqueue_creates_child_jobs_of_the_running_job(node: Node) -> None:
    children = [
        {"type": "noop", "payload": {"n": 1}, "options": {"priority": 9, "queue": "kids"}},
        {"type": "noop", "payload": 2, "options": {"dedupe_key": "k", "dedupe_window_seconds": 60}},
        {"type": "noop", "options": {"dedupe_key": "k", "dedupe_window_seconds": 60}},
        {"type": "no_such_type"},
        {"type": "noop", "options": {"priority": 11}},
        {"type": "noop", "options": {"dedupe_key": "only-a-key"}},
    ]
    job = node.enqueue(type="parent", payload={"children": children})
    done = node.wait_status(job["id"], "done")
    first, second, duplicate, unknown, out_of_range, half_dedupe = done["result"]
    for made, payload in ((first, {"n": 1}), (second, 2)):
        child = node.wait_status(made["id"], "done")
        assert child["parent_id"] == job["id"] and child["result"] == payload
    assert node.get(f"/jobs/{first['id']}").body["priority"] == 9
    assert node.get(f"/jobs/{first['id']}").body["queue"] == "kids"
    assert duplicate == {
        "refusal": "duplicate",
        "error": f"duplicate of job {second['id']}",
        "existing": second["id"],
    }
    assert unknown["refusal"] == "invalid" and "unknown job type 'no_such_type'" in unknown["error"]
    assert out_of_range["refusal"] == "invalid" and "priority" in out_of_range["error"]
    assert half_dedupe["refusal"] == "invalid"
    assert "dedupe_key needs dedupe_window_seconds" in half_dedupe["error"]
    listed = node.get("/jobs?type=noop").body
    assert listed["total"] == 2  # nothing refused was stored


def test_ctx_progress_shows_while_the_job_runs(node: Node, tmp_path: Path) -> None:
    reports = [0.1, 0.5, {"stage": "upload", "files": 3}]
    job = node.enqueue(type="reporter", payload={"dir": str(tmp_path), "reports": reports})

    def reported() -> dict | None:
        found = node.get(f"/jobs/{job['id']}").body
        return found if found.get("progress") == reports[-1] else None

    running = wait_for(reported, timeout=10)
    assert running["status"] == "running"
    listed = node.get("/jobs?status=running").body["jobs"]
    assert [j["progress"] for j in listed if j["id"] == job["id"]] == [reports[-1]]
    (tmp_path / "go").touch()
    done = node.wait_status(job["id"], "done")
    assert "progress" not in done and done["result"] == "finished"


def test_ctx_enqueue_of_a_held_unique_key_is_refused_with_its_holder(node: Node) -> None:
    held = node.enqueue(type="noop", unique_key="only-one", delay_seconds=60)
    children = [
        {"type": "noop", "options": {"unique_key": "only-one"}},
        {"type": "noop", "options": {"unique_key": "mine", "delay_seconds": 60}},
        {"type": "noop", "options": {"unique_key": "mine"}},
    ]
    job = node.enqueue(type="parent", payload={"children": children})
    refused, made, again = node.wait_status(job["id"], "done")["result"]
    assert refused["refusal"] == "duplicate" and refused["existing"] == held["id"]
    assert "unique_key" in refused["error"]
    assert node.get(f"/jobs/{made['id']}").body["unique_key"] == "mine"
    assert again["refusal"] == "duplicate" and again["existing"] == made["id"]
