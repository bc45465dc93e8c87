"""`GET /jobs/{id}?wait=` on real nodes: a job finished by another node sharing the
PostgreSQL store is noticed by the poll, and a draining node ends its waits at once."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable

import goqueue
import pytest

from tests.conftest import Node, request, stays_true, wait_for

pytestmark = pytest.mark.timeout(120)


@pytest.mark.postgres
def test_a_job_another_node_finishes_ends_the_wait(pg_node: Callable[..., Node]) -> None:
    asked = pg_node("--queues", "elsewhere")  # runs nothing from the default queue
    runner = pg_node()
    with goqueue.Client(asked.url) as client:
        job = client.enqueue("sleep", {"seconds": 1.0})
        started = time.monotonic()
        done = client.wait(job.id, timeout=30)
        waited = time.monotonic() - started
    assert done.status == "done"
    assert 0.9 <= waited < 2.5, waited  # the job's second, plus at most a poll or so
    events = runner.get(f"/jobs/{job.id}/events").body["events"]
    (started,) = [e for e in events if e["event"] == "started"]
    assert started["node"].endswith(f"-{runner.proc.pid}")  # the other node ran it


def test_a_draining_node_ends_its_waits(make_node: Callable[..., Node]) -> None:
    node = make_node()
    with goqueue.Client(node.url) as client:
        client.pause("held")
        job = client.enqueue("noop", queue="held")
    answers: list[tuple[float, int, str]] = []

    def wait() -> None:
        reply = request("GET", f"{node.url}/jobs/{job.id}?wait=60")
        answers.append((time.monotonic(), reply.status, reply.body["status"]))

    waiter = threading.Thread(target=wait)
    waiter.start()
    held = "the node holds the request: it is waiting"
    stays_true(waiter.is_alive, for_seconds=1.0, what=f"answered early; expected {held}")
    assert waiter.is_alive()  # the node holds the request: it is waiting
    node.signal(signal.SIGTERM)
    signalled = time.monotonic()
    waiter.join(timeout=20)
    ((answered, status, state),) = answers
    assert status == 200 and state == "pending"
    assert answered - signalled < 5
    wait_for(lambda: node.proc.poll() is not None, timeout=15)
    assert node.proc.returncode == 0
