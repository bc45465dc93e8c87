"""Flow control by key on real nodes (SQLite, memory, PostgreSQL, and two PostgreSQL
nodes): per-key peaks read from the jobs' own start and end times, other keys running
beside a key at its limit, a small key's turns among a big key's backlog, one key's jobs
in enqueue order."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from itertools import pairwise
from pathlib import Path

import goqueue
import pytest

from tests.conftest import Node, nodes_started_with, schema_args, wait_for

pytestmark = pytest.mark.timeout(120)

ACTORS = ("--actors", "keyedactors")


@pytest.fixture(params=["sqlite", "memory", "postgres"])
def start(request: pytest.FixtureRequest, make_node: Callable[..., Node]) -> Iterator[Callable]:
    """Nodes with the keyed actors on one store: a SQLite file each, memory, or one
    fresh PostgreSQL schema shared by every node the test starts."""
    kind = request.param
    if kind == "postgres":
        request.applymarker(pytest.mark.postgres)
        yield from nodes_started_with(make_node, *ACTORS, *schema_args("gq_keys"))
    elif kind == "memory":
        yield from nodes_started_with(make_node, *ACTORS, "--database-url", "memory://")
    else:
        yield from nodes_started_with(make_node, *ACTORS)


def enqueue(node: Node, jobs: list[dict]) -> list[str]:
    """Enqueue `jobs` in one batch, paused meanwhile (so the claims see them all); ids."""
    assert node.post("/queues/default/pause").status == 200
    reply = node.post("/jobs/batch", {"jobs": jobs})
    assert reply.status == 200, reply.body
    assert all(r["status"] == 201 for r in reply.body["results"]), reply.body
    assert node.post("/queues/default/resume").status == 200
    return [r["job"]["id"] for r in reply.body["results"]]


def finished(node: Node, job_type: str, count: int, timeout: float = 30) -> list[dict]:
    """The `count` jobs of `job_type`, once all are done."""

    def done() -> list[dict] | None:
        jobs = node.get(f"/jobs?type={job_type}&status=done&limit=1000").body["jobs"]
        return jobs if len(jobs) >= count else None

    return wait_for(done, timeout=timeout)


def peak(jobs: list[dict]) -> int:
    """The most of `jobs` running at once, by their own start and end times."""
    moments = sorted(
        [(j["result"]["started"], 1) for j in jobs] + [(j["result"]["ended"], -1) for j in jobs],
        key=lambda m: (m[0], m[1]),
    )
    most = running = 0
    for _, step in moments:
        running += step
        most = max(most, running)
    return most


def of_key(jobs: list[dict], key: str) -> list[dict]:
    return [j for j in jobs if j["concurrency_key"] == key]


def test_a_key_runs_at_most_its_limit_with_other_keys_beside_it(start: Callable) -> None:
    node = start("--workers", "4")
    spec = [{"type": "keyed", "concurrency_key": "big", "payload": {"sleep": 0.3}}] * 8
    spec += [{"type": "keyed", "concurrency_key": k, "payload": {"sleep": 0.3}} for k in "xy"]
    enqueue(node, spec)
    jobs = finished(node, "keyed", 10)
    assert peak(of_key(jobs, "big")) == 2, of_key(jobs, "big")
    assert peak(jobs) >= 3, jobs  # the other keys ran beside "big" at its limit
    listed = node.get("/jobs?concurrency_key=big&limit=100").body
    assert listed["total"] == 8 and {j["concurrency_key"] for j in listed["jobs"]} == {"big"}


def test_a_small_key_is_not_kept_behind_a_big_one(start: Callable) -> None:
    # Without workers' own queues, the order jobs start in is the order they were claimed
    # in (give or take the two workers): with them, one worker kept from running by a busy
    # machine holds its queued small jobs back while the other runs on, and the starts
    # would measure the machine, not the claim's turns.
    node = start("--workers", "2", "--prefetch", "0")
    spec = [{"type": "fair", "concurrency_key": "big", "payload": {"n": i}} for i in range(150)]
    spec += [{"type": "fair", "concurrency_key": "small", "payload": {"n": i}} for i in range(5)]
    enqueue(node, spec)
    jobs = finished(node, "fair", 155, timeout=60)
    jobs.sort(key=lambda j: (j["started_at"], j["result"]["started"]))
    first = [j["concurrency_key"] for j in jobs[:20]]
    assert first.count("small") == 5, first


def test_one_keys_jobs_run_one_at_a_time_in_enqueue_order(start: Callable) -> None:
    node = start("--workers", "3")
    ids = enqueue(
        node,
        [{"type": "sequence", "concurrency_key": "doc-7", "payload": {"n": i}} for i in range(8)]
        + [{"type": "sequence", "concurrency_key": "doc-8", "payload": {"n": i}} for i in range(2)],
    )
    jobs = finished(node, "sequence", 10)
    seven = sorted(of_key(jobs, "doc-7"), key=lambda j: j["result"]["started"])
    assert [j["id"] for j in seven] == ids[:8]
    assert peak(seven) == 1, seven


@pytest.mark.postgres
def test_a_key_limit_holds_across_two_nodes(make_node: Callable[..., Node]) -> None:
    nodes = nodes_started_with(make_node, *ACTORS, *schema_args("gq_keys2"))
    started = next(nodes)
    try:
        a, b = started("--workers", "3"), started("--workers", "3")
        spec = [{"type": "keyed", "concurrency_key": "big", "payload": {"sleep": 0.3}}] * 10
        spec += [{"type": "keyed", "concurrency_key": k, "payload": {"sleep": 0.3}} for k in "xyzw"]
        enqueue(a, spec)
        jobs = finished(b, "keyed", 14)
        assert peak(of_key(jobs, "big")) == 2, of_key(jobs, "big")
        assert peak(jobs) >= 3, jobs
        ran_on = {
            e["node"]
            for j in jobs
            for e in b.get(f"/jobs/{j['id']}/events").body["events"]
            if e["event"] == "started"
        }
        assert len(ran_on) == 2, ran_on  # both nodes took some
    finally:
        next(nodes, None)


def debounce(node: Node, n: int, **more: float) -> tuple[int, str]:
    """Enqueue `reindex` of document 7, debounced; the status and the job's id."""
    body = {"type": "reindex", "debounce_key": "doc-7", "payload": {"n": n}, **more}
    reply = node.post("/jobs", body)
    assert reply.status in (200, 201), reply.body
    return reply.status, reply.body["id"]


def test_a_burst_runs_once_with_the_last_payload(start: Callable) -> None:
    node = start("--workers", "2")
    answers = [debounce(node, n, debounce_seconds=1.0) for n in range(6)]
    assert [status for status, _ in answers] == [201] + [200] * 5
    assert len({job_id for _, job_id in answers}) == 1
    (job,) = finished(node, "reindex", 1)
    assert job["result"]["n"] == 5 and job["debounce_key"] == "doc-7"
    assert node.get("/jobs?type=reindex").body["total"] == 1
    bad = node.post("/jobs", {"type": "reindex", "debounce_key": "doc-7"})
    assert bad.status == 400 and "debounce_seconds" in str(bad.body), bad.body


def test_debounce_max_seconds_bounds_a_burst(start: Callable) -> None:
    node = start("--workers", "2")
    first = time.time()
    ids = []
    # a burst longer than the bound: an enqueue every 0.2 s for 2.5 s (the pace is the
    # test's input, not a wait)
    while time.time() - first < 2.5:
        ids.append(debounce(node, len(ids), debounce_seconds=0.5, debounce_max_seconds=1.0)[1])
        time.sleep(0.2)
    runs = finished(node, "reindex", len(set(ids)))
    assert len(set(ids)) >= 2, ids  # the bound cut the burst
    opened = min(runs, key=lambda j: j["created_at"])
    assert opened["result"]["started"] - first < 1.0 + 1.0, opened  # not put off past it


@pytest.mark.postgres
def test_debounce_holds_across_two_nodes(make_node: Callable[..., Node]) -> None:
    nodes = nodes_started_with(make_node, *ACTORS, *schema_args("gq_debounce"))
    started = next(nodes)
    try:
        a, b = started("--workers", "2"), started("--workers", "2")
        # at once, on both nodes: one row, under its lock
        with ThreadPoolExecutor(8) as pool:
            answers = list(
                pool.map(lambda n: debounce((a, b)[n % 2], n, debounce_seconds=1.5), range(16))
            )
        assert sorted(status for status, _ in answers) == [200] * 15 + [201], answers
        assert len({job_id for _, job_id in answers}) == 1
        (job,) = finished(b, "reindex", 1)
        assert job["result"]["n"] == job["payload"]["n"]
        # then one after the other: the last payload runs
        answers = [debounce((a, b)[n % 2], n, debounce_seconds=1.0) for n in range(4)]
        assert [status for status, _ in answers] == [201, 200, 200, 200]
        runs = finished(a, "reindex", 2)
        (second,) = [j for j in runs if j["id"] == answers[0][1]]
        assert second["result"]["n"] == 3
    finally:
        next(nodes, None)


def busiest(times: list[float], period: float = 1.0) -> int:
    """The most starts in any window of `period` seconds, sliding."""
    times, most, first = sorted(times), 0, 0
    for last, at in enumerate(times):
        while at - times[first] > period:
            first += 1
        most = max(most, last - first + 1)
    return most


def test_two_keys_are_paced_each_on_its_own(start: Callable) -> None:
    node = start("--workers", "3")
    enqueue(
        node,
        [{"type": "paced_keys", "concurrency_key": k} for k in ("a", "b") for _ in range(15)],
    )
    jobs = finished(node, "paced_keys", 30)
    starts = {k: [j["result"]["started"] for j in of_key(jobs, k)] for k in ("a", "b")}
    for key, times in starts.items():
        assert busiest(times) <= 5 + 1, (key, sorted(times))
        assert max(times) - min(times) > 1.5, (key, sorted(times))  # 15 at 5/s
        # and none waits past its turn by seconds: each start wakes the node in time
        assert max(b - a for a, b in pairwise(sorted(times))) < 1.5, (key, sorted(times))
    both = starts["a"] + starts["b"]
    assert busiest(both) >= 9, sorted(both)  # ten a second between them


def test_the_keys_at_their_limit_and_the_jobs_waiting_on_them_are_shown(
    start: Callable, tmp_path: Path
) -> None:
    node = start("--workers", "3")
    go = str(tmp_path / "go")
    jobs = [{"type": "held", "concurrency_key": "tenant-1", "payload": {"go": go}}] * 3
    jobs.append({"type": "held", "concurrency_key": "tenant-2", "payload": {"go": go}})
    ids = enqueue(node, jobs)

    def held() -> dict | None:
        types = node.get("/summary/keys").body["types"]
        shown = next((t for t in types if t["type"] == "held"), None)
        return shown if shown and shown["keys_at_limit"] == 2 and shown["waiting"] == 2 else None

    try:
        shown = wait_for(held, timeout=15)
        assert shown["key_concurrency"] == 1
        assert shown["keys"][0] == {"key": "tenant-1", "running": 1, "waiting": 2}
        assert node.get("/jobs?concurrency_key=tenant-1&status=pending").body["total"] == 2
        # a worker stayed idle while jobs waited on their key (once all three are up)
        series = 'goqueue_key_limit_waits_total{type="held"}'
        wait_for(lambda: series in node.get("/metrics").body, timeout=15)
    finally:
        Path(go).touch()
    for job_id in ids:
        node.wait_status(job_id, "done", timeout=30)
    assert wait_for(lambda: node.get("/summary/keys").body["types"][0]["keys_at_limit"] == 0)


def test_the_python_client_debounces_and_lists_a_keys_jobs(start: Callable) -> None:
    node = start("--workers", "2")
    with goqueue.Client(node.url) as client:
        first, created = client.submit(
            "reindex", {"n": 1}, debounce_key="doc-9", debounce_seconds=1.0
        )
        again, repeated = client.submit(
            "reindex", {"n": 2}, debounce_key="doc-9", debounce_seconds=1.0
        )
        assert created and not repeated and again.id == first.id
        done = client.wait(first.id, timeout=30)
        assert done.result["n"] == 2
        keyed = client.enqueue("keyed", {"sleep": 0}, concurrency_key="tenant-5")
        assert [j.id for j in client.list(concurrency_key="tenant-5")] == [keyed.id]
