"""Hostile input against a live node, on both stores: every request below was once a 500,
a poisoned read or a silently different answer per store. Each is now a clean 4xx naming
what is wrong (or, for NUL in a payload, stored faithfully), and a refusal changes nothing.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import pytest
from goqueue.api.http.replies import STORE_UNAVAILABLE, from_domain
from goqueue.supervisor.common.errors import StoreUnavailable

from tests.conftest import Node, wait_for
from tests.e2e.api.hostile import Raw, send, state

pytestmark = pytest.mark.timeout(120)

NOBODY = ("--queues", "served-by-nobody", "--workers", "1")  # nothing runs: state is stable


def job(**fields: Any) -> dict[str, Any]:
    return {"type": "noop", "queue": "held", **fields}


def encoded(value: Any) -> bytes:
    return json.dumps(value).encode()


def with_bytes(value: Any, marker: str, raw: bytes) -> bytes:
    """`value` as JSON with the string `marker` replaced by raw (invalid) bytes."""
    return encoded(value).replace(marker.encode(), raw)


def refused(node: Node, method: str, path: str, expect: int, **kw: Any) -> Raw:
    """Send a request that must be refused with `expect` and change nothing."""
    before = state(node.url)
    resp = send(node.url, method, path, **kw)
    assert resp.status == expect, (method, path, resp.status, resp.body)
    assert resp.json["error"], resp.body
    assert state(node.url) == before, (method, path)
    return resp


# -- invalid UTF-8 -----------------------------------------------------------------------

BAD = b"\xff"
INVALID_UTF8_BODIES = [
    (with_bytes(job(payload="@@"), "@@", BAD), "payload"),
    (with_bytes(job(payload={"@@": 1}), "@@", b"k" + BAD), "payload"),
    (with_bytes(job(payload={"a": [1, {"b": "@@"}]}), "@@", BAD), "payload.a[1].b"),
    (with_bytes(job(type="@@"), "@@", BAD), "type"),
    (with_bytes(job(queue="@@"), "@@", BAD), "queue"),
    (with_bytes(job(dedupe_key="@@", dedupe_window_seconds=5), "@@", BAD), "dedupe_key"),
    (with_bytes(job(webhook_url="http://127.0.0.1/@@"), "@@", BAD), "webhook_url"),
    (with_bytes(job(on_success=job(payload="@@")), "@@", b"\xc0\xaf"), "on_success.payload"),
    (with_bytes(job(payload="@@"), "@@", b"\xed\xa0\x80"), "payload"),  # an encoded surrogate
    (with_bytes(job(**{"@@": 1}), "@@", BAD), None),  # an unknown key, itself undecodable
]


def test_invalid_utf8_anywhere_in_a_job_is_a_400_naming_the_field(
    make_store_node: Callable[..., Node],
) -> None:
    node = make_store_node(*NOBODY)
    assert node.post("/queues/held/pause").status == 200
    for body, field in INVALID_UTF8_BODIES:
        resp = refused(node, "POST", "/jobs", 400, body=body)
        assert (resp.json["details"] or {}).get("field") == field, (body, resp.json)
        assert "UTF-8" in resp.json["error"], resp.json
    # the node still answers reads as JSON: nothing undecodable was stored
    assert send(node.url, "GET", "/jobs").json["total"] == 0


def test_invalid_utf8_in_headers_query_and_paths_is_a_400_never_a_500(
    make_store_node: Callable[..., Node],
) -> None:
    node = make_store_node(*NOBODY)
    body = encoded(job())
    for key in (b"k\xff", b"\xc3", b"tab\there"):
        resp = refused(node, "POST", "/jobs", 400, body=body, headers=[("Idempotency-Key", key)])
        assert resp.json["details"] == {"header": "Idempotency-Key"}, key
    for key in (b"a\x01b", b"nul\x00"):  # refused by aiohttp's parser: still our format
        resp = refused(node, "POST", "/jobs", 400, body=body, headers=[("Idempotency-Key", key)])
        assert resp.json["error"].startswith("malformed request"), resp.json
        assert resp.headers["content-type"].startswith("application/json")
    for path, parameter in [
        ("/jobs?type=%FF", "type"),
        ("/jobs?queue=a%00b", "queue"),
        ("/jobs?b%FFad=1", "b\\xffad"),
        ("/summary/dlq?error=%00", "error"),  # was a 500 on PostgreSQL (NUL in a LIKE)
        ("/summary/dlq?error=%ED%A0%80", "error"),
        ("/summary/jobs?queue=%C0%AF", "queue"),
        ("/dlq?limit=1%FF", "limit"),
    ]:
        resp = refused(node, "GET", path, 400)
        assert resp.json["details"] == {"parameter": parameter}, (path, resp.json)
    for method, path in [
        ("GET", "/jobs/%FF"),
        ("DELETE", "/jobs/%00"),
        ("GET", "/jobs/%ED%A0%80/events"),
        ("POST", "/dlq/%FF/replay"),
        ("POST", "/queues/%FF/pause"),
        ("POST", "/queues/a%00/resume"),
        ("GET", "/queues/%C3/stats"),
    ]:
        resp = refused(node, method, path, 400)
        assert resp.json["details"]["parameter"] in {"id", "name"}, (path, resp.json)
    for path in ("/no/such/%FF", "/ui/%FF%00", "/jobs/%FF/nothing"):
        assert refused(node, "GET", path, 404).json["error"]


# -- NUL characters ----------------------------------------------------------------------


def test_nul_in_a_payload_is_stored_faithfully_and_refused_in_keys_and_urls(
    make_store_node: Callable[..., Node],
) -> None:
    node = make_store_node(*NOBODY)
    payload = {"text": "a\x00b", "k\x00": ["\x00"]}
    created = node.post("/jobs", job(payload=payload))
    assert created.status == 201, created
    assert created.body["payload"] == payload
    assert node.get(f"/jobs/{created.body['id']}").body["payload"] == payload
    assert node.get("/jobs").body["jobs"][0]["payload"] == payload
    summary = node.get("/summary/jobs?preview=100").body["jobs"][0]
    assert "\\u0000" in summary["payload"]["text"], summary
    for fields, field in [
        ({"dedupe_key": "a\x00b", "dedupe_window_seconds": 5}, "dedupe_key"),
        ({"webhook_url": "http://127.0.0.1/\x00"}, "webhook_url"),
        ({"on_failure": job(dedupe_key="\x00", dedupe_window_seconds=5)}, "on_failure.dedupe_key"),
        ({"queue": "a\x00"}, "queue"),
        ({"type": "noop\x00"}, "type"),
    ]:
        resp = refused(node, "POST", "/jobs", 400, body=encoded(job(**fields)))
        assert resp.json["details"]["field"] == field, resp.json


# -- batches -----------------------------------------------------------------------------


def test_a_batch_answers_each_item_on_its_own(make_store_node: Callable[..., Node]) -> None:
    node = make_store_node(*NOBODY)
    dedupe = {"dedupe_key": "once", "dedupe_window_seconds": 60}
    items = [
        encoded(job(payload=1)),
        encoded(job(priority=99)),
        with_bytes(job(payload="@@"), "@@", BAD),
        encoded(job(type="no-such-actor")),
        encoded(job(dedupe_key="\x00", dedupe_window_seconds=5)),
        encoded(job(**dedupe)),
        encoded(job(**dedupe)),
        b'"not a job"',
        encoded(job(payload=2)),
    ]
    body = b'{"jobs": [' + b", ".join(items) + b"]}"
    resp = send(node.url, "POST", "/jobs/batch", body=body)
    assert resp.status == 200, resp.body
    results = resp.json["results"]
    assert [r["status"] for r in results] == [201, 400, 400, 400, 400, 201, 409, 400, 201]
    fields = [r.get("details", {}).get("field") for r in results]
    assert fields[1:5] == [
        "jobs[1].priority",
        "jobs[2].payload",
        "jobs[3].type",
        "jobs[4].dedupe_key",
    ]
    assert fields[7] == "jobs[7]"
    assert results[6]["existing_id"] == results[5]["job"]["id"]
    stored = {r["job"]["id"] for r in results if r["status"] == 201}
    listed = node.get("/jobs").body
    assert {j["id"] for j in listed["jobs"]} == stored and listed["total"] == 3
    for envelope in (b'{"jobs": [', b'{"jobs": {}}', b'{"jobs": []}', b'{"j\xffobs": [{}]}', b"[]"):
        refused(node, "POST", "/jobs/batch", 400, body=envelope)


# -- idempotency -------------------------------------------------------------------------


def test_an_idempotent_repeat_is_the_parsed_request_not_its_bytes(
    make_store_node: Callable[..., Node],
) -> None:
    node = make_store_node(*NOBODY)
    key = [("Idempotency-Key", "order-17")]
    first = job(payload={"a": 1, "b": [1.5, "é"]}, priority=3)
    created = send(node.url, "POST", "/jobs", body=encoded(first), headers=key)
    assert created.status == 201
    same = [
        json.dumps(first, indent=3).encode(),
        json.dumps(dict(reversed(first.items())), ensure_ascii=False).encode(),
        b'{"queue":"held","priority":3,"type":"noop","payload":{"b":[15e-1,"\\u00e9"],"a":1}}',
        encoded({**first, "max_retries": None}),  # the default, spelt out
    ]
    for body in same:
        repeat = send(node.url, "POST", "/jobs", body=body, headers=key)
        assert repeat.status == 200, (body, repeat.body)
        assert repeat.json["id"] == created.json["id"]
    for other in (job(payload={"a": 2, "b": [1.5, "é"]}, priority=3), {**first, "priority": 4}):
        resp = refused(node, "POST", "/jobs", 422, body=encoded(other), headers=key)
        assert resp.json["details"]["existing_id"] == created.json["id"]


# -- error bodies ------------------------------------------------------------------------


def test_a_503_never_carries_the_drivers_text(caplog: pytest.LogCaptureFixture) -> None:
    driver = 'PostgreSQL unavailable: connection to server at "10.1.2.3", port 5432 failed'
    with caplog.at_level(logging.WARNING, logger="goqueue.api"):
        error = from_domain(StoreUnavailable(driver))
    assert error is not None and error.status == 503
    assert error.message == STORE_UNAVAILABLE and error.details is None
    assert b"10.1.2.3" not in error.response().body
    assert any(driver in str(getattr(r, "error", "")) for r in caplog.records)  # logged


@pytest.mark.postgres
def test_a_store_that_is_down_answers_a_plain_503(make_node: Any, pg_cluster: Any) -> None:
    node = make_node("--database-url", pg_cluster.dsn, "--workers", "1")
    pg_cluster.stop()
    try:
        wait_for(lambda: node.get("/ready").status == 503, timeout=20)
        for method, path, body in [
            ("POST", "/jobs", encoded(job())),
            ("GET", "/jobs", None),
            ("GET", "/stats", None),
            ("POST", "/queues/q/pause", None),
        ]:
            resp = send(node.url, method, path, body=body)
            assert resp.status == 503, (path, resp.body)
            assert resp.json == {"error": STORE_UNAVAILABLE, "details": None}, resp.body
            assert resp.headers.get("retry-after")
    finally:
        pg_cluster.start()
    assert "PostgreSQL unavailable" in node.logs()  # the cause is in the log
    wait_for(lambda: node.get("/ready").status == 200, timeout=60)
