"""A property-based fuzz of every route the OpenAPI document describes, against a live
`goqueue serve` on each store: path, query, header and body values drawn from the
document's own schemas, mixed with invalid UTF-8, control characters, oversized values and
junk. No answer may be a 5xx other than 503, every answer is JSON (or the metrics text),
and a refused request changes nothing (the stats, the newest jobs and the paused queues
are compared before and after).

The nodes serve a queue nobody enqueues to, so no job runs and the state changes only by
what the fuzzer's accepted requests do.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, quote_from_bytes

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import Node, postgres_dsn, start_node, stop_node
from tests.e2e.api.hostile import send, state
from tests.e2e.api.test_routes import job_objects

pytestmark = pytest.mark.timeout(600)

MAX_BODY = 65_536  # small, so oversized bodies are cheap to send
EXAMPLES = int(os.environ.get("GOQUEUE_FUZZ_EXAMPLES", "400"))


@pytest.fixture(scope="module", params=["memory", "postgres"])
def live(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Node]:
    args = ["--actors", "goqueue.actors.examples", "--queues", "served-by-nobody",
            "--workers", "1", "--max-body-bytes", str(MAX_BODY), "--max-queues", "50"]  # fmt: skip
    dsn = schema = None
    if request.param == "postgres":
        dsn, schema = postgres_dsn(), f"gq_fuzz_{uuid.uuid4().hex[:10]}"
        args += ["--database-url", dsn, "--database-schema", schema]
    node = start_node(tmp_path_factory.mktemp(f"fuzz-{request.param}"), *args)
    yield node
    stop_node(node)
    errors = [line for line in node.logs().splitlines() if '"level":"error"' in line]
    if dsn is not None:
        import psycopg

        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    assert not errors, f"the node logged errors: {errors[:3]}"


class Operations(list[tuple[str, str, dict[str, Any]]]):
    """(method, path template, OpenAPI operation) of every route; short in a report."""

    def __repr__(self) -> str:
        return f"<{len(self)} operations of /openapi.json>"


@pytest.fixture(scope="module")
def operations(live: Node) -> Operations:
    doc = json.loads(send(live.url, "GET", "/openapi.json").body)
    ops = Operations(
        (method.upper(), path, op)
        for path, methods in doc["paths"].items()
        for method, op in methods.items()
    )
    assert len(ops) >= 20
    return ops


# -- values ------------------------------------------------------------------------------

pct_bytes = st.binary(min_size=1, max_size=24).map(lambda b: quote_from_bytes(b, safe=""))
hostile_text = st.sampled_from(
    ["%FF", "%00", "%ED%A0%80", "%C0%AF", "a%0Ab", "%E2%80%A8", "x" * 5000, "", "%", "%zz"]
)
junk = pct_bytes | hostile_text | st.text(max_size=30).map(lambda t: quote(t, safe=""))
names = st.sampled_from(["default", "q.1", "a:b-c_d", "x" * 200])  # none the node serves
uuids = st.uuids().map(str) | st.uuids().map(lambda u: str(u).upper())


def path_value(name: str) -> st.SearchStrategy[str]:
    if name == "id":
        return uuids | junk
    if name == "name":
        return names | junk
    return st.sampled_from(["index.html", "js/api.js", "", "nope"]) | junk  # the dashboard


def query_value(schema: dict[str, Any]) -> st.SearchStrategy[str]:
    if schema.get("type") == "integer":
        low, high = schema.get("minimum", 0), schema.get("maximum", 10**6)
        numbers = st.integers(low - 2, min(high, 10**6) + 2).map(str)
        return numbers | st.sampled_from([str(high + 1), "1e3", "-0", "0x10", "%201", "+1"]) | junk
    if "enum" in schema:
        return st.sampled_from([str(v) for v in schema["enum"]]) | junk
    if schema.get("type") == "boolean":
        return st.sampled_from(["true", "false", "1", "0", "TRUE", "yes"]) | junk
    if schema.get("format") == "uuid":
        return uuids | junk
    return names | st.text(max_size=20).map(lambda t: quote(t, safe="")) | junk


def with_invalid_utf8(raw: bytes, data: st.DataObject) -> bytes:
    """`raw` with invalid bytes spliced in just after one of its quote characters."""
    quotes = [i for i, c in enumerate(raw) if c == ord('"')]
    if not quotes:
        return raw + b"\xff"
    at = data.draw(st.sampled_from(quotes)) + 1
    bad = data.draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xc0\xaf", b"\x00"]))
    return raw[:at] + bad + raw[at:]


payloads = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),  # NUL, any plane
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=6,
)
valid_jobs = st.fixed_dictionaries(
    {"type": st.sampled_from(["email", "report"])},
    optional={"queue": names, "payload": payloads, "priority": st.integers(0, 10)},
)
some_jobs = valid_jobs | job_objects


def body_for(path: str, data: st.DataObject) -> bytes:
    kinds = ["job"] * 5 + ["mutated", "mutated", "oversized", "binary", "nul"]
    kind = data.draw(st.sampled_from(kinds))
    jobs = st.lists(some_jobs, min_size=1, max_size=4)
    batch = path.endswith("batch")
    value: Any = data.draw(jobs.map(lambda j: {"jobs": j}) if batch else some_jobs)
    raw = json.dumps(value, allow_nan=True).encode()
    if kind == "mutated":
        return with_invalid_utf8(raw, data)
    if kind == "oversized":
        return raw[:-1] + b', "payload": "' + b"x" * MAX_BODY + b'"}'
    if kind == "binary":
        return data.draw(st.binary(max_size=64))
    if kind == "nul":
        return raw.replace(b'"email"', b'"em\\u0000ail"').replace(b'"default"', b'"d\\u0000"')
    return raw


def request_for(op: tuple[str, str, dict[str, Any]], data: st.DataObject) -> dict[str, Any]:
    method, template, spec = op
    path = template
    for param in spec.get("parameters", []):
        if param["in"] == "path":
            value = data.draw(path_value(param["name"]), label=param["name"])
            path = path.replace("{" + param["name"] + "}", value)
    query: list[str] = []
    for param in spec.get("parameters", []):
        if param["in"] == "query" and data.draw(st.booleans()):
            query.append(f"{param['name']}={data.draw(query_value(param['schema']))}")
    if data.draw(st.integers(0, 9)) == 0:
        query.append(data.draw(st.sampled_from(["nope=1", "limit=1&limit=2", "%FF=1", "a"])))
    if query:
        path += "?" + "&".join(query)
    headers: list[tuple[str, str | bytes]] = []
    if any(p["in"] == "header" for p in spec.get("parameters", [])) and data.draw(st.booleans()):
        key = data.draw(
            st.sampled_from([b"k-1", b"k\xff", b"\xc3", b"tab\tkey", b"x" * 300, b"", b"k\x01"])
        )
        headers.append(("Idempotency-Key", key))
    body = body_for(template, data) if "requestBody" in spec else None
    return {"method": method, "path": path, "headers": headers, "body": body}


# -- the property ----------------------------------------------------------------------


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_no_route_answers_5xx_and_refusals_change_nothing(
    live: Node, operations: Operations, data: st.DataObject
) -> None:
    writes = [o for o in operations if o[1] in ("/jobs", "/jobs/batch") and o[0] == "POST"]
    op = data.draw(st.sampled_from([*operations, *writes * 6]), label="operation")
    req = request_for(op, data)
    before = state(live.url)
    resp = send(live.url, req["method"], req["path"], body=req["body"], headers=req["headers"])
    event(f"{op[0]} {op[1]} -> {resp.status}")
    assert resp.status < 500 or resp.status == 503, (req, resp.status, resp.body[:300])
    if op[1] not in ("/metrics", "/ui", "/ui/{path}") or resp.status >= 400:
        assert resp.headers["content-type"].startswith("application/json"), (req, resp.headers)
        resp.json  # noqa: B018 - it parses
    if resp.status >= 400 or req["method"] == "GET":
        assert state(live.url) == before, (req, resp.status, resp.body[:300])


def test_the_fuzzed_nodes_counted_no_500(live: Node) -> None:
    """Every answer, as the node itself counted it (runs after the fuzz in this module)."""
    text = send(live.url, "GET", "/metrics").body.decode()
    answered = {
        (s.labels["route"], s.labels["status"]): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "goqueue_http_requests_total" and s.value
    }
    assert not [key for key in answered if key[1].startswith("5") and key[1] != "503"]
    # the fuzz reached the paths that store jobs, not only the refusals
    assert answered.get(("/jobs", "201"), 0) >= 1, answered
    assert answered.get(("/jobs/batch", "200"), 0) >= 1, answered
    assert Path(live.log_path).exists()
