"""The `goqueue` command against a real node: every field a job can carry (chained
templates, results, progress, errors) is printed by the table and key/value commands and
by `--json`, and `enqueue --on-success` answers once, with exit 0 (it used to store the
job, then crash on the template's payload, so a retrying script enqueued twice)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Node, wait_for

pytestmark = pytest.mark.timeout(90)

TEMPLATE = {
    "type": "noop",
    "payload": {"step": 2, "tags": ["a", "b"]},
    "on_failure": {"type": "noop", "payload": {"alert": True}},
}


def goqueue(node: Node, *argv: str) -> subprocess.CompletedProcess[str]:
    """Run the `goqueue` command in a fresh process against `node`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GOQUEUE_")}
    return subprocess.run(
        [sys.executable, "-m", "goqueue.api.cli.main", *argv, "--url", node.url],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
    )


def ok(node: Node, *argv: str) -> str:
    """Its standard output, after checking it exited 0 without a traceback."""
    done = goqueue(node, *argv)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    return done.stdout


def chained(node: Node) -> dict[str, Any]:
    """A finished job with both templates and a result (from the HTTP API)."""
    job = node.enqueue(
        type="noop", payload={"n": 1}, on_success=TEMPLATE, on_failure={"type": "noop"}
    )
    return node.wait_status(job["id"], "done")


def test_enqueue_with_templates_answers_once_and_prints_them(node: Node) -> None:
    out = ok(
        node,
        "enqueue",
        "noop",
        "--payload",
        '{"n": 1}',
        "--on-success",
        json.dumps(TEMPLATE),
        "--on-failure",
        '{"type": "noop", "payload": [1, 2]}',
    )
    assert out.startswith("enqueued job ")
    assert '"step":2' in out and '"alert":true' in out and "[1,2]" in out
    listed = node.get("/jobs?type=noop").body
    assert listed["total"] >= 1
    roots = [j for j in listed["jobs"] if j["parent_id"] is None]
    assert len(roots) == 1  # stored once


def test_jobs_table_and_json_list_chained_jobs(node: Node) -> None:
    job = chained(node)
    wait_for(lambda: node.get("/jobs?type=noop").body["total"] >= 2, what="the chained job")
    table = ok(node, "jobs")
    assert job["id"] in table and "showing 1-" in table
    listed = json.loads(ok(node, "jobs", "--json"))
    mine = next(j for j in listed["jobs"] if j["id"] == job["id"])
    assert mine["on_success"]["payload"] == TEMPLATE["payload"]
    assert mine["on_success"]["on_failure"]["payload"] == {"alert": True}
    assert mine["on_failure"] == {**mine["on_failure"], "type": "noop", "payload": None}
    assert mine["result"] == {"n": 1}


def test_job_prints_every_field_of_a_chained_job(node: Node) -> None:
    job = chained(node)
    out = ok(node, "job", job["id"])
    lines = {line.split()[0]: line for line in out.splitlines() if line and line[0] != " "}
    assert '"step":2' in lines["on_success"] and '"alert":true' in lines["on_success"]
    assert '"type":"noop"' in lines["on_failure"]
    assert lines["result"].split(None, 1)[1] == '{"n":1}'
    assert lines["status"].split()[1] == "done"
    shown = json.loads(ok(node, "job", job["id"], "--json"))
    assert shown["on_success"]["payload"] == TEMPLATE["payload"]


def test_job_shows_a_running_jobs_progress(node: Node, tmp_path: Path) -> None:
    job = node.enqueue(
        type="reporter",
        payload={"reports": [{"done": 4, "of": 10}], "dir": str(tmp_path)},
        on_success={"type": "noop", "payload": {"after": "report"}},
    )
    try:
        wait_for(lambda: node.get(f"/jobs/{job['id']}").body.get("progress"), what="progress")
        out = ok(node, "job", job["id"])
        progress = [line for line in out.splitlines() if line.startswith("progress")]
        assert progress and progress[0].split(None, 1)[1] == '{"done":4,"of":10}', out
        shown = json.loads(ok(node, "job", job["id"], "--json"))
        assert shown["progress"] == {"done": 4, "of": 10}
    finally:
        (tmp_path / "go").write_text("")  # the handler's cue to finish
    node.wait_status(job["id"], "done")


def test_dlq_list_and_show_a_dead_chained_job(node: Node) -> None:
    job = node.enqueue(type="failnow", payload={"why": "test"}, on_success=TEMPLATE, max_retries=0)
    node.wait_status(job["id"], "failed")
    dead = wait_for(lambda: node.get("/dlq").body["dead_letters"], what="a dead letter")
    out = ok(node, "dlq", "list")
    assert dead[0]["id"] in out and "failnow" in out
    listed = json.loads(ok(node, "dlq", "list", "--json"))
    assert listed["dead_letters"][0]["job"]["on_success"]["payload"] == TEMPLATE["payload"]
    shown = ok(node, "dlq", "show", dead[0]["id"])
    assert '"step":2' in shown and "bad input, do not retry" in shown


# -- papercuts: what the command line says ------------------------------------------------


def test_cancel_of_a_running_job_names_the_flag(node: Node, tmp_path: Path) -> None:
    job = node.enqueue(type="spin", payload={"dir": str(tmp_path)})
    wait_for(lambda: next(tmp_path.glob("spin-*"), None), what="the job spinning")
    try:
        refused = goqueue(node, "cancel", job["id"])
        assert refused.returncode == 1
        hint = f"goqueue cancel: job {job['id']} is running: add --force to kill it\n"
        assert refused.stderr == hint
        assert "cancelled" in ok(node, "cancel", job["id"], "--force")
    finally:
        node.delete(f"/jobs/{job['id']}?force=true")  # a spinning job would outlive the node


def test_every_bare_group_accepts_list(node: Node) -> None:
    assert ok(node, "schedules", "list") == ok(node, "schedules")
    assert ok(node, "dlq", "list").startswith("no dead letters")
    assert ok(node, "jobs", "list") == ok(node, "jobs")
    assert ok(node, "queues", "list") == ok(node, "queues")


def run_help(*argv: str, cwd: Path | None = None) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "goqueue.api.cli.main", *argv, "--help"],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=cwd,
    )
    assert done.returncode == 0, done.stderr
    return " ".join(done.stdout.split())


def test_help_texts_say_what_is_true() -> None:
    top = run_help()
    assert "--url URL" in top and "GLOBAL_URL" not in top
    migrate = run_help("migrate")
    assert "in-memory store" not in migrate
    assert "(default: none: it must be given;" in migrate
    assert "(default: the SQLite file goqueue.db in the working" in run_help("serve")


def test_bench_is_listed_only_where_a_checkout_offers_it(tmp_path: Path) -> None:
    show = (
        "import argparse, pathlib, sys\n"
        "from goqueue.api.cli.main import add_bench\n"
        "parser = argparse.ArgumentParser(prog='goqueue')\n"
        "commands = parser.add_subparsers(metavar='COMMAND')\n"
        "add_bench(commands, pathlib.Path(sys.argv[1]))\n"
        "parser.print_help()\n"
        "sys.exit(parser.parse_args(['bench']).func(None))\n"
    )
    elsewhere = subprocess.run(
        [sys.executable, "-c", show, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=tmp_path,  # no benchmarks/ here, nor on the path
    )
    assert "bench" not in elsewhere.stdout  # not listed...
    assert (
        elsewhere.returncode == 2 and "needs a source checkout" in elsewhere.stderr
    )  # ...but says
    assert "benchmark GoQueue" in run_help()  # this checkout offers it
    own_help = subprocess.run(
        [sys.executable, "-c", show.replace("['bench']", "['bench', '--help']"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=tmp_path,
    )
    assert "Benchmark GoQueue on this machine" in own_help.stdout  # it says what it is
    assert "needs a source checkout" in " ".join(own_help.stdout.split())
    assert "--jobs" in run_help("bench") and "Start nodes on 127.0.0.1" in run_help("bench")


def test_an_unknown_type_gets_a_suggestion(node: Node) -> None:
    resp = node.post("/jobs", {"type": "nooop"})
    assert resp.status == 400
    assert resp.body["error"].endswith("no actor of that name is registered; did you mean 'noop'?")
    assert resp.body["details"] == {"field": "type", "type": "nooop"}
    chained = node.post("/jobs", {"type": "noop", "on_success": {"type": "echo_asnyc"}})
    assert "did you mean 'echo_async'?" in chained.body["error"]
    assert chained.body["details"]["field"] == "on_success.type"
    far = node.post("/jobs", {"type": "zzzzzz"})
    assert "did you mean" not in far.body["error"]
    refused = goqueue(node, "enqueue", "nooop")
    assert refused.returncode == 1 and "did you mean 'noop'?" in refused.stderr
