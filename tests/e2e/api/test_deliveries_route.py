"""`GET /jobs/{id}/deliveries` over a real app (in-memory store), and the webhook body
against the API's own view of a job. The only receiver is a closed loopback port: the
attempts fail to connect, and nothing leaves the machine."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import msgspec
import pytest
from goqueue.api.http.replies import encode, job_out
from goqueue.supervisor.common.deliveries import job_body
from goqueue.supervisor.common.enums import Status
from goqueue.supervisor.common.jobs import AttemptError, Job, JobSpec

from tests.e2e.api.conftest import ApiServer, wait_until

pytestmark = pytest.mark.timeout(60)


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://user:pw@127.0.0.1:{port}/hook?token=secret"


def test_deliveries_of_a_cancelled_job_match_the_openapi_schema(
    make_api_server: Callable[..., ApiServer],
) -> None:
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema checks answers vs docs")
    server = make_api_server(webhook_allow_hosts=("127.0.0.1",))
    url = closed_port_url()
    job = server.post("/jobs", {"type": "email", "webhook_url": url}).json
    assert server.get(f"/jobs/{job['id']}/deliveries").json == {"deliveries": []}
    assert server.delete(f"/jobs/{job['id']}").status == 200  # cancelling fires it too

    def attempted() -> list[dict]:
        found = server.get(f"/jobs/{job['id']}/deliveries").json["deliveries"]
        return found if found and found[0]["attempts"] else []

    [delivery] = wait_until(attempted, "a first attempt")
    assert delivery["event"] == "job.cancelled"
    assert delivery["url"] == url.replace("user:pw@", "").split("?")[0]  # no secrets shown
    [attempt, *_] = delivery["attempts"]
    assert attempt["status_code"] is None and "Connect" in attempt["error"]
    assert delivery["next_attempt_at"] is not None and not delivery["given_up"]

    doc = server.get("/openapi.json").json
    answer = doc["paths"]["/jobs/{id}/deliveries"]["get"]["responses"]["200"]
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        **answer["content"]["application/json"]["schema"],
        "components": doc["components"],
    }
    jsonschema.Draft202012Validator(schema).validate({"deliveries": [delivery]})


def test_an_unknown_job_has_no_deliveries_route_answer(
    make_api_server: Callable[..., ApiServer],
) -> None:
    server = make_api_server()
    resp = server.get("/jobs/6f1c2a9e-0000-4000-8000-000000000001/deliveries")
    assert resp.status == 404 and "not found" in resp.json["error"]


def test_a_refused_webhook_url_is_a_400_naming_the_field_and_stores_nothing(
    make_api_server: Callable[..., ApiServer],
) -> None:
    server = make_api_server()
    before = server.job_count()
    for url in ("http://127.0.0.1:9/hook", "http://[::1]/", "http://localhost/"):
        resp = server.post("/jobs", {"type": "email", "webhook_url": url})
        assert resp.status == 400 and resp.json["details"] == {"field": "webhook_url"}
    opened = make_api_server(webhook_allow_networks=("127.0.0.0/8",))
    assert opened.post("/jobs", {"type": "email", "webhook_url": "http://127.0.0.2/"}).status == 201
    assert server.job_count() == before


def test_the_webhook_body_is_the_job_as_the_api_shows_it() -> None:
    at = datetime(2030, 1, 31, 9, 0, 1, 234500, tzinfo=UTC)
    job = Job.from_spec(
        JobSpec(
            type="email",
            payload=msgspec.Raw(b'{"to":  "a@example.com"}'),
            webhook_url="https://hooks.example.com/x",
            on_failure=JobSpec(type="report"),
        ),
        now=at,
        max_retries=2,
    )
    job.status, job.attempts, job.seq = Status.FAILED, 3, 42
    job.errors = (AttemptError(attempt=3, error="boom", at=at + timedelta(seconds=1)),)
    job.finished_at = job.updated_at = at.replace(microsecond=0)
    assert job_body(job) == encode(job_out(job))
    assert "seq" not in json.loads(job_body(job))
