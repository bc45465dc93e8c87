"""An enqueue whose store write outlasts the API's deadline answers 504 "outcome unknown",
never 503 "nothing was stored": the write may still land, and here it does.

A real node on a private PostgreSQL cluster (`tests/pgcluster.py`); the database
backends serving the node are frozen with SIGSTOP while POST /jobs waits on its insert,
then thawed. The machine's shared PostgreSQL is never touched."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
import urllib.error
import urllib.request

import psycopg
import pytest

from tests.conftest import Node, Response, wait_for
from tests.e2e.conftest import NodeSet
from tests.pgcluster import PgCluster

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(120)]

STORE_TIMEOUT = 10.0  # the API's deadline on a store call (api/http/errors.py)


def node_backends(cluster: PgCluster) -> list[int]:
    """The pids of the backends serving GoQueue nodes on `cluster` (only the test's)."""
    with psycopg.connect(cluster.dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name LIKE 'goqueue/%'"
        ).fetchall()
    return [row[0] for row in rows]


def post_job(node: Node, body: dict[str, object]) -> Response:
    """POST /jobs, waiting longer than the node's own deadline (the shared helper's
    15 s could end first)."""
    req = urllib.request.Request(
        node.url + "/jobs",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=STORE_TIMEOUT + 30) as resp:
            return Response(resp.status, json.loads(resp.read()), dict(resp.headers))
    except urllib.error.HTTPError as err:
        return Response(err.code, json.loads(err.read()), dict(err.headers))


def stored_with(node: Node, marker: str) -> list[str]:
    """The ids of the noop jobs whose payload is `marker`."""
    page = node.get("/jobs?type=noop&limit=100").body
    return [job["id"] for job in page["jobs"] if job["payload"] == marker]


def test_an_enqueue_that_outlasts_the_store_deadline_answers_504_and_may_be_stored(
    private_nodes: NodeSet, pg_cluster: PgCluster
) -> None:
    node = private_nodes.start(workers=1)
    node.enqueue(type="noop", payload="warm-up")  # the enqueue lane keeps its connection
    frozen = node_backends(pg_cluster)
    assert frozen, "no backend serves the node"
    try:
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        started = time.monotonic()
        answer = post_job(node, {"type": "noop", "payload": "in flight"})
        waited = time.monotonic() - started
    finally:
        for pid in frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    assert answer.status == 504, answer
    assert answer.body == {
        "error": "the outcome is unknown: the request may have been stored; retry with the "
        "same Idempotency-Key to find out (or, for a write that takes none, read the state "
        "first)",
        "details": {"header": "Idempotency-Key"},
    }
    assert STORE_TIMEOUT - 1 < waited < STORE_TIMEOUT + 8, waited
    # the insert was in the frozen backend's hands: thawed, it commits it. A 503 would
    # have told the client it was not stored, and a blind retry would run it twice.
    wait_for(lambda: node.get("/ready").status == 200, timeout=30)
    landed = wait_for(lambda: stored_with(node, "in flight"), timeout=30)
    assert len(landed) == 1
