"""The HTTP API over real HTTP on loopback, against a real engine and in-memory store.

No worker runs jobs here (except one test that spawns a real worker for /ready), so jobs
stay pending unless a test drives the store itself on the server's loop.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import uuid
from typing import Any
from urllib.parse import quote

import aiohttp
import msgspec
import pytest
from aiohttp import web
from goqueue.api.http.middleware import front_middleware
from goqueue.api.http.replies import HIDDEN_JOB_FIELDS, LIVE_JOB_FIELDS, JobOut, from_domain, within
from goqueue.supervisor.common.enums import Status, WorkerState
from goqueue.supervisor.common.errors import StoreUnavailable
from goqueue.supervisor.common.jobs import Job, JobSpec
from goqueue.supervisor.common.lifecycle import NodePhase
from goqueue.supervisor.observe.metrics import Metrics
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.api.conftest import ApiServer, wait_until

pytestmark = pytest.mark.timeout(60)

UNKNOWN_ID = "0b7f3c1e-8a8e-4c55-9d6f-2f9e1b0c4d3a"


def email(**fields: Any) -> dict[str, Any]:
    """A valid job body of the registered `email` type."""
    return {"type": "email", "payload": {"to": "a@example.com"}, **fields}


def enqueue(server: ApiServer, **fields: Any) -> dict[str, Any]:
    """POST one job that must be accepted; its JSON."""
    resp = server.post("/jobs", email(**fields))
    assert resp.status == 201, resp.body
    return resp.json


def make_dead_letter(server: ApiServer) -> str:
    """Enqueue a job, claim it and fail it for good on the server's loop; the letter's id."""
    queue = f"doomed-{uuid.uuid4().hex[:8]}"  # its own queue: nothing else is claimed
    job = enqueue(server, queue=queue)
    store = server.store
    assert store is not None

    async def fail() -> str:
        leases = await store.claim(1, frozenset({queue}), {"email": 1})
        assert [lease.job.id for lease in leases] == [job["id"]]
        outcome = await store.fail(leases[0], "boom", None)
        assert outcome is not None and outcome.dead_letter is not None
        return outcome.dead_letter.id

    return server.call(fail())


# -- enqueue ---------------------------------------------------------------------------


def test_enqueue_answers_201_with_location_and_the_job(api_server: ApiServer) -> None:
    resp = api_server.post("/jobs", email(priority=7, timeout_seconds=1.5))
    assert resp.status == 201
    job = resp.json
    assert resp.headers["location"] == f"/jobs/{job['id']}"
    assert resp.headers["content-type"].startswith("application/json")
    assert uuid.UUID(job["id"])
    assert (job["type"], job["queue"], job["status"]) == ("email", "default", "pending")
    assert (job["priority"], job["max_retries"], job["attempts"]) == (7, 3, 0)
    assert job["payload"] == {"to": "a@example.com"}
    assert job["timeout_seconds"] == 1.5
    assert "seq" not in job
    shown = api_server.get(f"/jobs/{job['id']}")
    # GET adds the effective timeout, here the job's own
    assert shown.status == 200 and shown.json == {
        **job,
        "timeout": {"seconds": 1.5, "source": "job"},
    }


def test_actor_defaults_apply_when_the_job_sets_none(api_server: ApiServer) -> None:
    resp = api_server.post("/jobs", {"type": "report"})
    assert resp.status == 201
    assert resp.json["max_retries"] == 1  # the report actor declares max_retries=1
    assert resp.json["payload"] is None


def test_chained_templates_and_delay_are_accepted(api_server: ApiServer) -> None:
    job = enqueue(
        api_server,
        delay_seconds=60,
        on_success={"type": "report", "on_failure": {"type": "email"}},
    )
    assert job["on_success"]["type"] == "report"
    assert job["on_success"]["on_failure"]["type"] == "email"
    assert job["run_at"] > job["created_at"]


BAD_BODIES = [
    pytest.param(b'{"type": "email",', None, "not valid JSON", id="malformed-json"),
    pytest.param(b"\xff\xfe\x00", None, "not valid JSON", id="not-utf8"),
    pytest.param(b"", None, "empty", id="empty"),
    pytest.param(b"[]", None, "Expected `object`", id="array"),
    pytest.param(b'"email"', None, "Expected `object`", id="string"),
    pytest.param(b"{}", "type", "missing required field", id="no-type"),
    pytest.param(b'{"type": 5}', "type", "Expected `str`", id="type-wrong-type"),
    pytest.param(b'{"type": "email", "priority": "high"}', "priority", "int", id="priority-str"),
    pytest.param(b'{"type": "email", "priority": 11}', "priority", "<= 10", id="priority-11"),
    pytest.param(b'{"type": "email", "priority": -1}', "priority", ">= 0", id="priority-neg"),
    pytest.param(b'{"type": "email", "priority": 5.5}', "priority", "int", id="priority-float"),
    pytest.param(b'{"type": "email", "foo": 1}', "foo", "unknown field", id="unknown-field"),
    pytest.param(
        b'{"type": "email", "timeout_seconds": -1}', "timeout_seconds", "> 0", id="timeout-neg"
    ),
    pytest.param(
        b'{"type": "email", "timeout_seconds": 0}', "timeout_seconds", "> 0", id="timeout-zero"
    ),
    pytest.param(b'{"type": "email", "max_retries": -1}', "max_retries", ">= 0", id="retries"),
    pytest.param(b'{"type": "nope"}', "type", "unknown job type 'nope'", id="unknown-type"),
    pytest.param(
        b'{"type": "email", "on_success": {"type": "nope"}}',
        "on_success.type",
        "unknown job type 'nope'",
        id="unknown-nested-type",
    ),
    pytest.param(
        b'{"type": "email", "on_failure": {"type": "email", "bar": 1}}',
        "on_failure.bar",
        "unknown field",
        id="unknown-nested-field",
    ),
    pytest.param(
        b'{"type": "email", "on_success": {"type": "email", "priority": 99}}',
        "on_success.priority",
        "<= 10",
        id="nested-priority",
    ),
    pytest.param(b'{"type": "email", "queue": "a b"}', "queue", "matching regex", id="bad-queue"),
    pytest.param(
        b'{"type": "email", "queue": "q\\n"}', "queue", "matching regex", id="queue-newline"
    ),
    pytest.param(
        b'{"type": "email", "run_at": "2030-01-01T00:00:00"}',
        "run_at",
        "timezone",
        id="naive-run-at",
    ),
    pytest.param(
        b'{"type": "email", "run_at": "2030-01-01T00:00:00Z", "delay_seconds": 5}',
        "delay_seconds",
        "not both",
        id="run-at-and-delay",
    ),
    pytest.param(
        b'{"type": "email", "dedupe_window_seconds": 5}',
        "dedupe_key",
        "needs a dedupe_key",
        id="window-without-key",
    ),
    pytest.param(
        b'{"type": "email", "dedupe_key": "k"}',
        "dedupe_window_seconds",
        "needs dedupe_window_seconds",
        id="key-without-window",
    ),
    pytest.param(
        b'{"type": "email", "webhook_url": "ftp://x"}',
        "webhook_url",
        "matching regex",
        id="webhook",
    ),
    pytest.param(
        b'{"type": "email", "on_success": {"type": "email", "delay_seconds": 1, '
        b'"run_at": "2030-01-01T00:00:00Z"}}',
        "on_success.delay_seconds",
        "not both",
        id="nested-run-at-and-delay",
    ),
    pytest.param(
        b'{"type": "email", "concurrency_key": ""}',
        "concurrency_key",
        "length >= 1",
        id="key-empty",
    ),
    pytest.param(
        b'{"type": "email", "concurrency_key": "' + b"k" * 201 + b'"}',
        "concurrency_key",
        "length <= 200",
        id="key-long",
    ),
    pytest.param(
        b'{"type": "email", "concurrency_key": 7}',
        "concurrency_key",
        "Expected `str",
        id="key-number",
    ),
    pytest.param(
        b'{"type": "email", "debounce_key": "d"}',
        "debounce_seconds",
        "needs debounce_seconds",
        id="debounce-no-seconds",
    ),
    pytest.param(
        b'{"type": "email", "debounce_seconds": 1}',
        "debounce_key",
        "needs a debounce_key",
        id="debounce-no-key",
    ),
    pytest.param(
        b'{"type": "email", "debounce_key": "d", "debounce_seconds": 0}',
        "debounce_seconds",
        "Expected `float` > 0",
        id="debounce-zero",
    ),
    pytest.param(
        b'{"type": "email", "debounce_key": "d", "debounce_seconds": 1, "delay_seconds": 5}',
        "debounce_seconds",
        "give no run_at or delay_seconds",
        id="debounce-and-delay",
    ),
    pytest.param(
        b'{"type": "email", "on_success": {"type": "email", "debounce_key": "d", '
        b'"debounce_seconds": 1}}',
        "on_success.debounce_key",
        "not allowed in a job template",
        id="debounce-in-template",
    ),
    pytest.param(
        b'{"type": "email", "payload": ' + b"[" * 5000 + b"]" * 5000 + b"}",
        None,
        "nested too deeply",
        id="deep-payload",
    ),
    pytest.param(
        b'{"type": "email", "on_success": ' * 40 + b'{"type": "email"}' + b"}" * 40,
        "on_success." * 32 + "on_success",
        "nest at most",
        id="long-chain",
    ),
]


@pytest.mark.parametrize(("body", "field", "message"), BAD_BODIES)
def test_bad_job_bodies_are_400_naming_the_field(
    api_server: ApiServer, body: bytes, field: str | None, message: str
) -> None:
    before = api_server.job_count()
    resp = api_server.post("/jobs", raw=body)
    assert resp.status == 400, resp.body
    error = resp.json
    assert message in error["error"]
    assert set(error) == {"error", "details"}
    if field is None:
        assert error["details"] is None or "field" not in error["details"]
    else:
        assert error["details"]["field"] == field
    assert api_server.job_count() == before


def test_oversized_bodies_are_413(make_api_server: Any) -> None:
    server = make_api_server(max_body_bytes=1024)
    before = server.job_count()
    resp = server.post("/jobs", email(payload="x" * 2000))
    assert resp.status == 413
    assert resp.json == {
        "error": "request body exceeds 1024 bytes",
        "details": {"max_bytes": 1024},
    }
    chunks = iter([b'{"type": "email", "payload": "', b"y" * 4096, b'"}'])
    chunked = server.request("POST", "/jobs", raw=chunks)  # type: ignore[arg-type]
    assert chunked.status == 413
    assert chunked.json["error"] == "request body exceeds 1024 bytes"
    assert server.post("/jobs", email()).status == 201  # a small one still fits
    assert server.job_count() == before + 1


# -- ids and query parameters ----------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/jobs/{}"),
        ("GET", "/jobs/{}/events"),
        ("GET", "/jobs/{}/deliveries"),
        ("DELETE", "/jobs/{}"),
        ("GET", "/dlq/{}"),
        ("POST", "/dlq/{}/replay"),
        ("DELETE", "/dlq/{}"),
    ],
)
def test_malformed_ids_are_400_and_unknown_ids_404(
    api_server: ApiServer, method: str, path: str
) -> None:
    enqueue(api_server)
    before = api_server.job_count()
    for bad in ("not-a-uuid", "123", UNKNOWN_ID + "0", quote("../jobs", safe="")):
        resp = api_server.request(method, path.format(bad))
        assert resp.status == 400, (bad, resp.body)
        assert resp.json["details"] == {"parameter": "id"}
    resp = api_server.request(method, path.format(UNKNOWN_ID))
    assert resp.status == 404, resp.body
    assert UNKNOWN_ID in resp.json["error"]
    assert api_server.job_count() == before


def test_ids_are_case_insensitive(api_server: ApiServer) -> None:
    job = enqueue(api_server)
    resp = api_server.get(f"/jobs/{job['id'].upper()}")
    assert resp.status == 200 and resp.json["id"] == job["id"]


@pytest.mark.parametrize(
    ("path", "parameter"),
    [
        ("/jobs?limit=0", "limit"),
        ("/jobs?limit=1001", "limit"),
        ("/jobs?limit=abc", "limit"),
        ("/jobs?limit=-5", "limit"),
        ("/jobs?limit=%EF%BC%95", "limit"),  # a full-width digit: int() would take it
        ("/jobs?offset=-1", "offset"),
        ("/jobs?offset=1.5", "offset"),
        ("/jobs?status=bogus", "status"),
        ("/jobs?status=", "status"),
        ("/jobs?type=a%20b", "type"),
        ("/jobs?queue=", "queue"),
        ("/jobs?concurrency_key=", "concurrency_key"),
        ("/jobs?concurrency_key=" + "k" * 201, "concurrency_key"),
        ("/summary/jobs?concurrency_key=", "concurrency_key"),
        ("/jobs?stauts=failed", "stauts"),
        ("/jobs?limit=1&limit=2", "limit"),
        ("/dlq?limit=5000", "limit"),
        ("/dlq?status=failed", "status"),
        ("/stats?x=1", "x"),
        ("/queues/a%20b/stats", "name"),
        ("/jobs/" + UNKNOWN_ID + "?force=true", "force"),
    ],
)
def test_bad_query_parameters_are_400_naming_them(
    api_server: ApiServer, path: str, parameter: str
) -> None:
    resp = api_server.get(path)
    assert resp.status == 400, resp.body
    assert resp.json["details"] == {"parameter": parameter}


def test_force_must_be_a_boolean(api_server: ApiServer) -> None:
    job = enqueue(api_server)
    for bad in ("maybe", "yes", "2", ""):
        resp = api_server.delete(f"/jobs/{job['id']}?force={bad}")
        assert resp.status == 400, bad
        assert resp.json["details"] == {"parameter": "force"}
    assert api_server.get(f"/jobs/{job['id']}").json["status"] == "pending"
    for good in ("false", "0"):
        assert api_server.delete(f"/jobs/{UNKNOWN_ID}?force={good}").status == 404


# -- idempotency, dedupe, cancel -------------------------------------------------------


def test_idempotency_key_repeats_answer_the_original(api_server: ApiServer) -> None:
    key = {"Idempotency-Key": "order-42"}
    body = json.dumps(email()).encode()
    first = api_server.post("/jobs", raw=body, headers=key)
    assert first.status == 201
    again = api_server.post("/jobs", raw=body, headers=key)
    assert again.status == 200
    assert again.json["id"] == first.json["id"]
    assert "location" not in again.headers
    other = api_server.post("/jobs", email(priority=9), headers=key)
    assert other.status == 422
    assert other.json["details"]["existing_id"] == first.json["id"]
    assert api_server.job_count() == 1


@pytest.mark.parametrize("key", ["", "k" * 201])
def test_idempotency_key_length_is_checked(api_server: ApiServer, key: str) -> None:
    resp = api_server.post("/jobs", email(), headers={"Idempotency-Key": key})
    assert resp.status == 400
    assert resp.json["details"] == {"header": "Idempotency-Key"}
    assert api_server.job_count() == 0


def test_duplicates_are_409_until_the_window_ends(api_server: ApiServer) -> None:
    dedupe = {"dedupe_key": "user-7", "dedupe_window_seconds": 0.2}
    first = enqueue(api_server, **dedupe)
    dup = api_server.post("/jobs", email(**dedupe))
    assert dup.status == 409
    assert dup.json["existing_id"] == first["id"]
    assert dup.json["details"] == {"existing_id": first["id"]}

    def accepted() -> dict[str, Any] | None:
        resp = api_server.post("/jobs", email(**dedupe))
        assert resp.status in (201, 409), resp.body
        return resp.json if resp.status == 201 else None

    later = wait_until(accepted, "the dedupe window to end", timeout=5)
    assert later["id"] != first["id"]
    assert api_server.job_count() == 2


def test_cancel_pending_then_again_is_409(api_server: ApiServer) -> None:
    job = enqueue(api_server)
    resp = api_server.delete(f"/jobs/{job['id']}")
    assert resp.status == 200
    assert resp.json["status"] == "cancelled" and resp.json["id"] == job["id"]
    assert "seq" not in resp.json
    again = api_server.delete(f"/jobs/{job['id']}?force=true")
    assert again.status == 409
    assert "cancelled" in again.json["error"]
    assert again.json["details"] == {"status": "cancelled"}


def test_cancel_running_needs_force(api_server: ApiServer) -> None:
    job = enqueue(api_server)
    store = api_server.store
    assert store is not None
    api_server.call(store.claim(1, None, {"email": 1}))
    refused = api_server.delete(f"/jobs/{job['id']}")
    assert refused.status == 409 and refused.json["details"] == {"status": "running"}
    forced = api_server.delete(f"/jobs/{job['id']}?force=1")
    assert forced.status == 200 and forced.json["status"] == "cancelled"


# -- auth ------------------------------------------------------------------------------


def test_api_key_guards_every_route_but_probes_metrics_and_the_dashboard(
    make_api_server: Any,
) -> None:
    server = make_api_server(api_key="s3cret")
    for headers in ({}, {"X-API-Key": "wrong"}, {"X-API-Key": "S3CRET"}, {"X-API-Key": "é"}):
        resp = server.post("/jobs", email(), headers=headers)
        assert resp.status == 401, headers
        assert resp.json["details"] == {"header": "X-API-Key"}
    key = {"X-API-Key": "s3cret"}
    job = server.post("/jobs", email(), headers=key)
    assert job.status == 201
    assert server.delete(f"/jobs/{job.json['id']}").status == 401
    assert server.post("/queues/default/pause").status == 401
    for path in ("/jobs", f"/jobs/{job.json['id']}", "/stats", "/dlq", "/openapi.json"):
        assert server.get(path).status == 401, path  # payloads and results are private
        assert server.get(path, headers=key).status == 200, path
    for path in ("/health", "/metrics", "/ui/"):
        assert server.get(path).status == 200, path
    assert server.get("/ready").status == 503  # no worker: open, just not ready
    assert server.job_count() == 1
    assert server.get(f"/jobs/{job.json['id']}", headers=key).json["status"] == "pending"
    paths = server.get("/openapi.json", headers=key).json["paths"]
    assert paths["/jobs"]["post"]["security"] == [{"ApiKey": []}]
    assert paths["/jobs"]["get"]["security"] == [{"ApiKey": []}]
    assert "401" in paths["/jobs"]["get"]["responses"]
    assert "security" not in paths["/health"]["get"]


def test_public_reads_let_reads_through_without_the_key(make_api_server: Any) -> None:
    server = make_api_server(api_key="s3cret", public_reads=True)
    assert server.get("/jobs").status == 200
    assert server.get("/stats").status == 200
    assert server.post("/jobs", email()).status == 401
    assert server.post("/jobs", email(), headers={"X-API-Key": "s3cret"}).status == 201
    paths = server.get("/openapi.json").json["paths"]
    assert "security" not in paths["/jobs"]["get"]
    assert paths["/jobs"]["post"]["security"] == [{"ApiKey": []}]


# -- lists -----------------------------------------------------------------------------


def test_list_is_newest_first_paginated_and_filtered(api_server: ApiServer) -> None:
    ids = [enqueue(api_server, queue="a" if i % 2 else "b")["id"] for i in range(5)]
    report = api_server.post("/jobs", {"type": "report"}).json["id"]
    api_server.delete(f"/jobs/{ids[0]}")
    everything = api_server.get("/jobs").json
    assert [j["id"] for j in everything["jobs"]] == [report, *reversed(ids)]
    assert (everything["total"], everything["limit"], everything["offset"]) == (6, 50, 0)
    assert all("seq" not in j for j in everything["jobs"])
    page = api_server.get("/jobs?limit=2&offset=1").json
    assert [j["id"] for j in page["jobs"]] == [ids[4], ids[3]]
    assert (page["total"], page["limit"], page["offset"]) == (6, 2, 1)
    assert api_server.get("/jobs?offset=100").json["jobs"] == []
    only = api_server.get("/jobs?type=report").json
    assert [j["id"] for j in only["jobs"]] == [report] and only["total"] == 1
    queue_a = api_server.get("/jobs?queue=a").json
    assert [j["id"] for j in queue_a["jobs"]] == [ids[3], ids[1]]
    cancelled = api_server.get("/jobs?status=cancelled&type=email").json
    assert [j["id"] for j in cancelled["jobs"]] == [ids[0]]
    assert api_server.get("/jobs?status=done").json == {
        "jobs": [],
        "total": 0,
        "limit": 50,
        "offset": 0,
    }


def test_events_show_the_audit_trail(api_server: ApiServer) -> None:
    job = enqueue(api_server)
    api_server.delete(f"/jobs/{job['id']}")
    events = api_server.get(f"/jobs/{job['id']}/events")
    assert events.status == 200
    assert [e["event"] for e in events.json["events"]] == ["enqueued", "cancelled"]
    assert events.json["events"][0]["job_id"] == job["id"]


# -- batch -----------------------------------------------------------------------------


def test_batch_answers_each_job_on_its_own(api_server: ApiServer) -> None:
    dedupe = {"dedupe_key": "once", "dedupe_window_seconds": 60}
    resp = api_server.post(
        "/jobs/batch",
        {
            "jobs": [
                email(),
                {"type": "nope"},
                email(**dedupe),
                email(**dedupe),
                {"type": "report", "on_success": {"type": "gone"}},
                {"type": "report"},
            ]
        },
    )
    assert resp.status == 200, resp.body
    results = resp.json["results"]
    assert [r["status"] for r in results] == [201, 400, 201, 409, 400, 201]
    assert results[1]["details"]["field"] == "jobs[1].type"
    assert "nope" in results[1]["error"]
    assert results[3]["existing_id"] == results[2]["job"]["id"]
    assert results[4]["details"]["field"] == "jobs[4].on_success.type"
    assert all("seq" not in r["job"] for r in results if r["status"] == 201)
    assert set(results[0]) == {"status", "job"}
    assert api_server.job_count() == 3


def test_batch_reports_a_full_queue_per_job(make_api_server: Any) -> None:
    server = make_api_server(max_pending=2)
    resp = server.post("/jobs/batch", {"jobs": [email(), email(), email()]})
    assert resp.status == 200
    assert [r["status"] for r in resp.json["results"]] == [201, 201, 503]
    full = server.post("/jobs", email())
    assert full.status == 503 and "retry-after" in full.headers
    assert server.job_count() == 2


def test_batch_refuses_an_idempotency_key(api_server: ApiServer) -> None:
    resp = api_server.post("/jobs/batch", {"jobs": [email()]}, headers={"Idempotency-Key": "k"})
    assert resp.status == 400 and resp.json["details"] == {"header": "Idempotency-Key"}
    assert api_server.job_count() == 0


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"jobs": []}, "jobs"),
        ({"jobs": [email()] * 1001}, "jobs"),
        ({"jobs": [email()], "extra": 1}, "extra"),
        ({"jobs": "none"}, "jobs"),
        ({}, "jobs"),
    ],
)
def test_bad_batch_envelopes_are_refused_whole(
    api_server: ApiServer, body: Any, field: str
) -> None:
    resp = api_server.post("/jobs/batch", body)
    assert resp.status == 400, resp.body
    assert resp.json["details"]["field"] == field
    assert api_server.job_count() == 0


@pytest.mark.parametrize(
    ("item", "field"),
    [
        ({"type": "email", "priority": 11}, "jobs[1].priority"),
        (email(dedupe_key="k"), "jobs[1].dedupe_window_seconds"),
        ({"type": "email", "surprise": 1}, "jobs[1].surprise"),
        ("not an object", "jobs[1]"),
        (
            {"type": "email", "on_success": {"type": "email", "queue": "a b"}},
            "jobs[1].on_success.queue",
        ),
    ],
)
def test_bad_batch_items_are_refused_alone(api_server: ApiServer, item: Any, field: str) -> None:
    resp = api_server.post("/jobs/batch", {"jobs": [email(), item, email()]})
    assert resp.status == 200, resp.body
    results = resp.json["results"]
    assert [r["status"] for r in results] == [201, 400, 201]
    assert results[1]["details"]["field"] == field and "job" not in results[1]
    assert api_server.job_count() == 2


# -- stats and queues ------------------------------------------------------------------


def test_stats_shape(api_server: ApiServer) -> None:
    enqueue(api_server, priority=9)
    enqueue(api_server, queue="mail")
    stats = api_server.get("/stats")
    assert stats.status == 200
    body = stats.json
    assert set(body) == {"counts", "queues", "dead_letters", "workers"}
    assert body["counts"]["pending"] == 2 and body["counts"]["done"] == 0
    assert body["queues"] == {"default": {"9": 1}, "mail": {"5": 1}}
    assert body["dead_letters"] == 0
    assert body["workers"] == {"busy": 0, "idle": 0, "booting": 0, "stopping": 0}


def test_queue_stats_pause_and_resume(api_server: ApiServer) -> None:
    enqueue(api_server, queue="mail", priority=3)
    stats = api_server.get("/queues/mail/stats")
    assert stats.status == 200
    assert stats.json["queue"] == "mail" and stats.json["paused"] is False
    assert stats.json["counts"]["pending"] == 1
    assert stats.json["depth_by_priority"] == {"3": 1}
    paused = api_server.post("/queues/mail/pause")
    assert paused.status == 200 and paused.json["paused"] is True
    assert api_server.get("/queues/mail/stats").json["paused"] is True
    store = api_server.store
    assert store is not None
    assert api_server.call(store.claim(5, None, {"email": 5})) == []  # paused: nothing due
    resumed = api_server.post("/queues/mail/resume")
    assert resumed.status == 200 and resumed.json["paused"] is False
    empty = api_server.get("/queues/never-used/stats").json
    assert sum(empty["counts"].values()) == 0


# -- ops -------------------------------------------------------------------------------


def test_health_ready_and_draining(api_server: ApiServer) -> None:
    assert api_server.get("/health").json == {"status": "ok"}
    no_workers = api_server.get("/ready")
    assert no_workers.status == 503
    checks = {"store": True, "workers": False, "accepting": True, "auth": True}
    assert no_workers.json["checks"] == checks  # auth: loopback, so no key is needed
    assert "workers" in no_workers.json["error"]

    engine = api_server.engine
    assert engine is not None
    api_server.sync(lambda: engine.pool.spawn(1))  # one real (empty) worker process
    wait_until(lambda: api_server.sync(lambda: engine.pool.count(WorkerState.IDLE)), "a worker", 30)
    ready = api_server.get("/ready")
    assert ready.status == 200
    assert ready.json == {
        "status": "ready",
        "checks": {"store": True, "workers": True, "accepting": True, "auth": True},
    }
    job = enqueue(api_server)
    letter = make_dead_letter(api_server)

    def drain() -> None:
        assert api_server.node is not None
        api_server.node.lifecycle.enter(NodePhase.DRAINING)

    api_server.sync(drain)
    draining = api_server.get("/ready")
    assert draining.status == 503
    assert draining.json["checks"]["accepting"] is False
    assert draining.json["status"] == "not_ready"
    refused = api_server.post("/jobs", email())
    assert refused.status == 503 and "shutting down" in refused.json["error"]
    assert api_server.post("/jobs/batch", {"jobs": [email()]}).status == 503
    assert api_server.post(f"/dlq/{letter}/replay").status == 503
    assert api_server.get(f"/jobs/{job['id']}").status == 200
    assert api_server.get("/jobs").status == 200
    assert api_server.get("/stats").status == 200
    assert api_server.get("/health").status == 200
    assert api_server.job_count() == 2


def metric_samples(server: ApiServer, name: str) -> list[Any]:
    """Samples of one metric from GET /metrics, parsed by prometheus-client."""
    resp = server.get("/metrics")
    assert resp.status == 200
    assert resp.headers["content-type"].startswith("text/plain")
    families = text_string_to_metric_families(resp.body.decode())
    return [s for f in families for s in f.samples if s.name == name]


def test_metrics_count_requests_by_route_template(api_server: ApiServer) -> None:
    job = enqueue(api_server)
    api_server.get(f"/jobs/{job['id']}")
    api_server.get(f"/jobs/{job['id']}")
    api_server.get(f"/jobs/{UNKNOWN_ID}")
    api_server.get("/no/such/route")
    api_server.request("PUT", "/jobs")
    samples = metric_samples(api_server, "goqueue_http_requests_total")
    counts = {(s.labels["route"], s.labels["method"], s.labels["status"]): s.value for s in samples}
    assert counts[("/jobs", "POST", "201")] == 1
    assert counts[("/jobs/{id}", "GET", "200")] == 2
    assert counts[("/jobs/{id}", "GET", "404")] == 1
    assert counts[("unmatched", "GET", "404")] == 1
    assert counts[("unmatched", "PUT", "405")] == 1
    assert not any(job["id"] in route or "/no/" in route for route, _, _ in counts)
    assert not any(status == "500" for _, _, status in counts)
    seconds = metric_samples(api_server, "goqueue_http_request_duration_seconds_count")
    assert any(s.labels["route"] == "/jobs/{id}" and s.value == 3 for s in seconds)


def test_unknown_routes_and_methods_answer_json(api_server: ApiServer) -> None:
    missing = api_server.get("/nope")
    assert missing.status == 404
    assert missing.json == {"error": "no route for GET /nope", "details": None}
    wrong = api_server.request("PUT", "/jobs")
    assert wrong.status == 405
    assert set(wrong.json["details"]["allowed"]) >= {"GET", "POST"}
    assert "POST" in wrong.headers["allow"]


def test_openapi_describes_every_route(api_server: ApiServer) -> None:
    resp = api_server.get("/openapi.json")
    assert resp.status == 200
    doc = resp.json
    assert doc["openapi"].startswith("3.1")
    assert api_server.runner is not None
    router = api_server.runner.app.router
    served = {
        (r.resource.canonical, r.method.lower())
        for r in router.routes()
        if r.method != "HEAD" and r.resource is not None
    }
    documented = {(path, method) for path, ops in doc["paths"].items() for method in ops}
    assert documented == served
    # 22 (deliveries, bulk dead letters, bulk cancel) + summaries (6), dashboard (2),
    # schedules (3), workflows (4)
    assert len(served) == 38
    schemas = doc["components"]["schemas"]
    bulk_cancel = doc["paths"]["/jobs/cancel"]["post"]
    assert bulk_cancel["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/BulkCancelRequest"
    }
    assert set(schemas["BulkCancelRequest"]["properties"]) == {
        "queue", "type", "status", "created_before", "limit", "force", "all"
    }  # fmt: skip
    assert set(bulk_cancel["responses"]) >= {"200", "400", "503"}
    refs = set(re.findall(r'"#/components/schemas/([^"]+)"', resp.body.decode()))
    assert refs <= set(schemas)
    assert "seq" not in schemas["Job"]["properties"]
    assert schemas["Error"]["required"] == ["error"]
    enqueue_op = doc["paths"]["/jobs"]["post"]
    assert enqueue_op["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/JobSpec"
    }
    assert {"201", "200", "400", "409", "413", "422", "503"} <= set(enqueue_op["responses"])
    listing = {p["name"] for p in doc["paths"]["/jobs"]["get"]["parameters"]}
    assert listing == {"type", "status", "queue", "concurrency_key", "limit", "offset"}
    get_op = doc["paths"]["/jobs/{id}"]["get"]
    assert get_op["parameters"][0] == {
        "name": "id",
        "in": "path",
        "required": True,
        "schema": {"type": "string", "format": "uuid"},
    }


def test_answers_match_the_openapi_schemas(api_server: ApiServer) -> None:
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema checks answers vs docs")
    doc = api_server.get("/openapi.json").json

    def check(method: str, route: str, path: str, body: Any = None) -> Any:
        resp = api_server.request(method, path, body)
        documented = doc["paths"][route][method.lower()]["responses"]
        answer = documented.get(str(resp.status), documented["default"])
        schema = answer["content"]["application/json"]["schema"]
        root = {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}
        root["components"] = doc["components"]
        jsonschema.Draft202012Validator(root).validate(resp.json)
        return resp.json

    job = check("POST", "/jobs", "/jobs", email(on_success={"type": "report"}))
    check("POST", "/jobs", "/jobs", {"type": "email", "priority": 11})
    check("POST", "/jobs/batch", "/jobs/batch", {"jobs": [email(), {"type": "nope"}]})
    check("GET", "/jobs", "/jobs?limit=5")
    check("GET", "/jobs/{id}", f"/jobs/{job['id']}")
    check("GET", "/jobs/{id}", f"/jobs/{UNKNOWN_ID}")
    check("GET", "/jobs/{id}/events", f"/jobs/{job['id']}/events")
    letter = make_dead_letter(api_server)
    check("GET", "/dlq", "/dlq")
    check("GET", "/dlq/{id}", f"/dlq/{letter}")
    check("POST", "/dlq/{id}/replay", f"/dlq/{letter}/replay")
    check("DELETE", "/jobs/{id}", f"/jobs/{job['id']}")
    check("DELETE", "/jobs/{id}", f"/jobs/{job['id']}")
    check("GET", "/stats", "/stats")
    check("GET", "/queues/{name}/stats", "/queues/default/stats")
    check("POST", "/queues/{name}/pause", "/queues/default/pause")
    check("GET", "/health", "/health")
    check("GET", "/ready", "/ready")
    validator = pytest.importorskip("openapi_spec_validator", reason="validates the document")
    validator.validate(doc)


# -- dead letters ----------------------------------------------------------------------


def test_dead_letters_list_show_replay_purge(api_server: ApiServer) -> None:
    letter = make_dead_letter(api_server)
    listing = api_server.get("/dlq")
    assert listing.status == 200
    body = listing.json
    assert (body["total"], body["limit"], body["offset"]) == (1, 50, 0)
    [dead] = body["dead_letters"]
    assert dead["id"] == letter
    assert dead["job"]["status"] == "failed" and "seq" not in dead["job"]
    assert [e["error"] for e in dead["errors"]] == ["boom"]
    shown = api_server.get(f"/dlq/{letter}")
    assert shown.status == 200 and shown.json == dead
    assert api_server.get(f"/jobs/{dead['job_id']}").json["status"] == "failed"

    replay = api_server.post(f"/dlq/{letter}/replay")
    assert replay.status == 201
    fresh = replay.json
    assert replay.headers["location"] == f"/jobs/{fresh['id']}"
    assert fresh["id"] != dead["job_id"] and fresh["status"] == "pending"
    assert fresh["payload"] == dead["job"]["payload"]
    assert api_server.get(f"/dlq/{letter}").status == 404
    assert api_server.post(f"/dlq/{letter}/replay").status == 404
    assert api_server.get("/dlq").json["total"] == 0

    other = make_dead_letter(api_server)
    purged = api_server.delete(f"/dlq/{other}")
    assert purged.status == 200 and purged.json == {"purged": other}
    assert api_server.delete(f"/dlq/{other}").status == 404
    assert api_server.get("/stats").json["dead_letters"] == 0


# -- pieces ----------------------------------------------------------------------------


def test_job_out_shows_every_job_field_but_seq() -> None:
    job_fields = [f.name for f in msgspec.structs.fields(Job) if f.name not in HIDDEN_JOB_FIELDS]
    assert list(JobOut.__struct_fields__) == [*job_fields, *LIVE_JOB_FIELDS]


def test_the_documented_statuses_are_the_status_enum(api_server: ApiServer) -> None:
    # JobOut.status is the Status enum itself: the served document lists its values
    doc = api_server.get("/openapi.json").json
    schemas = doc["components"]["schemas"]
    assert schemas["Job"]["properties"]["status"] == {"$ref": "#/components/schemas/Status"}
    assert sorted(schemas["Status"]["enum"]) == sorted(status.value for status in Status)


def test_a_hung_store_call_becomes_503() -> None:
    with pytest.raises(StoreUnavailable, match=r"did not answer within 0\.05 s"):
        asyncio.run(within(asyncio.sleep(5), 0.05))

    async def answers_after_a_wait() -> str:
        await asyncio.sleep(0.01)
        return "stored"

    assert asyncio.run(within(answers_after_a_wait(), 5)) == "stored"

    async def hangs_after_its_first_step() -> None:
        await asyncio.sleep(0)
        await asyncio.sleep(5)

    with pytest.raises(StoreUnavailable, match=r"did not answer within 0\.05 s"):
        asyncio.run(within(hangs_after_its_first_step(), 0.05))


def test_a_store_call_that_answers_without_waiting_arms_no_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_timer(seconds: float) -> None:
        raise AssertionError("a call that cannot hang was timed")

    async def answers_at_once() -> str:
        return "stored"

    monkeypatch.setattr(asyncio, "timeout", no_timer)
    assert asyncio.run(within(answers_at_once(), 5)) == "stored"
    error = from_domain(StoreUnavailable("database down"))
    assert error is not None
    resp = error.response()
    assert resp.status == 503 and "Retry-After" in resp.headers


def test_an_unexpected_error_is_a_logged_counted_json_500(
    caplog: pytest.LogCaptureFixture,
) -> None:
    metrics = Metrics()

    async def broken(request: web.Request) -> web.Response:
        raise RuntimeError("kaput")

    async def scenario() -> tuple[int, Any]:
        app = web.Application(middlewares=[front_middleware(metrics, 1024)])
        app.router.add_get("/broken/{id}", broken)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        try:
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            url = f"http://127.0.0.1:{runner.addresses[0][1]}/broken/1"
            async with aiohttp.ClientSession() as session, session.get(url) as resp:
                return resp.status, await resp.json()
        finally:
            await runner.cleanup()

    with caplog.at_level(logging.ERROR, logger="goqueue.api"):
        status, body = asyncio.run(scenario())
    assert (status, body) == (500, {"error": "internal server error", "details": None})
    [record] = [r for r in caplog.records if r.name == "goqueue.api"]
    assert record.exc_info is not None and "kaput" in str(record.exc_info[1])
    assert record.route == "/broken/{id}"  # type: ignore[attr-defined]
    value = metrics.registry.get_sample_value(
        "goqueue_http_requests_total", {"route": "/broken/{id}", "method": "GET", "status": "500"}
    )
    assert value == 1


# -- fuzz ------------------------------------------------------------------------------

FIELDS = [f.name for f in msgspec.structs.fields(JobSpec) if f.name != "type"]
scalars = st.none() | st.booleans() | st.integers(-20, 20) | st.floats() | st.text(max_size=20)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)
seconds = st.none() | st.floats(-1, 100) | st.integers(-1, 100)
# Values near each field's rules, so that valid jobs (201) are drawn as well as invalid ones.
plausible: dict[str, st.SearchStrategy[Any]] = {
    "queue": st.sampled_from(["default", "q.1", "", "a b", "x" * 201]),
    "priority": st.integers(-2, 12),
    "max_retries": st.none() | st.integers(-1, 101),
    "run_at": st.none() | st.sampled_from(["2030-01-01T00:00:00Z", "2030-01-01T00:00", "now"]),
    "delay_seconds": seconds,
    "timeout_seconds": seconds,
    "dedupe_key": st.none() | st.text(max_size=4),
    "dedupe_window_seconds": seconds,
    "webhook_url": st.none() | st.sampled_from(["http://127.0.0.1:9/hook", "ftp://x", ""]),
    "on_success": st.none() | st.fixed_dictionaries({"type": st.sampled_from(["report", "no"])}),
}
near_valid_jobs = st.fixed_dictionaries(
    {"type": st.sampled_from(["email", "report"])}, optional=plausible
)
wild_jobs = st.fixed_dictionaries(
    {"type": st.sampled_from(["email", "report", "nope", ""])},
    optional={name: json_values for name in FIELDS},
) | st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=10), json_values, max_size=5)
job_objects = near_valid_jobs | wild_jobs


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(body=job_objects, junk=st.binary(max_size=64), segment=st.text(max_size=40))
def test_fuzzed_requests_never_5xx_and_only_201_stores(
    api_server: ApiServer, body: dict[str, Any], junk: bytes, segment: str
) -> None:
    for raw in (json.dumps(body, allow_nan=True).encode(), junk):
        before = api_server.job_count()
        resp = api_server.post("/jobs", raw=raw)
        assert resp.status < 500, (raw, resp.body)
        event(f"POST /jobs -> {resp.status}")
        assert api_server.job_count() == before + (resp.status == 201)
    before = api_server.job_count()
    part = quote(segment, safe="")
    for method, path in (
        ("GET", f"/jobs/{part}"),
        ("DELETE", f"/jobs/{part}"),
        ("GET", f"/jobs/{part}/events"),
        ("GET", f"/dlq/{part}"),
        ("POST", f"/dlq/{part}/replay"),
        ("DELETE", f"/dlq/{part}"),
    ):
        resp = api_server.request(method, path)
        assert 400 <= resp.status < 500, (method, path, resp.body)
        assert resp.json["error"]
    assert api_server.job_count() == before


def test_a_job_shows_its_effective_timeout_and_where_it_comes_from(api_server: ApiServer) -> None:
    own = enqueue(api_server, timeout_seconds=7)
    resp = api_server.post("/jobs", {"type": "report", "payload": {}})
    assert resp.status == 201, resp.body
    by_actor = resp.json
    by_node = enqueue(api_server)  # email declares no timeout
    assert own["timeout"] == {"seconds": 7.0, "source": "job"}  # as GET shows it
    answers = {
        job["id"]: api_server.get(f"/jobs/{job['id']}").json for job in (own, by_actor, by_node)
    }
    assert answers[own["id"]]["timeout"] == {"seconds": 7.0, "source": "job"}
    assert answers[by_actor["id"]]["timeout"] == {"seconds": 60.0, "source": "actor"}
    assert answers[by_node["id"]]["timeout"]["source"] == "node"
    assert answers[by_node["id"]]["timeout"]["seconds"] > 0
