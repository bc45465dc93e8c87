"""A worker's own queue, on a live node and each store: short jobs queued on a worker run
back to back; a queued attempt's deadline holds from when it starts; a worker killed
with attempts queued behind its job gives them back at no cost, so each runs once; alike
whether their starts were written after their claim or by the claim itself."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import pytest

from tests.conftest import Node, nodes_started_with, schema_args, wait_for
from tests.e2e.support import read_runs

pytestmark = pytest.mark.timeout(60)

ACTORS = ("--actors", "testactors,faultactors")
# `logged` alone: once it runs short, every type a claim may return does. A claim for a
# worker's queue starts the short jobs at its head itself on SQLite whatever the other
# types; on PostgreSQL only when every type it may return is short, as here (with many
# types, their starts are written after)
ONLY_SHORT = ("--actors", "shortactors")


@pytest.fixture(
    params=[
        ("memory", ACTORS),
        ("sqlite", ACTORS),
        ("postgres", ACTORS),
        ("postgres", ONLY_SHORT),
    ],
    ids=["memory", "sqlite", "postgres", "postgres-started-by-claim"],
)
def store_node(
    request: pytest.FixtureRequest, make_node: Callable[..., Node]
) -> Iterator[Callable[..., Node]]:
    """`make_node` on the store under test, with the fault actors, or `logged` alone
    (PostgreSQL: a fresh schema of the test database, dropped afterwards)."""
    store, actors = request.param
    if store == "memory":
        yield partial(make_node, *actors, "--database-url", "memory://")
        return
    if store == "sqlite":
        yield partial(make_node, *actors)
        return
    yield from nodes_started_with(make_node, *actors, *schema_args("gq_wq"))


def logged(directory: Path, seconds: float = 0.005, **fields: object) -> dict[str, object]:
    return {"type": "logged", "payload": {"dir": str(directory), "seconds": seconds}, **fields}


def batch(node: Node, jobs: list[dict[str, object]]) -> list[str]:
    reply = node.post("/jobs/batch", {"jobs": jobs})
    assert reply.status == 200 and all(r["status"] == 201 for r in reply.body["results"]), reply
    return [r["job"]["id"] for r in reply.body["results"]]


def warm_up(node: Node, directory: Path, seconds: float = 0.005) -> None:
    """A few short `logged` jobs, one at a time: the node learns the type runs short."""
    for _ in range(3):
        job = node.enqueue(**logged(directory, seconds))
        node.wait_status(job["id"], "done")


@pytest.mark.parametrize("usual", [0.005, 0.02])
def test_a_worker_killed_with_attempts_queued_gives_them_back_at_no_cost(
    store_node: Callable[..., Node], tmp_path: Path, usual: float
) -> None:
    """One worker runs a job of a type that usually takes `usual` seconds, which this
    time overruns its 0.5 s deadline, while eight short jobs wait queued behind it on
    that worker (with a durable store, the starts of those due within 50 ms of work were
    written ahead: all of them, or the first two). The kill charges the running job
    alone: each queued job runs exactly once, on the replacement, as its attempt 1."""
    node = store_node("--workers", "1")
    warm_up(node, tmp_path, usual)
    hung = {**logged(tmp_path, 30.0), "timeout_seconds": 0.5}
    ids = batch(node, [hung, *[logged(tmp_path, usual) for _ in range(8)]])
    hung_id, queued = ids[0], ids[1:]

    def held() -> int:
        statuses = [node.get(f"/jobs/{i}").body["status"] for i in queued]
        return sum(status in ("claimed", "running") for status in statuses)

    # the queue deepens as the worker's claims come back full: 1, 2, then 4 more
    wait_for(lambda: held() >= 4, 5, what="short jobs queued behind the hung one")
    assert node.wait_status(hung_id, "pending", "failed", timeout=15)["attempts"] == 1
    for job_id in queued:
        done = node.wait_status(job_id, "done", timeout=15)
        assert done["attempts"] == 1, done
    runs = read_runs(tmp_path)
    assert all(len(runs[i]) == 1 for i in queued), {i: runs[i] for i in queued}
    hung_job = node.get(f"/jobs/{hung_id}").body
    assert "timed out after 0.5s" in hung_job["errors"][0]["error"], hung_job


def test_a_queued_attempt_is_killed_at_its_own_deadline(
    store_node: Callable[..., Node], tmp_path: Path
) -> None:
    """A short-typed job queued behind two others overruns its 0.4 s deadline: it is killed
    about 0.4 s after it started (its deadline counts from its start, not from when it was
    queued), and the job after it still runs once."""
    node = store_node("--workers", "1")
    warm_up(node, tmp_path)
    slow = logged(tmp_path, 30.0, timeout_seconds=0.4, max_retries=0)
    ids = batch(node, [logged(tmp_path, 0.3), logged(tmp_path, 0.3), slow, logged(tmp_path)])
    failed = node.wait_status(ids[2], "failed", timeout=15)
    assert "timed out after 0.4s" in failed["last_error"], failed
    node.wait_status(ids[3], "done", timeout=15)
    runs = read_runs(tmp_path)
    (run,) = runs[ids[2]]
    (before,) = runs[ids[1]]
    assert run.end is None and before.end is not None
    assert run.start >= before.end  # it started when the one ahead of it ended
    assert len(runs[ids[3]]) == 1


def test_short_jobs_keep_their_priority_order_on_one_worker(
    store_node: Callable[..., Node], tmp_path: Path
) -> None:
    """Twelve short jobs of mixed priorities enqueued at once to one worker start highest
    priority first, then in enqueue order, though most of them wait in its queue."""
    node = store_node("--workers", "1")
    warm_up(node, tmp_path)
    gate = node.enqueue(**logged(tmp_path, 0.5))
    wait_for(lambda: read_runs(tmp_path).get(gate["id"]), 10, what="the worker is busy")
    priorities = [3, 7, 5, 7, 3, 9, 5, 1, 9, 7, 5, 3]
    ids = batch(node, [logged(tmp_path, priority=p) for p in priorities])
    for job_id in ids:
        node.wait_status(job_id, "done", timeout=15)
    runs = read_runs(tmp_path)
    order = sorted(ids, key=lambda i: runs[i][0].start)
    expected = sorted(ids, key=lambda i: (-priorities[ids.index(i)], ids.index(i)))
    assert order == expected
