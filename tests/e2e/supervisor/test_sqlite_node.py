"""The SQLite store on real nodes (`goqueue serve`, HTTP on loopback), killed with a real
`kill -9` of the whole process group: every `201` is there after the restart, a job
running at the kill runs again and finishes once, a poison job that kills its node is
dead-lettered rather than rerun forever, schedules fire a tick once, owed webhooks are
delivered, a second node on the file is refused, a bad file is one line. Without a
database option a node keeps its jobs in `goqueue.db` in its working directory."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import Node, request, wait_for
from tests.e2e.supervisor.test_schedule_nodes import beat, config, fires
from tests.e2e.supervisor.test_webhook_delivery import LOOPBACK, Receiver, deliveries, kill_group

pytestmark = pytest.mark.timeout(120)

DB = ("--database-url", "sqlite:///jobs.db")  # in the test's folder, the nodes' cwd
MakeNode = Callable[..., Node]


def test_every_201_before_a_kill_9_is_there_after_the_restart(make_node: MakeNode) -> None:
    a = make_node(*DB, session=True)
    accepted: list[str] = []
    stop = threading.Event()

    def produce() -> None:
        while not stop.is_set():
            try:
                resp = request("POST", a.url + "/jobs", {"type": "noop", "payload": 1})
            except OSError:
                return  # the node is gone
            if resp.status == 201:
                accepted.append(resp.body["id"])

    producers = [threading.Thread(target=produce) for _ in range(4)]
    for producer in producers:
        producer.start()
    wait_for(lambda: len(accepted) >= 300, timeout=30, what="300 jobs accepted")
    kill_group(a)  # producers still posting
    stop.set()
    for producer in producers:
        producer.join(timeout=20)
    b = make_node(*DB)
    missing = [i for i in accepted if b.get(f"/jobs/{i}").status != 200]
    assert missing == [], f"{len(missing)} of {len(accepted)} accepted jobs lost"
    wait_for(
        lambda: b.get("/stats").body["counts"]["done"] >= len(accepted),
        timeout=60,
        what="every accepted job done after the restart",
    )


def test_a_job_running_at_a_kill_9_runs_again_and_finishes_once(
    make_node: MakeNode, tmp_path: Path
) -> None:
    a = make_node(*DB, session=True)
    job = a.enqueue(type="sleep", payload={"seconds": 2.0, "dir": str(tmp_path)})
    a.wait_status(job["id"], "running")
    kill_group(a)
    b = make_node(*DB)
    done = b.wait_status(job["id"], "done", timeout=30)
    assert done["attempts"] == 2  # the killed attempt counted
    assert (tmp_path / f"done-{job['id']}").read_text() == "2"
    kinds = [e["event"] for e in b.get(f"/jobs/{job['id']}/events").body["events"]]
    assert kinds.count("started") == 2 and kinds.count("succeeded") == 1
    assert "lease_expired" in kinds


def test_a_job_that_kills_its_node_is_dead_lettered_not_rerun_forever(
    make_node: MakeNode, tmp_path: Path
) -> None:
    kills = tmp_path / "kills.log"
    a = make_node(*DB, session=True)
    job = a.enqueue(type="killnode", payload={"dir": str(tmp_path)})  # max_retries=1
    wait_for(lambda: a.proc.poll() is not None, timeout=20, what="the job killed its node")
    b = make_node(*DB, session=True, wait=False)  # reaped: attempt 1 counted, runs again
    wait_for(lambda: b.proc.poll() is not None, timeout=30, what="the retry killed it again")
    c = make_node(*DB)
    dead = c.wait_status(job["id"], "failed", timeout=30)
    assert dead["attempts"] == 2
    assert kills.read_text().split() == ["1", "2"]
    assert c.get(f"/dlq/{job['id']}").status == 200


def test_a_schedule_tick_fires_once_across_a_kill_9(make_node: MakeNode, tmp_path: Path) -> None:
    schedule = config(tmp_path, beat(every=1))
    start = ("--actors", "scheduledactors", "--workers", "1", "--config", str(schedule), *DB)
    a = make_node(*start, session=True)
    wait_for(lambda: len(fires(a)) >= 2, timeout=20, what="two ticks fired")
    kill_group(a)
    b = make_node(*start)
    before = len(fires(b))
    wait_for(lambda: len(fires(b)) >= before + 2, timeout=20, what="two more ticks")
    ticks = Counter(tick for tick, _ in fires(b))
    assert [t for t, n in ticks.items() if n > 1] == []


@pytest.fixture
def flaky_receiver() -> Iterator[tuple[Receiver, threading.Event]]:
    """A receiver on 127.0.0.1 answering 503 until the event is set, then 200."""
    back = threading.Event()
    made = Receiver(lambda n: (200 if back.is_set() else 503, 0.0))
    yield made, back
    made.close()


def test_webhooks_owed_at_a_kill_9_are_delivered_after_the_restart(
    make_node: MakeNode, flaky_receiver: tuple[Receiver, threading.Event]
) -> None:
    receiver, back = flaky_receiver
    a = make_node(*DB, *LOOPBACK, "--node-id", "node-a", session=True)
    job = a.enqueue(type="noop", webhook_url=receiver.url)
    a.wait_status(job["id"], "done")
    wait_for(lambda: any(d["attempts"] for d in deliveries(a, job["id"])), timeout=15)
    kill_group(a)
    back.set()
    b = make_node(*DB, *LOOPBACK, "--node-id", "node-b")
    [delivered] = wait_for(lambda: receiver.answered(200), timeout=30)
    assert delivered.headers["X-GoQueue-Job-Id"] == job["id"]
    [view] = wait_for(lambda: [d for d in deliveries(b, job["id"]) if d["delivered_at"]])
    assert view["attempts"][-1]["node"] == "node-b"
    assert {x["node"] for x in view["attempts"][:-1]} == {"node-a"}


def test_a_lost_lease_names_the_node_that_died_not_the_one_that_took_over(
    make_node: MakeNode, tmp_path: Path
) -> None:
    a = make_node(*DB, "--node-id", "node-a", session=True)
    job = a.enqueue(type="sleep", payload={"seconds": 2.0, "dir": str(tmp_path)})
    a.wait_status(job["id"], "running")
    kill_group(a)
    b = make_node(*DB, "--node-id", "node-b")
    done = b.wait_status(job["id"], "done", timeout=30)
    errors = [e["error"] for e in done["errors"]]
    assert errors == ["lease expired (holder node-a lost)"], done["errors"]


def test_a_second_node_on_the_file_is_refused_in_one_line(make_node: MakeNode) -> None:
    a = make_node(*DB)
    b = make_node(*DB, wait=False)
    assert b.proc.wait(timeout=20) != 0
    [line] = b.logs().splitlines()  # one line, and nothing before it
    assert "cannot start: SQLite file jobs.db is in use by another GoQueue node" in line
    assert "Traceback" not in b.logs()
    # refused before it listens, and nothing else said about a file it never opened
    assert '"listening"' not in b.logs() and "SQLite file closed" not in b.logs()
    assert a.get("/ready").status == 200


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("sqlite:///missing/jobs.db", "the folder missing does not exist"),
        ("sqlite:///.", "is a directory"),
    ],
)
def test_a_file_that_cannot_be_used_is_one_line_and_a_failed_start(
    make_node: MakeNode, url: str, says: str
) -> None:
    node = make_node("--database-url", url, wait=False)
    assert node.proc.wait(timeout=20) != 0
    [line] = [x for x in node.logs().splitlines() if "cannot start" in x]
    assert says in line
    assert "Traceback" not in node.logs()


def test_a_sqlite_url_without_a_file_is_a_usage_error(make_node: MakeNode) -> None:
    node = make_node("--database-url", "sqlite://", wait=False)
    assert node.proc.wait(timeout=20) != 0
    assert "database_url" in node.logs() and "Traceback" not in node.logs()


def test_without_a_database_option_jobs_are_kept_in_goqueue_db(
    make_node: MakeNode, tmp_path: Path
) -> None:
    a = make_node(default_store=True)
    job = a.enqueue(type="noop", delay_seconds=3600)
    assert (tmp_path / "goqueue.db").exists()
    a.signal(15)
    assert a.proc.wait(timeout=15) == 0
    b = make_node(default_store=True)
    assert b.get(f"/jobs/{job['id']}").body["status"] == "pending"
