"""The same fuzzing as test_routes, against a live `goqueue serve` process: no 5xx, and
a rejected request changes nothing. The node serves no queue, so no job runs and the
job count changes only by accepted enqueues."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.api.test_routes import job_objects
from tests.conftest import Node, request

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory):
    from tests.conftest import start_node, stop_node

    node = start_node(
        tmp_path_factory.mktemp("live"),
        "--actors",
        "goqueue.actors.examples",
        "--queues",
        "served-by-nobody",
        "--workers",
        "1",
    )
    yield node
    stop_node(node)


def total(node: Node) -> int:
    return sum(node.get("/stats").body["counts"].values())


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(body=job_objects, junk=st.binary(max_size=64), segment=st.text(max_size=40))
def test_live_node_never_answers_5xx_and_rejections_change_nothing(
    live: Node, body: dict[str, Any], junk: bytes, segment: str
) -> None:
    for raw in (json.dumps(body, allow_nan=True).encode(), junk):
        before = total(live)
        resp = request("POST", live.url + "/jobs", raw)
        assert resp.status < 500, (raw, resp.body)
        assert total(live) == before + (resp.status == 201)
    before = total(live)
    part = quote(segment, safe="")
    for method, path in (
        ("GET", f"/jobs/{part}"),
        ("DELETE", f"/jobs/{part}"),
        ("POST", f"/dlq/{part}/replay"),
        ("POST", f"/queues/{part}/pause"),
    ):
        resp = request(method, live.url + path)
        assert resp.status < 500, (method, path, resp.body)
    assert total(live) == before
