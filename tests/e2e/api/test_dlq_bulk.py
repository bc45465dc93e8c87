"""Bulk dead-letter actions, lookup by job id and unique jobs, on real make_store_node over real
HTTP, on both stores; every answer checked against the served OpenAPI document."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from tests.conftest import Node, Response, wait_for

pytestmark = pytest.mark.timeout(120)


def conforms(node: Node, method: str, path: str, resp: Response) -> None:
    """The answer is one the served OpenAPI document describes for this route."""
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema checks answers vs docs")
    doc = node.get("/openapi.json").body
    answers = doc["paths"][path][method.lower()]["responses"]
    assert str(resp.status) in answers, f"{method} {path}: {resp.status} is not documented"
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        **answers[str(resp.status)]["content"]["application/json"]["schema"],
        "components": doc["components"],
    }
    jsonschema.Draft202012Validator(schema).validate(resp.body)


def bury(node: Node, job_type: str, n: int, **job: Any) -> list[str]:
    """Enqueue `n` jobs that fail for good; wait until each is dead-lettered."""
    ids = [node.enqueue(type=job_type, **job)["id"] for _ in range(n)]
    for job_id in ids:
        node.wait_status(job_id, "failed")
    wait_for(lambda: all(node.get(f"/dlq/{i}").status == 200 for i in ids))
    return ids


def test_bulk_replay_and_purge_by_filter(make_store_node, tmp_path: Path) -> None:
    node = make_store_node()
    work = {"dir": str(tmp_path)}
    broken = bury(node, "fails_until_fixed", 3, payload=work)
    bad_input = bury(node, "failnow", 2)

    refused = node.post("/dlq/replay")
    assert refused.status == 400 and refused.body["details"] == {"parameter": "all"}
    assert "all=true" in refused.body["error"]
    conforms(node, "POST", "/dlq/replay", refused)
    assert node.delete("/dlq?all=false").status == 400
    assert node.delete("/dlq?limit=5").status == 400  # a limit is no filter
    bad_time = node.delete("/dlq?before=yesterday")
    assert bad_time.status == 400 and bad_time.body["details"] == {"parameter": "before"}
    assert node.post("/dlq/replay?type=x&limit=1001").status == 400
    assert node.get("/dlq").body["total"] == 5  # nothing refused changed anything

    listed = node.get("/dlq?type=fails_until_fixed&limit=2")  # what a replay would take
    assert listed.body["total"] == 3 and len(listed.body["dead_letters"]) == 2
    conforms(node, "GET", "/dlq", listed)
    assert node.get("/dlq?error=BAD%20input").body["total"] == 2
    (tmp_path / "fixed").touch()  # the fix is deployed: replayed jobs now succeed
    first = node.post("/dlq/replay?type=fails_until_fixed&limit=2")
    assert first.status == 200 and first.body == {"replayed": 2, "remaining": 1}
    conforms(node, "POST", "/dlq/replay", first)
    rest = node.post("/dlq/replay?type=fails_until_fixed")
    assert rest.body == {"replayed": 1, "remaining": 0}
    assert all(node.get(f"/dlq/{job_id}").status == 404 for job_id in broken)

    def done() -> list[dict]:
        listed = node.get("/jobs?type=fails_until_fixed&status=done").body["jobs"]
        return listed if len(listed) == 3 else []

    assert all(job["result"] == {"fixed": True} for job in wait_for(done, 20))

    before = quote((datetime.now(UTC) - timedelta(days=7)).isoformat())
    old = node.delete(f"/dlq?before={before}")
    assert old.body == {"purged": 0, "remaining": 0}  # none is a week old
    purged = node.delete("/dlq?error=BAD%20INPUT&type=failnow")
    assert purged.status == 200 and purged.body == {"purged": 2, "remaining": 0}
    conforms(node, "DELETE", "/dlq", purged)
    assert all(node.get(f"/dlq/{job_id}").status == 404 for job_id in bad_input)
    assert node.get("/dlq").body["total"] == 0
    assert node.delete("/dlq?all=true").body == {"purged": 0, "remaining": 0}


def test_a_dead_letter_is_found_by_its_jobs_id(make_store_node) -> None:
    node = make_store_node()
    [job_id] = bury(node, "failnow", 1)
    by_job = node.get(f"/dlq/{job_id}")
    assert by_job.status == 200 and by_job.body["job_id"] == job_id
    conforms(node, "GET", "/dlq/{id}", by_job)
    dead_id = by_job.body["id"]
    assert node.get(f"/dlq/{dead_id}").body["job_id"] == job_id
    unknown = str(uuid.uuid4())
    missing = node.get(f"/dlq/{unknown}")
    assert missing.status == 404 and missing.body["details"] == {"id": unknown}
    assert f"dead letter {unknown} not found" in missing.body["error"]
    assert "nor the id of a job in the dead-letter queue" in missing.body["error"]
    conforms(node, "GET", "/dlq/{id}", missing)
    replayed = node.post(f"/dlq/{job_id}/replay")  # by the job's id too
    assert replayed.status == 201 and replayed.body["type"] == "failnow"
    [again] = [replayed.body["id"]]
    node.wait_status(again, "failed")
    letter = wait_for(lambda: node.get(f"/dlq/{again}").body.get("id"))
    purged = node.delete(f"/dlq/{again}")
    assert purged.status == 200 and purged.body == {"purged": letter}


def test_unique_jobs_hold_their_key_until_finished(make_store_node, tmp_path: Path) -> None:
    node = make_store_node()
    hold = {"type": "hold", "unique_key": "sync:42", "payload": {"dir": str(tmp_path)}}
    first = node.post("/jobs", hold)
    assert first.status == 201 and first.body["unique_key"] == "sync:42"
    conforms(node, "POST", "/jobs", first)
    wait_for(lambda: list(tmp_path.glob("hold-*")))  # running now
    second = node.post("/jobs", {"type": "noop", "unique_key": "sync:42"})
    assert second.status == 409 and second.body["existing_id"] == first.body["id"]
    assert "unique_key" in second.body["error"]
    conforms(node, "POST", "/jobs", second)
    batch = node.post(
        "/jobs/batch",
        {"jobs": [{"type": "noop", "unique_key": "sync:42"}, {"type": "noop", "unique_key": "u"}]},
    )
    refused, stored = batch.body["results"]
    assert refused["status"] == 409 and refused["existing_id"] == first.body["id"]
    assert stored["status"] == 201
    template = node.post(
        "/jobs", {"type": "noop", "on_success": {"type": "noop", "unique_key": "x"}}
    )
    assert template.status == 400 and template.body["details"] == {"field": "on_success.unique_key"}
    assert node.delete(f"/jobs/{first.body['id']}?force=true").status == 200
    third = node.post("/jobs", {"type": "noop", "unique_key": "sync:42"})  # free again
    assert third.status == 201
    node.wait_status(third.body["id"], "done")
    assert node.post("/jobs", {"type": "noop", "unique_key": "sync:42"}).status == 201


@pytest.mark.postgres
@pytest.mark.parametrize("api_store", ["postgres"])  # memory nodes share nothing: the
def test_one_unique_key_raced_over_two_nodes_makes_exactly_one_job(  # memory race is in
    make_store_node,  # the store contract
) -> None:
    a, b = make_store_node("--queues", "elsewhere"), make_store_node("--queues", "elsewhere")
    job = {"type": "noop", "unique_key": "race"}
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda i: (a, b)[i % 2].post("/jobs", job), range(40)))
    created = [r for r in answers if r.status == 201]
    refused = [r for r in answers if r.status == 409]
    assert len(created) == 1 and len(refused) == 39, [r.status for r in answers]
    assert {r.body["existing_id"] for r in refused} == {created[0].body["id"]}


def test_queue_health_metrics(make_store_node) -> None:
    node = make_store_node("--queues", "served")
    bury(node, "failnow", 2, queue="served")
    node.enqueue(type="noop", queue="stuck")  # no node serves it: it only waits
    node.enqueue(type="noop", queue="stuck")

    def scraped() -> dict[str, float]:
        text = node.get("/metrics").body
        values = {}
        for line in text.splitlines():
            name, _, value = line.rpartition(" ")
            if name.startswith(("goqueue_queue_oldest_pending_seconds", "goqueue_dead_letters")):
                values[name] = float(value)
        ok = values.get('goqueue_queue_oldest_pending_seconds{queue="stuck"}', 0) >= 0.5
        return values if ok else {}

    values = wait_for(scraped, 15)
    assert values["goqueue_dead_letters"] == 2
    assert values['goqueue_queue_oldest_pending_seconds{queue="stuck"}'] < 60


def goqueue_cli(node: Node, *argv: str) -> subprocess.CompletedProcess[str]:
    """Run the `goqueue` command against `node`."""
    cmd = [sys.executable, "-m", "goqueue.api.cli.main", *argv, "--url", node.url]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)


def test_cli_replays_every_dead_letter_of_a_type_with_one_command(
    make_store_node, tmp_path: Path
) -> None:
    node = make_store_node()
    broken = bury(node, "fails_until_fixed", 3, payload={"dir": str(tmp_path)})
    bury(node, "failnow", 1)
    shown = goqueue_cli(node, "dlq", "show", broken[0])  # by the job's id
    assert shown.returncode == 0 and f"job_id      {broken[0]}" in shown.stdout, shown
    missing = goqueue_cli(node, "dlq", "show", str(uuid.uuid4()))
    assert (
        missing.returncode == 1
        and "neither a dead letter's id nor the id of a job" in missing.stderr
    )

    listed = goqueue_cli(node, "dlq", "list", "--type", "failnow", "--newer-than", "1h")
    assert listed.returncode == 0 and "showing 1-1 of 1 dead letters" in listed.stdout, listed
    unasked = goqueue_cli(node, "dlq", "replay", "--type", "fails_until_fixed")
    assert unasked.returncode == 2 and "--all (with --type)" in unasked.stderr
    both = goqueue_cli(node, "dlq", "purge", broken[0], "--all")
    assert both.returncode == 2 and "not both" in both.stderr
    bad_age = goqueue_cli(node, "dlq", "purge", "--all", "--older-than", "7 days")
    assert bad_age.returncode == 2 and "not a duration" in bad_age.stderr

    (tmp_path / "fixed").touch()
    replayed = goqueue_cli(node, "dlq", "replay", "--all", "--type", "fails_until_fixed")
    assert replayed.returncode == 0, replayed
    assert replayed.stdout == "replayed 3 dead letters (0 matching left)\n"
    assert [d["job"]["type"] for d in node.get("/dlq").body["dead_letters"]] == ["failnow"]

    old = goqueue_cli(node, "dlq", "purge", "--all", "--older-than", "7d")
    assert old.stdout == "purged 0 dead letters (0 matching left)\n", old
    everything = goqueue_cli(node, "dlq", "purge", "--all", "--json")
    assert json.loads(everything.stdout) == {"purged": 1, "remaining": 0}


def test_cli_enqueue_with_a_unique_key(make_store_node) -> None:
    node = make_store_node()
    first = goqueue_cli(node, "enqueue", "noop", "--unique-key", "k", "--delay", "60", "--json")
    assert first.returncode == 0, first
    held = goqueue_cli(node, "enqueue", "noop", "--unique-key", "k")
    assert held.returncode == 1 and "HTTP 409" in held.stderr
    assert json.loads(first.stdout)["id"] in held.stderr


def test_a_bulk_replay_into_queues_beyond_max_queues_is_429_and_replays_nothing(
    make_store_node,
) -> None:
    node = make_store_node("--max-queues", "2")
    bury(node, "failnow", 1, queue="a")
    bury(node, "failnow", 1, queue="b")

    def hold(queue: str) -> str | None:  # once the budget's read (2 s) sees a and b empty
        resp = node.post("/jobs", {"type": "noop", "queue": queue, "delay_seconds": 600})
        return resp.body["id"] if resp.status == 201 else None

    held = [wait_for(lambda q=q: hold(q), 10) for q in ("p1", "p2")]
    refused = node.post("/dlq/replay?all=true")
    assert refused.status == 429 and refused.body["details"]["field"] == "queue"
    conforms(node, "POST", "/dlq/replay", refused)
    assert node.get("/dlq").body["total"] == 2  # nothing replayed
    for job_id in held:
        assert node.delete(f"/jobs/{job_id}").status == 200

    def replayed() -> Response | None:
        resp = node.post("/dlq/replay?all=true")
        return resp if resp.status == 200 else None

    assert wait_for(replayed, 10).body == {"replayed": 2, "remaining": 0}
