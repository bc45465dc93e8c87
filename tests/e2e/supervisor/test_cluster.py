"""Several nodes on one PostgreSQL: exactly-once, crash recovery, global limits, dedupe,
a restart of the database itself, and a cancel made on a node other than the owner.
Real processes, real database."""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import Node, postgres_dsn, request, stop_node, wait_for
from tests.pgcluster import PgCluster

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(180)]


@pytest.fixture
def cluster(make_node) -> Iterator[Callable[..., Node]]:
    """A factory of nodes sharing one fresh schema of the test database."""
    yield from _nodes_on(make_node, postgres_dsn())


@pytest.fixture
def private_cluster(make_node, pg_cluster: PgCluster) -> Iterator[Callable[..., Node]]:
    """The same, on a private PostgreSQL the test may stop, crash and restart."""
    yield from _nodes_on(make_node, pg_cluster.dsn)


def _nodes_on(make_node, dsn: str) -> Iterator[Callable[..., Node]]:
    schema = f"gq_cluster_{uuid.uuid4().hex[:10]}"
    nodes: list[Node] = []

    def make(*args: str, session: bool = False, wait: bool = True) -> Node:
        db = ("--database-url", dsn, "--database-schema", schema)
        node = make_node(*db, *args, session=session, wait=wait)
        nodes.append(node)
        return node

    yield make
    for node in nodes:  # before the schema goes: a drain still writes to it
        stop_node(node)
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def counted_runs(tmp_path: Path) -> Counter[str]:
    log = tmp_path / "runs.log"
    lines = log.read_text().splitlines() if log.exists() else []
    return Counter(line.split()[0] for line in lines)


def batch_enqueue(node: Node, jobs: list[dict]) -> list[str]:
    ids = []
    for start in range(0, len(jobs), 500):
        resp = node.post("/jobs/batch", {"jobs": jobs[start : start + 500]})
        assert resp.status == 200, resp
        ids += [r["job"]["id"] for r in resp.body["results"]]
    return ids


def all_done(node: Node, total: int) -> bool:
    counts = node.get("/stats").body["counts"]
    return counts["done"] == total


def test_two_nodes_run_2000_jobs_exactly_once(cluster, tmp_path: Path) -> None:
    a = cluster("--workers", "2")
    b = cluster("--workers", "2")
    jobs = [{"type": "counted", "payload": {"dir": str(tmp_path)}} for _ in range(2000)]
    ids = batch_enqueue(a, jobs[:1000]) + batch_enqueue(b, jobs[1000:])
    wait_for(lambda: all_done(a, 2000), timeout=120, interval=0.2)
    runs = counted_runs(tmp_path)
    assert set(runs) == set(ids)
    assert max(runs.values()) == 1
    pids = {line.split()[1] for line in (tmp_path / "runs.log").read_text().splitlines()}
    assert len(pids) >= 3  # work was spread over both nodes' workers


def test_killing_a_node_loses_nothing(cluster, tmp_path: Path) -> None:
    victim = cluster("--workers", "2", "--lease-seconds", "2", session=True)
    survivor = cluster("--workers", "2", "--lease-seconds", "2")
    jobs = [{"type": "sleep", "payload": {"seconds": 0.05, "dir": str(tmp_path)}}] * 300
    ids = batch_enqueue(survivor, jobs)
    wait_for(lambda: len(list(tmp_path.glob("done-*"))) >= 30, timeout=60)
    os.killpg(victim.proc.pid, signal.SIGKILL)
    victim.proc.wait(timeout=10)
    wait_for(lambda: all_done(survivor, 300), timeout=90, interval=0.2)
    done = {p.name[5:] for p in tmp_path.glob("done-*")}
    assert done == set(ids)
    reaped = [
        e
        for i in ids
        for e in survivor.get(f"/jobs/{i}/events").body["events"]
        if e["event"] == "lease_expired"
    ]
    assert all(e["node"] for e in reaped)


def test_a_job_that_kills_its_node_every_time_ends_in_the_dlq(cluster, tmp_path: Path) -> None:
    watcher = cluster("--workers", "1", "--lease-seconds", "2", "--queues", "none")
    job = watcher.enqueue(type="killnode", payload={"dir": str(tmp_path)}, max_retries=1)
    for attempt in (1, 2):
        # not waiting for /ready: the node may claim the job and die before answering
        node = cluster("--workers", "1", "--lease-seconds", "2", session=True, wait=False)
        node.proc.wait(timeout=30)  # the job kills it
        wait_for(
            lambda a=attempt: (
                (tmp_path / "kills.log").read_text().split() == [str(i) for i in range(1, a + 1)]
            ),
            timeout=10,
        )
        if attempt == 1:
            wait_for(
                lambda: watcher.get(f"/jobs/{job['id']}").body["status"] == "pending", timeout=30
            )
    failed = watcher.wait_status(job["id"], "failed", timeout=30)
    assert failed["attempts"] == 2
    assert "lease expired" in failed["last_error"]
    letters = watcher.get("/dlq").body["dead_letters"]
    assert [d["job_id"] for d in letters] == [job["id"]]


def test_global_type_limit_across_two_nodes(cluster, tmp_path: Path) -> None:
    a = cluster("--workers", "3")
    b = cluster("--workers", "3")
    jobs = [{"type": "limited3", "payload": {"dir": str(tmp_path), "seconds": 0.3}}] * 12
    batch_enqueue(a, jobs)
    wait_for(lambda: all_done(b, 12), timeout=60, interval=0.2)
    seen = [int(x) for x in (tmp_path / "seen.log").read_text().split()]
    assert len(seen) == 12
    assert max(seen) == 3


def test_forty_concurrent_enqueues_with_one_dedupe_key_on_two_nodes(cluster) -> None:
    nodes = [cluster("--workers", "1"), cluster("--workers", "1")]
    statuses: list[int] = []
    barrier = threading.Barrier(40)

    def enqueue(i: int) -> None:
        barrier.wait()
        body = {"type": "noop", "dedupe_key": "same", "dedupe_window_seconds": 60}
        statuses.append(request("POST", nodes[i % 2].url + "/jobs", body).status)

    threads = [threading.Thread(target=enqueue, args=(i,)) for i in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(Counter(statuses).items()) == [(201, 1), (409, 39)]


def test_database_restart_loses_nothing_and_completes_once(
    private_cluster, pg_cluster: PgCluster, tmp_path: Path
) -> None:
    a = private_cluster("--workers", "2")
    b = private_cluster("--workers", "2")
    jobs = [{"type": "counted", "payload": {"dir": str(tmp_path)}}] * 400
    ids = batch_enqueue(a, jobs)
    wait_for(lambda: len(counted_runs(tmp_path)) >= 50, timeout=60)
    pg_cluster.restart()
    wait_for(lambda: request("GET", a.url + "/ready").status == 200, timeout=60)
    late = batch_enqueue(b, jobs[:100])
    wait_for(lambda: all_done(a, 500), timeout=120, interval=0.3)
    runs = counted_runs(tmp_path)
    assert set(runs) == set(ids + late)
    assert max(runs.values()) == 1


def test_database_down_answers_503_holds_outcomes_and_recovers(
    private_cluster, pg_cluster: PgCluster, tmp_path: Path
) -> None:
    node = private_cluster("--workers", "2")
    job = node.enqueue(type="sleep", payload={"seconds": 3.0, "dir": str(tmp_path)})
    wait_for(lambda: node.get(f"/jobs/{job['id']}").body["status"] == "running", timeout=20)
    pg_cluster.stop()
    try:
        assert node.get("/health").status == 200
        wait_for(lambda: node.get("/ready").status == 503, timeout=15)
        started = time.monotonic()
        refused = node.post("/jobs", {"type": "noop"})
        assert refused.status == 503, refused
        assert time.monotonic() - started < 12
        assert node.get(f"/jobs/{job['id']}").status == 503
        # the attempt finishes while the database is down; its outcome is held
        wait_for(lambda: (tmp_path / f"done-{job['id']}").exists(), timeout=20)
    finally:
        pg_cluster.start()
    wait_for(lambda: node.get("/ready").status == 200, timeout=60)
    done = node.wait_status(job["id"], "done", timeout=60)
    assert done["attempts"] == 1
    after = node.enqueue(type="noop", payload=1)
    node.wait_status(after["id"], "done", timeout=30)


def last_tick(path: Path) -> float | None:
    lines = path.read_text().split() if path.exists() else []
    return float(lines[-1]) if lines else None


def test_a_cancel_on_another_node_kills_the_owners_worker_at_once(cluster, tmp_path: Path) -> None:
    owner = cluster("--workers", "1")
    job = owner.post("/jobs", {"type": "ticker", "payload": {"dir": str(tmp_path)}}).body
    ticks = tmp_path / f"ticks-{job['id']}"
    wait_for(lambda: last_tick(ticks), what="the handler's first tick")
    other = cluster("--workers", "1")  # idle: nothing left for it to claim
    resp = request("DELETE", f"{other.url}/jobs/{job['id']}?force=true")
    answered = time.time()
    assert resp.status == 200, resp
    assert resp.body["status"] == "cancelled"

    def stopped() -> bool:
        tick = last_tick(ticks)
        return tick is not None and time.time() - tick > 0.5

    wait_for(stopped, timeout=5, what="the handler to stop ticking")
    # the lease check alone would let it run on for several seconds
    assert last_tick(ticks) - answered < 1.0, (last_tick(ticks), answered)
    wait_for(lambda: "job cancelled on another node" in owner.logs(), timeout=5)
    assert job["id"] in owner.logs()
    assert "lease lost" not in owner.logs()
    assert "job cancelled on another node" not in other.logs()


def test_a_transaction_left_open_shows_in_the_metrics(cluster) -> None:
    import psycopg

    node = cluster("--workers", "1")
    holder = psycopg.connect(postgres_dsn(), application_name="report")
    try:
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT 1")

        def oldest() -> float:
            text = node.get("/metrics").body
            line = next(x for x in text.splitlines() if x.startswith(SNAPSHOT_AGE))
            return float(line.split()[-1])

        # the node looks every 10 s: its gauge then shows the open transaction's age
        wait_for(lambda: oldest() > 1.0, timeout=40, interval=0.5)
    finally:
        holder.close()
    assert node.get("/ready").status == 200  # a warning at most: the node still works


SNAPSHOT_AGE = "goqueue_store_oldest_snapshot_seconds "


def test_a_node_alone_announces_no_work_and_one_that_joins_hears_of_it(make_node) -> None:
    """A node alone on its database sends no new-work NOTIFY. A second node announces
    itself, and from then on the first announces the work it commits: the second claims
    it at once, not at its next sweep (every 5 s) or after a heartbeat told the first
    (every 40 s with 120 s leases)."""
    import psycopg
    from goqueue.supervisor.settings.stores import channel

    schema = f"gq_alone_{uuid.uuid4().hex[:10]}"
    db = ("--database-url", postgres_dsn(), "--database-schema", schema)
    slow_beat = ("--lease-seconds", "120")
    listen = psycopg.connect(postgres_dsn(), autocommit=True)
    nodes: list[Node] = []

    def notes_from(node: Node, timeout: float) -> list[str]:
        name = node.get("/workers").body["node"]
        return [n.payload for n in listen.notifies(timeout=timeout) if n.payload.split()[0] == name]

    try:
        listen.execute(f"LISTEN {channel(schema)}")
        alone = make_node(*db, *slow_beat, "--queues", "mine")
        nodes.append(alone)
        theirs = [{"type": "noop", "queue": "theirs"} for _ in range(20)]
        for _ in range(5):  # each batch's commit leaves pending jobs, announced until now
            assert alone.post("/jobs/batch", {"jobs": theirs}).status == 200
        heard = notes_from(alone, 0.5)
        assert len(heard) <= 1, heard  # at most its own joining, none of the batches

        joined = make_node(*db, *slow_beat, "--queues", "theirs")
        nodes.append(joined)
        wait_for(lambda: alone.get("/stats").body["counts"].get("done") == 100, timeout=20)
        wait_for(lambda: "another node is on this database" in alone.logs(), timeout=5)
        notes_from(alone, 0.2)  # the wake-up for what it committed alone, if still coming
        done = alone.post("/jobs/batch", {"jobs": theirs}).body["results"]
        assert notes_from(alone, 2.0)  # this batch is announced
        for job_id in [r["job"]["id"] for r in done]:
            alone.wait_status(job_id, "done", timeout=10)
    finally:
        listen.close()
        for node in nodes:
            stop_node(node)
        with psycopg.connect(postgres_dsn(), autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
