"""`--max-queues`: queue names are free to invent, so their number is bounded; work in
existing queues is never refused by it. On both stores."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import Node, wait_for
from tests.e2e.api.hostile import send, state
from tests.e2e.support import batch_enqueue

pytestmark = pytest.mark.timeout(90)

NOBODY = ("--queues", "served-by-nobody", "--workers", "1")


def post(node: Node, queue: str, **fields: object) -> int:
    return node.post("/jobs", {"type": "noop", "queue": queue, **fields}).status


def test_a_new_queue_beyond_max_queues_is_429_and_existing_ones_take_work(
    make_store_node: Callable[..., Node],
) -> None:
    node = make_store_node(*NOBODY, "--max-queues", "3")
    assert [post(node, q) for q in ("a", "b", "c")] == [201, 201, 201]
    before = state(node.url)
    refused = node.post("/jobs", {"type": "noop", "queue": "d"})
    assert refused.status == 429, refused
    assert refused.body["details"] == {"field": "queue", "max_queues": 3}
    assert refused.headers.get("Retry-After")
    assert state(node.url) == before
    assert post(node, "a") == 201  # an existing queue always takes work
    template = node.post("/jobs", {"type": "noop", "queue": "a", "on_success": {"type": "noop"}})
    assert template.status == 429 and template.body["details"]["field"] == "on_success.queue"
    batch = node.post(
        "/jobs/batch", {"jobs": [{"type": "noop", "queue": q} for q in ("b", "e", "c")]}
    ).body["results"]
    assert [r["status"] for r in batch] == [201, 429, 201]
    assert batch[1]["details"]["field"] == "jobs[1].queue"
    pause = node.post("/queues/f/pause")
    assert pause.status == 429 and pause.body["details"]["field"] == "name"
    assert node.post("/queues/a/pause").status == 200  # pausing an existing queue is fine
    assert node.post("/queues/a/resume").status == 200

    for listed in node.get("/jobs?queue=c").body["jobs"]:  # queue c empties...
        assert node.delete(f"/jobs/{listed['id']}").status == 200
    # ...and within a few seconds (the names are re-read every 2 s) its place is free
    wait_for(lambda: post(node, "d") == 201, timeout=15, interval=0.25)
    assert post(node, "g") == 429


def test_a_flood_of_one_off_queues_never_locks_out_the_queues_nodes_are_there_for(
    make_store_node: Callable[..., Node], tmp_path: Path
) -> None:
    """5,000 one-off queues against a budget of 1,000 (not 50,000 against the default
    10,000: the same rule at a tenth of the cost), each job delayed an hour so its queue
    stays; then the queue the node serves takes a job that runs at once, and so do the
    queue an actor declares (`routed`: special) and a schedule's queue."""
    config = tmp_path / "schedules.toml"
    config.write_text(
        '[[schedules]]\nname = "tick"\ntype = "noop"\ncron = "0 0 1 1 *"\nqueue = "ticks"\n'
    )
    node = make_store_node(
        "--max-queues", "1000", "--queues", "served", "--workers", "1", "--config", str(config)
    )
    one_off = [{"type": "noop", "queue": f"once-{i}", "delay_seconds": 3600} for i in range(1000)]
    batch_enqueue(node, one_off)
    flood = node.post(
        "/jobs/batch",
        {"jobs": [{"type": "noop", "queue": f"more-{i}"} for i in range(500)]},
    ).body["results"]
    assert {r["status"] for r in flood} == {429}, flood[:2]  # the budget is full...
    job = node.enqueue(type="noop", queue="served", payload=1)  # ...but not for these
    node.wait_status(job["id"], "done", timeout=5)
    assert post(node, "special") == 201 and post(node, "ticks") == 201
    assert post(node, "once-7") == 201  # an existing queue, as always
    assert post(node, "more-0") == 429


def test_a_running_jobs_own_enqueue_is_held_to_the_budget_too(
    make_store_node: Callable[..., Node],
) -> None:
    node = make_store_node("--max-queues", "2", "--queues", "default", "--workers", "1")
    assert [post(node, q, delay_seconds=3600) for q in ("a", "b")] == [201, 201]
    children = [{"type": "noop", "options": {"queue": q}} for q in ("c", "a")]
    job = node.enqueue(type="parent", payload={"children": children})  # its queue: served
    done = node.wait_status(job["id"], "done", timeout=15)
    refused, taken = done["result"]
    assert refused["refusal"] == "unavailable" and "too many queues" in refused["error"]
    assert "id" in taken  # an existing queue takes a running job's work as any other
    assert node.get("/queues/c/stats").body["counts"].get("pending", 0) == 0


def test_batch_items_share_the_budget_with_each_other(make_store_node: Callable[..., Node]) -> None:
    node = make_store_node(*NOBODY, "--max-queues", "2")
    body = {"jobs": [{"type": "noop", "queue": q} for q in ("x", "y", "z", "x")]}
    results = send(node.url, "POST", "/jobs/batch", body=str(body).replace("'", '"').encode())
    assert [r["status"] for r in results.json["results"]] == [201, 201, 429, 201]
