"""Webhooks end to end: real nodes, real PostgreSQL, receivers on 127.0.0.1.

On PostgreSQL a delivery is owed until some node records it delivered: it survives a
`kill -9` of the node that failed it, or that died mid-attempt, and two nodes never
send one delivery at once. Drain gives attempts in flight the shutdown grace. In memory
delivery is best effort, with the same headers, schedule and view. The egress policy
refuses loopback and private destinations at enqueue (400) and, for names, at connect
time (recorded as refused; nothing is sent). No test sends anything beyond loopback.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import signal
import socket
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tests.conftest import Node, postgres_dsn, stays_true, stop_node, wait_for
from tests.e2e.supervisor.test_operations import metric_samples

pytestmark = pytest.mark.timeout(120)

LOOPBACK = ("--webhook-allow-hosts", "127.0.0.1")
SECRET = "s3cret"


@dataclass
class Hit:
    """One request as the receiver saw it."""

    headers: dict[str, str]
    body: bytes
    status: int
    at: float = field(default_factory=time.monotonic)

    @property
    def delivery(self) -> str:
        return self.headers["X-GoQueue-Delivery"]


class Receiver:
    """A webhook receiver on 127.0.0.1: `answer(hit number)` gives the status and how long
    to take first; counts requests in flight per delivery id."""

    def __init__(self, answer: Callable[[int], tuple[int, float]] = lambda n: (200, 0.0)) -> None:
        self.answer = answer
        self.hits: list[Hit] = []
        self.started = 0
        self.in_flight: Counter[str] = Counter()
        self.most_at_once: dict[str, int] = defaultdict(int)
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                delivery = self.headers.get("X-GoQueue-Delivery", "")
                with receiver.lock:
                    number = receiver.started
                    receiver.started += 1
                    receiver.in_flight[delivery] += 1
                    most = receiver.most_at_once
                    most[delivery] = max(most[delivery], receiver.in_flight[delivery])
                status, delay = receiver.answer(number)
                time.sleep(delay)
                with receiver.lock:
                    receiver.in_flight[delivery] -= 1
                    receiver.hits.append(Hit(dict(self.headers), body, status))
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def answered(self, status: int) -> list[Hit]:
        with self.lock:
            return [hit for hit in self.hits if hit.status == status]

    def close(self) -> None:
        self.server.shutdown()


@pytest.fixture
def receivers() -> Iterator[Callable[..., Receiver]]:
    made: list[Receiver] = []

    def make(answer: Callable[[int], tuple[int, float]] = lambda n: (200, 0.0)) -> Receiver:
        receiver = Receiver(answer)
        made.append(receiver)
        return receiver

    yield make
    for receiver in made:
        receiver.close()


@pytest.fixture
def pg_nodes(make_node) -> Iterator[Callable[..., Node]]:
    """A factory of nodes sharing one fresh schema of the test database."""
    dsn = postgres_dsn()
    schema = f"gq_hooks_{uuid.uuid4().hex[:10]}"
    nodes: list[Node] = []

    def make(*args: str, session: bool = False) -> Node:
        db = ("--database-url", dsn, "--database-schema", schema)
        node = make_node(*db, *args, session=session)
        nodes.append(node)
        return node

    yield make
    for node in nodes:  # before the schema goes: a drain still writes to it
        stop_node(node)
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def stored(job: dict) -> dict:
    """A job as GET /jobs/{id} shows it, less what only the answering node adds (the
    deadline its attempts get there, and where that comes from): a webhook carries the job
    as it is stored."""
    return {key: value for key, value in job.items() if key != "timeout"}


def kill_group(node: Node) -> None:
    """`kill -9` of a node's whole process group (supervisor and workers)."""
    os.killpg(node.proc.pid, signal.SIGKILL)
    node.proc.wait(timeout=10)


def deliveries(node: Node, job_id: str) -> list[dict[str, Any]]:
    resp = node.get(f"/jobs/{job_id}/deliveries")
    assert resp.status == 200, resp
    return resp.body["deliveries"]


def signed(hit: Hit) -> bool:
    digest = hmac.new(SECRET.encode(), hit.body, hashlib.sha256).hexdigest()
    return hit.headers["X-GoQueue-Signature"] == f"sha256={digest}"


def outcome(node: Node, name: str) -> float:
    return metric_samples(node)[("goqueue_webhook_deliveries_total", (("outcome", name),))]


# -- at least once on PostgreSQL -------------------------------------------------------


@pytest.mark.postgres
def test_a_delivery_failed_then_orphaned_by_kill_9_arrives_from_the_next_node(
    pg_nodes, receivers
) -> None:
    back = threading.Event()  # 503 until node a is gone: however often a retries first
    receiver = receivers(lambda n: (200 if back.is_set() else 503, 0.0))
    hooks = ("--webhook-secret", SECRET, *LOOPBACK)
    a = pg_nodes("--node-id", "node-a", *hooks, session=True)
    job = a.enqueue(type="noop", payload="hi", webhook_url=receiver.url)
    a.wait_status(job["id"], "done")
    wait_for(lambda: any(d["attempts"] for d in deliveries(a, job["id"])), timeout=15)
    kill_group(a)
    back.set()
    b = pg_nodes("--node-id", "node-b", *hooks)
    [delivered] = wait_for(lambda: receiver.answered(200), timeout=30)

    failed = receiver.answered(503)
    assert failed and {hit.delivery for hit in failed} == {delivered.delivery}
    assert signed(delivered) and all(signed(hit) for hit in failed)
    assert delivered.headers["X-GoQueue-Event"] == "job.done"
    assert delivered.headers["X-GoQueue-Job-Id"] == job["id"]
    sent = json.loads(delivered.body)
    assert sent["id"] == job["id"] and sent["status"] == "done" and sent["payload"] == "hi"
    assert sent == stored(b.get(f"/jobs/{job['id']}").body)  # the job as the API shows it

    [view] = wait_for(lambda: [d for d in deliveries(b, job["id"]) if d["delivered_at"]])
    assert view["id"] == delivered.delivery and view["event"] == "job.done"
    assert view["url"] == receiver.url and not view["given_up"]
    assert view["next_attempt_at"] is None
    *early, last = view["attempts"]
    assert [(x["status_code"], x["node"]) for x in early] == [(503, "node-a")] * len(early)
    assert early[0]["error"] == "HTTP 503"
    assert (last["status_code"], last["error"], last["node"]) == (200, None, "node-b")
    assert outcome(b, "delivered") == 1


@pytest.mark.postgres
def test_a_node_killed_mid_attempt_leaves_the_delivery_to_another_after_its_lease(
    pg_nodes, receivers
) -> None:
    receiver = receivers(lambda n: (200, 60.0 if n == 0 else 0.0))  # the first one hangs
    hooks = (*LOOPBACK, "--webhook-timeout", "1")  # a lease of 2 x 1 + 5 = 7 s
    a = pg_nodes("--node-id", "node-a", *hooks, session=True)
    job = a.enqueue(type="noop", webhook_url=receiver.url)
    wait_for(lambda: receiver.started >= 1, timeout=15)
    kill_group(a)
    killed = time.monotonic()
    b = pg_nodes("--node-id", "node-b", *hooks)
    [hit] = wait_for(lambda: receiver.answered(200), timeout=30)
    assert hit.at - killed > 3.0  # not before a's lease ran out
    [view] = wait_for(lambda: [d for d in deliveries(b, job["id"]) if d["delivered_at"]])
    assert view["id"] == hit.delivery
    assert [(x["status_code"], x["node"]) for x in view["attempts"]] == [(200, "node-b")]


@pytest.mark.postgres
def test_two_nodes_never_send_one_delivery_at_once(pg_nodes, receivers) -> None:
    receiver = receivers(lambda n: (200, 0.3))  # slow enough for the other node to poll
    a = pg_nodes("--node-id", "node-a", *LOOPBACK)
    b = pg_nodes("--node-id", "node-b", *LOOPBACK)
    jobs = [{"type": "noop", "webhook_url": receiver.url} for _ in range(40)]
    ids = [r["job"]["id"] for r in a.post("/jobs/batch", {"jobs": jobs}).body["results"]]
    wait_for(lambda: len(receiver.answered(200)) == 40, timeout=60, interval=0.1)
    # two more polls of each node: anything sent twice would show meanwhile
    stays_true(
        lambda: len(receiver.answered(200)) == 40 and max(receiver.most_at_once.values()) == 1,
        for_seconds=2.5,
        what="a delivery sent twice",
    )
    hits = receiver.answered(200)
    assert len(hits) == 40 and len({hit.delivery for hit in hits}) == 40
    assert max(receiver.most_at_once.values()) == 1
    assert {json.loads(hit.body)["id"] for hit in hits} == set(ids)
    nodes = {x["node"] for i in ids for d in deliveries(b, i) for x in d["attempts"]}
    assert nodes <= {"node-a", "node-b"}


@pytest.mark.postgres
def test_drain_gives_a_delivery_in_flight_the_shutdown_grace(pg_nodes, receivers) -> None:
    receiver = receivers(lambda n: (200, 4.0))
    a = pg_nodes(*LOOPBACK, "--webhook-timeout", "10", "--shutdown-grace", "12")
    job = a.enqueue(type="noop", webhook_url=receiver.url)
    wait_for(lambda: receiver.started >= 1, timeout=15)
    asked = time.monotonic()
    a.signal(signal.SIGTERM)
    assert a.proc.wait(timeout=15) == 0
    took = time.monotonic() - asked
    assert 2.5 < took < 12, f"drained in {took:.1f}s"
    b = pg_nodes(*LOOPBACK)
    [view] = deliveries(b, job["id"])
    assert view["delivered_at"] is not None, view  # recorded before the node stopped
    assert [x["status_code"] for x in view["attempts"]] == [200]
    assert len(receiver.hits) == 1  # and not sent again by the next node
    assert "interrupted" not in a.logs() and "not recorded" not in a.logs()


@pytest.mark.postgres
def test_a_cancelled_job_fires_job_cancelled(pg_nodes, receivers) -> None:
    receiver = receivers()
    a = pg_nodes(*LOOPBACK)
    job = a.enqueue(type="noop", delay_seconds=3600, webhook_url=receiver.url)
    assert a.delete(f"/jobs/{job['id']}").status == 200
    [hit] = wait_for(lambda: receiver.answered(200), timeout=15)
    assert hit.headers["X-GoQueue-Event"] == "job.cancelled"
    assert json.loads(hit.body)["status"] == "cancelled"


# -- best effort in memory -------------------------------------------------------------


def test_memory_delivers_best_effort_with_the_same_headers_and_view(make_node, receivers) -> None:
    receiver = receivers(lambda n: (503 if n == 0 else 200, 0.0))
    node = make_node("--node-id", "mem", "--webhook-secret", SECRET, *LOOPBACK)
    job = node.enqueue(type="failnow", webhook_url=receiver.url)
    node.wait_status(job["id"], "failed")
    [hit] = wait_for(lambda: receiver.answered(200), timeout=15)
    [first] = receiver.answered(503)
    assert first.delivery == hit.delivery and signed(hit)
    assert hit.headers["X-GoQueue-Event"] == "job.failed"
    assert json.loads(hit.body) == stored(node.get(f"/jobs/{job['id']}").body)
    [view] = wait_for(lambda: [d for d in deliveries(node, job["id"]) if d["delivered_at"]])
    assert view["id"] == hit.delivery
    assert [(x["status_code"], x["node"]) for x in view["attempts"]] == [(503, "mem"), (200, "mem")]
    assert (outcome(node, "retried"), outcome(node, "delivered")) == (1, 1)
    assert outcome(node, "refused") == outcome(node, "dropped") == outcome(node, "failed") == 0
    assert node.get(f"/jobs/{uuid.uuid4()}/deliveries").status == 404
    assert deliveries(node, node.enqueue(type="noop")["id"]) == []


# -- the egress policy -----------------------------------------------------------------

REFUSED_AT_ENQUEUE = [
    "http://127.0.0.1",
    "http://[::1]",
    "http://localhost:5432",
    "http://169.254.169.254/",
    "http://10.0.0.1",
    "http://[::ffff:127.0.0.1]",
]


def test_loopback_and_private_urls_are_refused_at_enqueue(make_node) -> None:
    node = make_node()
    for url in REFUSED_AT_ENQUEUE:
        resp = node.post("/jobs", {"type": "noop", "webhook_url": url})
        assert resp.status == 400, (url, resp)
        assert resp.body["details"] == {"field": "webhook_url"}, resp.body
        assert "webhook_url must not point at" in resp.body["error"]
    chained = {"type": "noop", "on_success": {"type": "noop", "webhook_url": "http://10.0.0.1"}}
    resp = node.post("/jobs", chained)
    assert resp.status == 400 and resp.body["details"] == {"field": "on_success.webhook_url"}
    resp = node.post("/jobs/batch", {"jobs": [{"type": "noop", "webhook_url": "http://[::1]"}]})
    (item,) = resp.body["results"]  # a batch answers each item on its own
    assert resp.status == 200 and item["status"] == 400
    assert item["details"] == {"field": "jobs[0].webhook_url"}
    assert node.get("/stats").body["counts"]["pending"] == 0  # nothing stored


def loopback_name() -> str | None:
    """A name this machine resolves to loopback only (its host name often is), or None."""
    name = socket.gethostname()
    try:
        found = {info[4][0] for info in socket.getaddrinfo(name, 80, proto=socket.IPPROTO_TCP)}
    except OSError:
        return None
    if not found or not all(a.startswith("127.") or a == "::1" for a in found):
        return None
    return name


@pytest.mark.parametrize("store", ["memory", "postgres"])
def test_a_name_resolving_to_loopback_is_refused_when_connecting(
    store: str, make_node, receivers, request: pytest.FixtureRequest
) -> None:
    name = loopback_name()
    if name is None:
        pytest.skip("no host name here resolves to loopback only")
    receiver = receivers()
    node = request.getfixturevalue("pg_nodes")() if store == "postgres" else make_node()
    url = f"http://{name}:{receiver.port}/hook"
    job = node.enqueue(type="noop", webhook_url=url)  # a name: accepted at enqueue
    node.wait_status(job["id"], "done")
    [view] = wait_for(lambda: [d for d in deliveries(node, job["id"]) if d["given_up"]])
    [attempt] = view["attempts"]
    assert attempt["status_code"] is None
    assert attempt["error"].startswith(f"refused: {name} resolves only to refused addresses")
    assert "(a loopback address)" in attempt["error"]
    assert view["delivered_at"] is None and view["next_attempt_at"] is None
    assert receiver.hits == [] and receiver.started == 0  # nothing was sent
    assert outcome(node, "refused") == 1 and outcome(node, "retried") == 0


@pytest.mark.parametrize("store", ["memory", "postgres"])
def test_localhost_is_delivered_to_when_loopback_is_allowed(
    store: str, make_node, receivers, request: pytest.FixtureRequest
) -> None:
    receiver = receivers()
    if store == "postgres":
        node = request.getfixturevalue("pg_nodes")("--webhook-allow-networks", "127.0.0.0/8")
    else:
        node = make_node("--webhook-allow-networks", "127.0.0.0/8")
    job = node.enqueue(type="noop", webhook_url=f"http://localhost:{receiver.port}/hook")
    node.wait_status(job["id"], "done")
    [hit] = wait_for(lambda: receiver.answered(200), timeout=15)
    assert json.loads(hit.body)["id"] == job["id"]
    refused = make_node().post("/jobs", {"type": "noop", "webhook_url": "http://localhost:9"})
    assert refused.status == 400 and refused.body["details"] == {"field": "webhook_url"}
    assert "--webhook-allow-networks 127.0.0.0/8" in refused.body["error"]


def test_the_first_retry_comes_after_the_documented_2_s_give_or_take_25_percent(
    make_node: Callable[..., Node],
) -> None:
    """The outbox (SQLite here) wakes for a retry it recorded when it falls due, instead of
    finding it at its next poll, up to a second late."""
    from tests.e2e.support import Receiver as Answering

    with Answering([503, 503, 503]) as receiver:
        node = make_node("--webhook-allow-hosts", "127.0.0.1")
        jobs = [node.enqueue(type="noop", webhook_url=receiver.url) for _ in range(3)]
        for job in jobs:
            wait_for(lambda job=job: len(receiver.of(job["id"])) >= 2, timeout=15)
        gaps = [receiver.of(j["id"])[1].at - receiver.of(j["id"])[0].at for j in jobs]
        assert all(1.5 - 0.05 <= gap <= 2.5 + 0.15 for gap in gaps), gaps
