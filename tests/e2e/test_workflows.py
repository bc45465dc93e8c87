"""Workflows end to end: real `goqueue serve` processes, real HTTP, on each store. What
ran, and when, is judged from the steps' own log lines (`flowactors` logs each run's
start and end, as `faultactors.mark` does)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import goqueue
import pytest

from tests.conftest import Node, stays_true, wait_for
from tests.e2e.conftest import NodeSet
from tests.e2e.supervisor.test_webhook_delivery import kill_group
from tests.e2e.support import read_runs

pytestmark = pytest.mark.timeout(120)

ACTORS = "testactors,faultactors,flowactors"
STEP = "flow.step"
SQLITE = ("--database-url", "sqlite:///jobs.db")  # in the test's folder, the node's cwd


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def flow_node(
    request: pytest.FixtureRequest, make_node: Callable[..., Node], tmp_path: Path
) -> Node:
    """A node running the workflow actors, on each store."""
    if request.param == "memory":
        return make_node("--actors", ACTORS, "--workers", "4")
    if request.param == "sqlite":
        return make_node("--actors", ACTORS, "--workers", "4", *SQLITE)
    nodes: NodeSet = request.getfixturevalue("pg_nodes")
    return nodes.start("--actors", ACTORS, workers=4)


def step(key: str, directory: Path, after: list[str] | None = None, **payload: Any) -> dict:
    """One step of `flow.step` as POST /workflows takes it."""
    body: dict[str, Any] = {"key": key, "dir": str(directory), **payload}
    return {"key": key, "type": STEP, "payload": body, "after": after or []}


def create(node: Node, *steps: dict, name: str = "wf", **headers: str) -> dict:
    resp = node.post("/workflows", {"name": name, "jobs": list(steps)}, headers=headers)
    assert resp.status == 201, resp
    return resp.body


def wait_workflow(node: Node, wf_id: str, *statuses: str, timeout: float = 30) -> dict:
    def check() -> dict | None:
        body = node.get(f"/workflows/{wf_id}").body
        return body if body["status"] in statuses else None

    return wait_for(check, timeout, what=f"workflow {wf_id} {' or '.join(statuses)}")


def by_key(workflow: dict) -> dict[str, dict]:
    return {s["key"]: s for s in workflow["jobs"]}


def runs_of(directory: Path, workflow: dict) -> dict[str, list]:
    """Each step's runs (by key), from the run log."""
    runs = read_runs(directory)
    return {s["key"]: runs.get(s["id"], []) for s in workflow["jobs"]}


def test_a_chain_runs_in_order_and_its_results_flow(flow_node: Node, tmp_path: Path) -> None:
    with goqueue.Client(flow_node.url) as client:
        wf = goqueue.chain(
            goqueue.task(STEP, {"key": "a", "value": 1, "dir": str(tmp_path)}, queue="flows"),
            (STEP, {"key": "b", "value": 2, "dir": str(tmp_path)}),
            (STEP, {"key": "c", "value": 3, "dir": str(tmp_path)}),
        ).workflow("three")
        run = client.submit(wf)
        assert [s.key for s in run.jobs] == ["flow.step", "flow.step-2", "flow.step-3"]
        done = client.wait_workflow(run.id, timeout=30)
        assert done.status == "done", done
        a, b, c = (client.get(s.id) for s in done.jobs)
    assert a.queue == "flows"
    assert c.result["parents"] == {"flow.step-2": b.result}
    assert b.result["parents"] == {"flow.step": {"key": "a", "value": 1, "parents": {}}}
    assert c.parents == {"flow.step-2": b.result}  # the same dict GET /jobs/{id} shows
    assert c.workflow_id == run.id and c.parent_ids == [b.id] and c.step_key == "flow.step-3"
    runs = runs_of(tmp_path, {"jobs": [{"key": s.key, "id": s.id} for s in done.jobs]})
    (ra,), (rb,), (rc,) = runs["flow.step"], runs["flow.step-2"], runs["flow.step-3"]
    assert ra.end is not None and rb.end is not None
    assert ra.end <= rb.start and rb.end <= rc.start


def test_fan_out_then_fan_in_joins_after_every_leaf(flow_node: Node, tmp_path: Path) -> None:
    leaves = [step(f"leaf{i}", tmp_path, ["root"], seconds=0.05 * i) for i in range(6)]
    made = create(
        flow_node,
        step("root", tmp_path),
        *leaves,
        step("join", tmp_path, [leaf["key"] for leaf in leaves]),
    )
    assert by_key(made)["join"]["status"] == "waiting"

    def scraped() -> str | None:  # a store read slower than a scrape waits: the next has it
        metrics = str(flow_node.get("/metrics").body)
        return metrics if 'goqueue_workflows{status="running"} 1.0' in metrics else None

    metrics = wait_for(scraped, what="the running workflow in /metrics")
    assert "goqueue_workflow_steps_waiting " in metrics
    done = wait_workflow(flow_node, made["id"], "done", "failed")
    assert done["status"] == "done"
    runs = runs_of(tmp_path, done)
    (join,) = runs["join"]
    assert all(len(runs[f"leaf{i}"]) == 1 for i in range(6))
    assert max(runs[f"leaf{i}"][0].end for i in range(6)) <= join.start
    job = flow_node.get(f"/jobs/{by_key(done)['join']['id']}").body
    assert set(job["parents"]) == {f"leaf{i}" for i in range(6)}
    assert sorted(job["parent_ids"]) == sorted(by_key(done)[f"leaf{i}"]["id"] for i in range(6))
    assert job["workflow_id"] == made["id"]


def test_a_failure_cancels_exactly_its_dependents_and_replay_resumes(
    flow_node: Node, tmp_path: Path
) -> None:
    made = create(
        flow_node,
        step("ok", tmp_path),
        step("bad", tmp_path, fail=True, once=True),
        step("after_bad", tmp_path, ["bad"]),
        step("deeper", tmp_path, ["after_bad", "ok"]),
        step("after_ok", tmp_path, ["ok"]),
    )
    failed = wait_workflow(flow_node, made["id"], "failed")

    def settled() -> dict | None:
        now = flow_node.get(f"/workflows/{made['id']}").body
        return now if by_key(now)["after_ok"]["status"] == "done" else None

    failed = wait_for(settled, 30, what="the independent branch done")
    statuses = {k: s["status"] for k, s in by_key(failed).items()}
    assert statuses == {
        "ok": "done",
        "bad": "failed",
        "after_bad": "cancelled",
        "deeper": "cancelled",
        "after_ok": "done",
    }
    deeper = flow_node.get(f"/jobs/{by_key(failed)['deeper']['id']}").body
    assert "'bad'" in deeper["last_error"]
    assert runs_of(tmp_path, failed)["deeper"] == []  # never ran

    letter = flow_node.get(f"/dlq/{by_key(failed)['bad']['id']}").body  # by its job's id
    assert flow_node.post(f"/dlq/{letter['id']}/replay").status in (200, 201)
    resumed = wait_workflow(flow_node, made["id"], "done", timeout=30)
    steps = by_key(resumed)
    assert steps["bad"]["id"] != by_key(failed)["bad"]["id"]  # the fresh job took its place
    runs = runs_of(tmp_path, resumed)
    assert [len(runs[k]) for k in ("after_bad", "deeper", "after_ok")] == [1, 1, 1]
    assert runs["bad"][0].end is not None and runs["bad"][0].end <= runs["after_bad"][0].start
    deeper = flow_node.get(f"/jobs/{steps['deeper']['id']}").body
    assert set(deeper["parents"]) == {"after_bad", "ok"}


def test_a_failed_workflow_stays_running_while_an_independent_step_runs(
    flow_node: Node, tmp_path: Path
) -> None:
    made = create(
        flow_node,
        step("bad", tmp_path, fail=True),
        step("after_bad", tmp_path, ["bad"]),
        step("slow", tmp_path, seconds=2),
    )
    ids = {s["key"]: s["id"] for s in made["jobs"]}
    flow_node.wait_status(ids["bad"], "failed")
    flow_node.wait_status(ids["slow"], "running")
    assert flow_node.get(f"/workflows/{made['id']}").body["status"] == "running"
    listed = flow_node.get("/workflows?status=running").body["workflows"]
    assert made["id"] in {w["id"] for w in listed}
    failed = wait_workflow(flow_node, made["id"], "failed", "done")
    assert failed["status"] == "failed"
    statuses = {k: s["status"] for k, s in by_key(failed).items()}
    assert statuses == {"bad": "failed", "after_bad": "cancelled", "slow": "done"}


def test_cancel_stops_the_whole_workflow(flow_node: Node, tmp_path: Path) -> None:
    made = create(
        flow_node,
        step("slow", tmp_path, seconds=60),
        step("waits", tmp_path, ["slow"]),
        step("later", tmp_path, ["waits"]),
    )
    slow = by_key(made)["slow"]["id"]
    wait_for(lambda: runs_of(tmp_path, made)["slow"], 20, what="the slow step running")
    resp = flow_node.delete(f"/workflows/{made['id']}")
    assert resp.status == 200, resp
    assert resp.body["status"] == "cancelled"
    assert {s["status"] for s in resp.body["jobs"]} == {"cancelled"}
    assert flow_node.delete(f"/workflows/{made['id']}").status == 409
    flow_node.wait_status(slow, "cancelled")
    # its worker was killed: the run started and never ended, and nothing else ran

    def nothing_more() -> bool:
        runs = runs_of(tmp_path, made)
        slow_runs = runs["slow"]
        return len(slow_runs) == 1 and slow_runs[0].end is None and not runs["waits"]

    stays_true(nothing_more, 2.0, what="only the killed slow step ever ran")
    assert runs_of(tmp_path, made)["later"] == []


def test_invalid_workflows_are_refused_with_nothing_stored(flow_node: Node) -> None:
    one = {"key": "a", "type": STEP}
    cases: list[tuple[Any, int, str, str]] = [
        ({"name": "w", "jobs": []}, 400, "jobs", "at least one step"),
        ({"name": "w", "jobs": [one, one]}, 400, "jobs[1].key", "duplicate key 'a'"),
        (
            {"name": "w", "jobs": [one, {"key": "b", "type": STEP, "after": ["zz"]}]},
            400,
            "jobs[1].after[0]",
            "unknown key 'zz'",
        ),
        (
            {
                "name": "w",
                "jobs": [
                    one,
                    {"key": "x", "type": STEP, "after": ["z", "a"]},
                    {"key": "y", "type": STEP, "after": ["x"]},
                    {"key": "z", "type": STEP, "after": ["y"]},
                ],
            },
            400,
            "jobs",
            "cycle: x -> y -> z -> x",
        ),
        (
            {"name": "w", "jobs": [one, one | {"key": "b"}, one | {"key": "c"}, {"key": "d"}]},
            400,
            "jobs[3].type",
            "type",
        ),
        (
            {"name": "w", "jobs": [one, {"key": "b", "type": "no.such.actor"}]},
            400,
            "jobs[1].type",
            "unknown job type",
        ),
        (
            {"name": "w", "jobs": [one | {"priority": 99}]},
            400,
            "jobs[0].priority",
            "<= 10",
        ),
        (
            {"name": "w", "jobs": [one | {"unique_key": "u"}]},
            400,
            "jobs[0].unique_key",
            "not allowed",
        ),
        ({"name": "w", "jobs": [one], "extra": 1}, 400, "extra", "unknown field"),
    ]
    for body, status, field, words in cases:
        resp = flow_node.post("/workflows", body)
        assert resp.status == status, (body, resp)
        assert words in resp.body["error"], (body, resp.body)
        assert resp.body["details"]["field"] == field, (body, resp.body)
    too_many = [{"key": f"k{i}", "type": STEP} for i in range(10_001)]
    resp = flow_node.post("/workflows", {"name": "big", "jobs": too_many})
    assert resp.status == 413, resp
    assert resp.body["details"]["max_workflow_jobs"] == 10_000
    assert flow_node.get("/workflows").body["total"] == 0
    assert sum(flow_node.get("/stats").body["counts"].values()) == 0


def test_idempotency_key_answers_the_first_workflow(flow_node: Node, tmp_path: Path) -> None:
    body = {"name": "once", "jobs": [step("a", tmp_path)]}
    first = flow_node.post("/workflows", body, headers={"Idempotency-Key": "wf-1"})
    again = flow_node.post("/workflows", body, headers={"Idempotency-Key": "wf-1"})
    assert (first.status, again.status) == (201, 200)
    assert first.body["id"] == again.body["id"]
    other = {"name": "other", "jobs": [step("a", tmp_path)]}
    assert flow_node.post("/workflows", other, headers={"Idempotency-Key": "wf-1"}).status == 422
    listed = flow_node.get("/workflows?status=running").body
    assert listed["total"] in (0, 1)  # it may be done already
    assert flow_node.get("/workflows").body["total"] == 1


def test_a_2000_step_workflow_is_accepted_quickly(flow_node: Node, tmp_path: Path) -> None:
    steps = [{"key": "s0", "type": STEP, "payload": {"key": "s0", "dir": str(tmp_path)}}]
    steps += [
        {"key": f"s{i}", "type": STEP, "after": [f"s{i - 1}"], "run_at": "2099-01-01T00:00:00Z"}
        for i in range(1, 2000)
    ]
    started = time.perf_counter()
    resp = flow_node.post("/workflows", {"name": "long", "jobs": steps})
    took = time.perf_counter() - started
    assert resp.status == 201, resp
    print(f"\n2000-step workflow accepted in {took * 1000:.0f} ms")
    assert len(resp.body["jobs"]) == 2000
    counts = flow_node.get("/stats").body["counts"]
    assert counts["waiting"] + counts["pending"] + counts["running"] + counts["done"] == 2000


def test_python_group_then_callback_is_a_chord(flow_node: Node, tmp_path: Path) -> None:
    parts = [(STEP, {"key": f"m{i}", "value": i, "dir": str(tmp_path)}) for i in range(3)]
    chord = goqueue.group(parts).then((STEP, {"key": "sum", "dir": str(tmp_path)}))
    with goqueue.Client(flow_node.url) as client:
        run = client.submit(chord)  # named for what it is
        assert run.name == "chord"
        done = client.wait_workflow(run.id, timeout=30)
        callback = client.get(done.job("flow.step-4").id)
    assert done.status == "done"
    assert sorted(r["value"] for r in callback.result["parents"].values()) == [0, 1, 2]


async def test_the_async_client_submits_and_waits(flow_node: Node, tmp_path: Path) -> None:
    wf = goqueue.Workflow("async")
    first = wf.add(STEP, {"key": "one", "dir": str(tmp_path)}, key="one")
    wf.add(STEP, {"key": "two", "dir": str(tmp_path)}, key="two", after=[first])
    async with goqueue.AsyncClient(flow_node.url) as client:
        run = await client.submit(wf)
        done = await client.wait_workflow(run.id, timeout=30)
    assert done.status == "done" and [s.key for s in done.jobs] == ["one", "two"]


def test_a_40_parent_fan_in_across_two_nodes_joins_exactly_once(
    pg_nodes: NodeSet, tmp_path: Path
) -> None:
    one = pg_nodes.start("--actors", ACTORS, workers=4)
    two = pg_nodes.start("--actors", ACTORS, workers=4)
    parents = [step(f"p{i}", tmp_path, seconds=0.02) for i in range(40)]
    made = create(one, *parents, step("join", tmp_path, [p["key"] for p in parents]))
    done = wait_workflow(two, made["id"], "done", "failed", timeout=60)
    assert done["status"] == "done"
    runs = runs_of(tmp_path, done)
    assert len(runs["join"]) == 1, runs["join"]
    assert all(len(runs[f"p{i}"]) == 1 for i in range(40))
    nodes_used = {runs[f"p{i}"][0].pgid for i in range(40)}
    assert nodes_used == {one.proc.pid, two.proc.pid}  # both nodes completed parents
    join = one.get(f"/jobs/{by_key(done)['join']['id']}").body
    assert len(join["parents"]) == 40


def test_a_workflow_survives_a_node_killed_mid_way(pg_nodes: NodeSet, tmp_path: Path) -> None:
    first = pg_nodes.start("--actors", ACTORS)
    root = step("root", tmp_path) | {"delay_seconds": 2}
    made = create(first, root, step("next", tmp_path, ["root"]), step("last", tmp_path, ["next"]))
    pg_nodes.kill_all()  # kill -9, before the delayed root is due
    assert runs_of(tmp_path, made)["root"] == []
    second = pg_nodes.start("--actors", ACTORS)
    done = wait_workflow(second, made["id"], "done", "failed", timeout=60)
    assert done["status"] == "done"
    runs = runs_of(tmp_path, done)
    assert [len(runs[k]) for k in ("root", "next", "last")] == [1, 1, 1]


def test_a_workflow_on_sqlite_goes_on_after_kill_9s_between_its_steps(
    make_node: Callable[..., Node], tmp_path: Path
) -> None:
    """Each kill -9 lands between steps: the next node on the file goes on from what the
    last one wrote (released steps, a failure's cancelled dependents, a replay)."""
    node = make_node("--actors", ACTORS, *SQLITE, session=True)
    made = create(
        node,
        step("a", tmp_path),
        step("bad", tmp_path, ["a"], fail=True, once=True),
        step("b", tmp_path, ["a"]),
        step("join", tmp_path, ["b", "bad"]),
    )
    ids = {s["key"]: s["id"] for s in made["jobs"]}
    wait_workflow(node, made["id"], "failed")
    node.wait_status(ids["b"], "done")
    kill_group(node)

    node = make_node("--actors", ACTORS, *SQLITE, session=True)
    failed = node.get(f"/workflows/{made['id']}").body
    assert {k: s["status"] for k, s in by_key(failed).items()} == {
        "a": "done",
        "bad": "failed",
        "b": "done",
        "join": "cancelled",
    }
    # the replay waits in a paused queue, so the kill cannot land while it runs (a killed
    # attempt of a step without retries would be dead-lettered again, rightly)
    assert node.post("/queues/default/pause").status == 200
    letter = node.get(f"/dlq/{ids['bad']}").body  # by its job's id
    assert node.post(f"/dlq/{letter['id']}/replay").status in (200, 201)
    kill_group(node)  # the replay is answered, so it is in the file

    node = make_node("--actors", ACTORS, *SQLITE)
    assert node.get(f"/workflows/{made['id']}").body["status"] == "running"
    assert node.post("/queues/default/resume").status == 200
    done = wait_workflow(node, made["id"], "done", "failed", timeout=60)
    runs = runs_of(tmp_path, done)
    assert done["status"] == "done", done
    assert [len(runs[k]) for k in ("a", "b", "join")] == [1, 1, 1]
    join = node.get(f"/jobs/{by_key(done)['join']['id']}").body
    assert set(join["parents"]) == {"b", "bad"}
