"""Signals to a real `goqueue serve`: drain, drain timeout, reload, TTIN/TTOU, QUIT."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.conftest import FIXTURES, wait_for

pytestmark = pytest.mark.timeout(60)


def workers(node) -> dict[str, int]:
    return node.get("/stats").body["workers"]


def test_sigterm_drains_a_running_job_and_exits_zero(make_node, tmp_path: Path) -> None:
    node = make_node("--shutdown-grace", "10")
    job = node.enqueue(type="sleep", payload={"seconds": 1.0, "dir": str(tmp_path)})
    wait_for(lambda: node.get(f"/jobs/{job['id']}").body["status"] == "running")
    node.signal(signal.SIGTERM)
    wait_for(lambda: node.get("/ready").status == 503, timeout=5)
    refused = node.post("/jobs", {"type": "noop"})
    assert refused.status == 503
    assert node.get(f"/jobs/{job['id']}").status == 200  # reads keep working
    assert node.proc.wait(timeout=20) == 0
    assert (tmp_path / f"done-{job['id']}").exists()


def test_drain_timeout_kills_and_hands_the_job_back(make_node, tmp_path: Path) -> None:
    node = make_node("--shutdown-grace", "0.5")
    job = node.enqueue(type="spin", payload={"dir": str(tmp_path)}, timeout_seconds=60)
    pid = int(wait_for(lambda: list(tmp_path.glob("spin-*")), timeout=10)[0].read_text())
    node.signal(signal.SIGTERM)
    assert node.proc.wait(timeout=20) == 0
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text()
    logs = node.logs()
    assert "draining" in logs and job["id"] not in [
        line for line in logs.splitlines() if "dead-lettered" in line
    ]
    (ran_out,) = [line for line in logs.splitlines() if "shutdown grace ran out" in line]
    assert "killing 1 running job and handing it back" in ran_out and job["id"] in ran_out


def test_sighup_reloads_actor_code_with_the_same_pid(make_node, tmp_path: Path) -> None:
    pkg = tmp_path / "mods"
    pkg.mkdir()
    module = pkg / "reloadable.py"
    module.write_text(
        "from goqueue.actors import actor\n\n@actor('version')\ndef version(payload, ctx):\n"
        "    return 'v1'\n"
    )
    env = {"PYTHONPATH": os.pathsep.join([str(pkg), str(FIXTURES)])}
    node = make_node("--actors", "reloadable", env=env)
    first = node.enqueue(type="version")
    assert node.wait_status(first["id"], "done")["result"] == "v1"
    module.write_text(
        "from goqueue.actors import actor\n\n@actor('version')\ndef version(payload, ctx):\n"
        "    return 'version two'\n\n@actor('added')\ndef added(payload, ctx):\n"
        "    return 'new type'\n"
    )
    pid = node.proc.pid
    node.signal(signal.SIGHUP)

    def reloaded() -> bool:
        return node.post("/jobs", {"type": "added"}).status == 201

    wait_for(reloaded, timeout=15)
    job = node.enqueue(type="version")
    assert node.wait_status(job["id"], "done")["result"] == "version two"
    assert node.proc.pid == pid and node.proc.poll() is None


def test_sighup_with_broken_code_keeps_the_old_code(make_node, tmp_path: Path) -> None:
    pkg = tmp_path / "mods"
    pkg.mkdir()
    module = pkg / "breakable.py"
    module.write_text(
        "from goqueue.actors import actor\n\n@actor('ok')\ndef ok(p, ctx):\n    return 1\n"
    )
    env = {"PYTHONPATH": os.pathsep.join([str(pkg), str(FIXTURES)])}
    node = make_node("--actors", "breakable", env=env)
    wait_for(lambda: workers(node)["idle"] == 2)  # both booted on the good code
    module.write_text("this is not python (\n")
    node.signal(signal.SIGHUP)
    wait_for(lambda: "reload aborted" in node.logs(), timeout=15)
    job = node.enqueue(type="ok")
    assert node.wait_status(job["id"], "done")["result"] == 1


def test_ttin_and_ttou_change_the_worker_count(make_node) -> None:
    node = make_node("--workers", "2")
    node.signal(signal.SIGTTIN)
    wait_for(lambda: workers(node)["idle"] + workers(node)["busy"] == 3, timeout=10)
    # one at a time: two identical pending signals may be delivered as one
    node.signal(signal.SIGTTOU)
    wait_for(lambda: sum(workers(node).values()) == 2, timeout=10)
    node.signal(signal.SIGTTOU)
    wait_for(lambda: sum(workers(node).values()) == 1, timeout=10)
    node.signal(signal.SIGTTOU)  # never below one
    job = node.enqueue(type="noop", payload=3)
    assert node.wait_status(job["id"], "done")["result"] == 3
    assert sum(workers(node).values()) == 1


def test_sigquit_exits_fast(make_node, tmp_path: Path) -> None:
    node = make_node()
    node.enqueue(type="spin", payload={"dir": str(tmp_path)}, timeout_seconds=60)
    wait_for(lambda: list(tmp_path.glob("spin-*")), timeout=10)
    node.signal(signal.SIGQUIT)
    assert node.proc.wait(timeout=10) == 0


def test_sighup_applies_new_limits_from_the_config_file(make_node, tmp_path: Path) -> None:
    config = tmp_path / "goqueue.toml"
    config.write_text("[limits]\nlimited3 = 1\n")
    node = make_node("--workers", "4", "--config", str(config))
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()

    def run_batch(where: Path) -> int:
        jobs = [
            node.enqueue(type="limited3", payload={"dir": str(where), "seconds": 0.2})
            for _ in range(6)
        ]
        for job in jobs:
            node.wait_status(job["id"], "done", timeout=30)
        return max(int(x) for x in (where / "seen.log").read_text().split())

    assert run_batch(first) == 1
    config.write_text("[limits]\nlimited3 = 2\n")
    node.signal(signal.SIGHUP)
    wait_for(lambda: '"reloaded"' in node.logs(), timeout=15)
    # old workers are replaced one by one: let the new generation finish booting, so the
    # batch finds two workers free for the new limit of two
    wait_for(lambda: node.get("/stats").body["workers"]["idle"] == 4, timeout=30)
    assert run_batch(second) == 2
