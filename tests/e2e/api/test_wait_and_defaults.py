"""The API's additions for clients, on a real server: `GET /jobs/{id}?wait=`, `?strict=`
on enqueue, and queue and priority resolved job > actor > server (the JSON a job shows is
unchanged: always its resolved queue and priority, templates included)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from goqueue.actors.protocol import ActorInfo
from goqueue.supervisor.common.catalog import Catalog

from tests.conftest import wait_for
from tests.e2e.api.conftest import ACTORS, ApiServer, Reply

pytestmark = pytest.mark.timeout(30)


def enqueue(server: ApiServer, **job: Any) -> dict[str, Any]:
    resp = server.post("/jobs", {"type": "email", **job})
    assert resp.status == 201, resp.body
    return resp.json


@pytest.mark.parametrize("wait", ["61", "60.5", "-1", "abc", "1e3", "", "0x10", "1.1234567"])
def test_a_bad_wait_is_400_naming_it(api_server: ApiServer, wait: str) -> None:
    job = enqueue(api_server)
    resp = api_server.get(f"/jobs/{job['id']}?wait={wait}")
    assert resp.status == 400 and resp.json["details"] == {"parameter": "wait"}, resp.body


def test_a_wait_on_an_unknown_job_is_404_at_once(api_server: ApiServer) -> None:
    started = time.monotonic()
    resp = api_server.get("/jobs/00000000-0000-4000-8000-000000000000?wait=30")
    assert resp.status == 404 and time.monotonic() - started < 2


def test_a_wait_ends_at_its_timeout_with_the_state_then(api_server: ApiServer) -> None:
    job = enqueue(api_server)  # no worker runs here: it stays pending
    started = time.monotonic()
    resp = api_server.get(f"/jobs/{job['id']}?wait=0.4")
    waited = time.monotonic() - started
    assert resp.status == 200 and resp.json["status"] == "pending"
    assert 0.35 <= waited < 2, waited
    assert api_server.get(f"/jobs/{job['id']}?wait=0").json == resp.json


def test_a_wait_answers_when_the_job_finishes_here(api_server: ApiServer) -> None:
    assert api_server.engine is not None
    api_server.engine.waiters.poll = 60.0  # only the outcome hook can end this wait
    job = enqueue(api_server)
    answers: list[tuple[float, Reply]] = []

    def wait() -> None:
        reply = api_server.get(f"/jobs/{job['id']}?wait=20")
        answers.append((time.monotonic(), reply))

    waiter = threading.Thread(target=wait)
    waiter.start()
    engine = api_server.engine
    wait_for(lambda: len(engine.waiters), timeout=5, interval=0.01, what="the request waiting")
    assert len(api_server.engine.waiters) == 1
    cancelled = api_server.delete(f"/jobs/{job['id']}")
    cancelled_at = time.monotonic()
    waiter.join(timeout=10)
    ((answered_at, reply),) = answers
    assert reply.status == 200 and reply.json == cancelled.json
    assert answered_at - cancelled_at < 1.0  # not the 20 s wait, nor a 60 s poll


def test_a_finished_job_answers_a_wait_at_once(api_server: ApiServer) -> None:
    job = enqueue(api_server)
    api_server.delete(f"/jobs/{job['id']}")
    started = time.monotonic()
    resp = api_server.get(f"/jobs/{job['id']}?wait=30")
    assert resp.json["status"] == "cancelled" and time.monotonic() - started < 2


def test_strict_false_enqueues_a_type_no_node_runs_yet(api_server: ApiServer) -> None:
    refused = api_server.post("/jobs", {"type": "later_type"})
    assert refused.status == 400 and refused.json["details"]["field"] == "type"
    for strict in ("false", "0"):
        resp = api_server.post(f"/jobs?strict={strict}", {"type": "later_type"})
        assert resp.status == 201 and resp.json["type"] == "later_type"
    assert api_server.post("/jobs?strict=true", {"type": "later_type"}).status == 400
    bad = api_server.post("/jobs?strict=maybe", {"type": "email"})
    assert bad.status == 400 and bad.json["details"] == {"parameter": "strict"}
    template = {"type": "email", "on_success": {"type": "later_type"}}
    assert api_server.post("/jobs", template).json["details"]["field"] == "on_success.type"
    assert api_server.post("/jobs?strict=false", template).status == 201
    batch = api_server.post("/jobs/batch?strict=false", {"jobs": [{"type": "later_type"}]})
    assert batch.json["results"][0]["status"] == 201
    batch = api_server.post("/jobs/batch", {"jobs": [{"type": "later_type"}]})
    assert batch.json["results"][0]["status"] == 400


def test_openapi_describes_wait_and_strict(api_server: ApiServer) -> None:
    paths = api_server.get("/openapi.json").json["paths"]
    (wait,) = [p for p in paths["/jobs/{id}"]["get"]["parameters"] if p["name"] == "wait"]
    assert wait["in"] == "query" and wait["schema"]["maximum"] == 60
    for path in ("/jobs", "/jobs/batch"):
        (strict,) = [p for p in paths[path]["post"]["parameters"] if p["name"] == "strict"]
        assert strict["schema"] == {"type": "boolean", "default": True}


def test_queue_and_priority_are_the_jobs_else_the_actors_else_the_servers(
    api_server: ApiServer,
) -> None:
    routed = ActorInfo("routed", None, 1, None, "special", 8)
    catalog = Catalog([*ACTORS, routed], {})
    api_server.sync(lambda: api_server.engine.set_catalog(catalog, frozenset()))  # type: ignore[union-attr]
    plain = enqueue(api_server)
    assert (plain["queue"], plain["priority"], plain["max_retries"]) == ("default", 5, 3)
    declared = enqueue(api_server, type="routed")
    assert (declared["queue"], declared["priority"], declared["max_retries"]) == ("special", 8, 1)
    own = enqueue(api_server, type="routed", queue="mine", priority=0, max_retries=0)
    assert (own["queue"], own["priority"], own["max_retries"]) == ("mine", 0, 0)
    # Templates are resolved when the job is enqueued, and shown resolved.
    chained = enqueue(api_server, on_success={"type": "routed", "on_failure": {"type": "email"}})
    then = chained["on_success"]
    assert (then["queue"], then["priority"], then["max_retries"]) == ("special", 8, 1)
    last = then["on_failure"]
    assert (last["queue"], last["priority"], last["max_retries"]) == ("default", 5, 3)
    assert api_server.get(f"/jobs/{chained['id']}").json == chained
