"""Worker processes of a real `goqueue serve`: tied to their supervisor, killed on time,
held to a memory limit, isolated from each other, respawned with backoff. Real nodes,
real HTTP on loopback, PostgreSQL where leases matter."""

from __future__ import annotations

import os
import re
import shutil
import signal
import statistics
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import Node, postgres_dsn, stays_true, stop_node, wait_for

pytestmark = pytest.mark.timeout(90)


def alive(pid: int) -> bool:
    """True while a process exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(") ", 1)[1][0] != "Z"


def children_of(pid: int) -> list[int]:
    """Live processes whose parent is `pid`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue
        fields = stat.rsplit(") ", 1)[1].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(entry))
    return found


def workers_of(supervisor: int) -> list[int]:
    """Every live process started as a worker of `supervisor`, whoever its parent is now
    (an orphan is adopted by init, but its command line still names its supervisor)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except (FileNotFoundError, ProcessLookupError):
            continue
        ours = b"goqueue.actors.child" in argv and argv[-2:-1] == [str(supervisor).encode()]
        if ours and alive(int(entry)):
            found.append(int(entry))
    return found


def metric(node: Node, name: str, labels: str) -> float | None:
    text = node.get("/metrics").body
    match = re.search(rf"^{re.escape(name)}\{{{re.escape(labels)}\}} (\S+)$", text, re.M)
    return float(match.group(1)) if match else None


# -- tied to the supervisor ----------------------------------------------------------------


def test_kill_9_of_the_supervisor_takes_every_worker_with_it(make_node, tmp_path: Path) -> None:
    node = make_node("--workers", "3")
    node.enqueue(type="spin", payload={"dir": str(tmp_path)}, timeout_seconds=120)
    spinner = int(wait_for(lambda: list(tmp_path.glob("spin-*")), timeout=10)[0].read_text())
    supervisor = node.proc.pid
    workers = wait_for(lambda: len(children_of(supervisor)) == 3 and children_of(supervisor))
    assert spinner in workers and set(workers) == set(workers_of(supervisor))
    node.proc.kill()
    killed = time.monotonic()
    node.proc.wait(timeout=5)
    wait_for(lambda: not any(alive(pid) for pid in workers), timeout=3, interval=0.005)
    gone_after = time.monotonic() - killed
    print(f"\nkill -9 of the supervisor: all 3 workers gone after {gone_after * 1000:.0f} ms")
    # "within about 1 s": PDEATHSIG acts at once, the margin is for a loaded machine
    assert gone_after < 2.0, f"workers outlived the supervisor by {gone_after:.3f}s"
    assert workers_of(supervisor) == []  # nothing it started lives on, reparented or not


def test_a_job_that_kills_its_own_worker_costs_its_siblings_nothing(
    make_node, tmp_path: Path
) -> None:
    node = make_node("--workers", "3")
    where = tmp_path / "jobs"
    where.mkdir()
    siblings = [
        node.enqueue(type="sleep", payload={"seconds": 1.5, "dir": str(where)}) for _ in range(2)
    ]
    wait_for(lambda: node.get("/stats").body["workers"]["busy"] == 2)
    killer = node.enqueue(type="kill_own_worker")
    failed = node.wait_status(killer["id"], "failed", timeout=10)
    assert re.fullmatch(
        r"worker \d+ killed by SIGKILL while running the job", failed["last_error"]
    ), failed
    for job in siblings:
        done = node.wait_status(job["id"], "done", timeout=10)
        assert done["attempts"] == 1 and done["errors"] == []
    assert sorted(p.name for p in where.iterdir()) == sorted(f"done-{j['id']}" for j in siblings)


# -- the hard timeout ------------------------------------------------------------------------


def test_hard_timeout_kills_fast_and_the_replacement_runs_the_next_job(
    make_node, tmp_path: Path
) -> None:
    """The deadline's SIGTERM, 50 ms, SIGKILL; then a fresh worker takes the next job.
    Medians over 5 runs: deadline to dead, and deadline to the next job running."""
    node = make_node("--workers", "1")
    to_dead, to_next = [], []
    for run in range(5):
        where = tmp_path / str(run)
        where.mkdir()
        timeout = 0.5
        job = node.enqueue(type="spin", payload={"dir": str(where)}, timeout_seconds=timeout)
        marker = wait_for(lambda w=where: list(w.glob("spin-*")), timeout=10, interval=0.002)[0]
        started = marker.stat().st_mtime  # written as the handler starts
        pid = int(marker.read_text())
        after = node.enqueue(type="record", payload={"dir": str(where), "label": "next"})
        wait_for(lambda p=pid: not alive(p), timeout=5, interval=0.001)
        dead = time.time()
        node.wait_status(after["id"], "done", timeout=10)
        ran = (where / "order.log").stat().st_mtime
        deadline = started + timeout
        to_dead.append(dead - deadline)
        to_next.append(ran - deadline)
        node.wait_status(job["id"], "failed")
    dead_ms, next_ms = statistics.median(to_dead) * 1000, statistics.median(to_next) * 1000
    print(f"\nhard timeout: deadline->dead median {dead_ms:.0f} ms {sorted(to_dead)}")
    print(f"hard timeout: deadline->next job ran median {next_ms:.0f} ms {sorted(to_next)}")
    assert dead_ms < 300, to_dead  # ~55 ms measured: 50 ms of SIGTERM grace, then SIGKILL
    assert next_ms < 1000, to_next  # ~200 ms measured on a quiet machine


# -- memory --------------------------------------------------------------------------------


def test_a_job_over_the_memory_limit_is_killed_before_it_gets_far(
    make_node, tmp_path: Path
) -> None:
    node = make_node("--workers", "1", "--max-worker-rss-mb", "300")
    assert metric(node, "goqueue_worker_restarts_total", 'reason="memory"') == 0.0
    job = node.enqueue(type="memory_hog", payload={"dir": str(tmp_path), "mb": 1500, "step": 50})
    failed = node.wait_status(job["id"], "failed", timeout=30)
    assert failed["last_error"].startswith("exceeded the memory limit (300 MB)"), failed
    assert failed["attempts"] == 1 and failed["result"] is None
    logged = [int(line) for line in (tmp_path / "hog.log").read_text().split()]
    assert 200 <= max(logged) < 1024, logged  # it never got near 1 GB, let alone 1.5
    wait_for(lambda: metric(node, "goqueue_worker_restarts_total", 'reason="memory"') == 1.0)
    after = node.enqueue(type="noop", payload=5)  # a fresh worker took the place
    assert node.wait_status(after["id"], "done")["result"] == 5


def test_a_result_over_the_limit_fails_without_retry(make_node) -> None:
    node = make_node("--max-result-bytes", "1000")
    small = node.enqueue(type="big_result", payload={"size": 998})
    assert node.wait_status(small["id"], "done")["result"] == "x" * 998
    big = node.enqueue(type="big_result", payload={"size": 5000}, max_retries=3)
    failed = node.wait_status(big["id"], "failed")
    assert failed["last_error"] == "result is 5002 bytes, over the limit of 1000"
    assert failed["attempts"] == 1 and failed["result"] is None


# -- spawn failures ------------------------------------------------------------------------


def nofile(pid: int) -> tuple[int, int]:
    """The soft and hard limits of open files of process `pid`."""
    line = Path(f"/proc/{pid}/limits").read_text().split("Max open files")[1].split()
    return int(line[0]), int(line[1])


def set_soft_nofile(pid: int, soft: int) -> None:
    """Lower (or restore) only the soft limit: a hard one could not be raised back."""
    hard = nofile(pid)[1]
    subprocess.run(["prlimit", f"--pid={pid}", f"--nofile={soft}:{hard}"], check=True)


@pytest.mark.skipif(shutil.which("prlimit") is None, reason="needs prlimit (util-linux)")
def test_a_worker_that_cannot_be_spawned_is_retried_with_backoff(make_node) -> None:
    node = make_node("--workers", "1")
    supervisor = node.proc.pid
    (worker,) = wait_for(lambda: children_of(supervisor))
    soft = nofile(supervisor)[0]
    set_soft_nofile(supervisor, 3)  # no descriptor can be opened: no socket pair, no pidfd
    try:
        os.kill(worker, signal.SIGKILL)
        wait_for(lambda: node.logs().count("cannot start a worker") >= 2, timeout=10)
        # three more seconds of ticks (6) with the limit still in place
        stays_true(
            lambda: node.logs().count("cannot start a worker") <= 5,
            for_seconds=3,
            what="a failed spawn retried on every tick, not with backoff",
        )
        failures = node.logs().count("cannot start a worker")
    finally:
        set_soft_nofile(supervisor, soft)
    assert 2 <= failures <= 5, failures  # retried at 0.5, 1, 2, 4 s: not on every tick
    assert "supervisor tick failed" not in node.logs()
    assert "Too many open files" in node.logs()
    job = node.enqueue(type="noop", payload=1)  # the spawn succeeds once descriptors free up
    assert node.wait_status(job["id"], "done", timeout=40)["result"] == 1


# -- a frozen supervisor (PostgreSQL) ----------------------------------------------------------


@pytest.fixture
def pg_node(make_node) -> Iterator[tuple[Callable[..., Node], str, str]]:
    """A factory of nodes on a fresh schema of the test database, with the DSN and schema."""
    dsn, schema = postgres_dsn(), f"gq_workers_{uuid.uuid4().hex[:10]}"
    nodes: list[Node] = []

    def make(*args: str) -> Node:
        node = make_node("--database-url", dsn, "--database-schema", schema, *args)
        nodes.append(node)
        return node

    yield make, dsn, schema
    for node in nodes:
        if node.proc.poll() is None:
            node.proc.send_signal(signal.SIGCONT)
        stop_node(node)
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


@pytest.mark.postgres
def test_a_frozen_supervisor_lets_no_job_run_past_its_lease(pg_node, tmp_path: Path) -> None:
    make, dsn, schema = pg_node
    node = make("--workers", "1", "--lease-seconds", "3")
    job = node.enqueue(type="hold", payload={"dir": str(tmp_path), "seconds": 30})
    pid = int(wait_for(lambda: list(tmp_path.glob("hold-*")), timeout=10)[0].read_text())
    import psycopg

    query = f"SELECT lease_expires_at FROM {schema}.jobs WHERE id = %s"
    node.signal(signal.SIGSTOP)
    stopped = time.time()
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            expires = conn.execute(query, (job["id"],)).fetchone()[0].timestamp()
        wait_for(lambda: not alive(pid), timeout=10, interval=0.005)
        died = time.time()
    finally:
        node.signal(signal.SIGCONT)
    assert died < expires, f"the worker outlived the lease by {died - expires:.2f}s"
    assert died - stopped < 3.0  # within its allowance (0.6 x 3 s) of the last word
    failed = node.wait_status(job["id"], "failed", timeout=20)  # max_retries=0
    assert "allowance" in failed["last_error"] or "lease" in failed["last_error"], failed
    assert not list(tmp_path.glob("done-*"))  # the attempt never completed
