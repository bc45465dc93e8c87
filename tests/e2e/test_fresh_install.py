"""The whole producer's story in a fresh virtualenv with only `pip install` of this
checkout: a node on the project's own actors, started from the project folder, and a
script that enqueues with the client and with `.send()`, waits for the results, and
enqueues inside a psycopg transaction that it rolls back (no job) or commits (it runs)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import psycopg
import pytest

from tests.conftest import ROOT, free_port, postgres_dsn, request, wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(300)]

TASKS = """
from goqueue import actor


@actor("greet", queue="greetings", priority=7)
def greet(payload, ctx):
    return {"hello": payload["name"], "queue": ctx.queue}
"""

SCRIPT = """
import os

import psycopg

import goqueue
import goqueue.pg
from myapp.tasks import greet

client = goqueue.Client()
job = client.enqueue("greet", {"name": "client"})
print("client", client.wait(job.id, timeout=60).result)

goqueue.configure(url=os.environ["GOQUEUE_URL"])
sent = greet.send({"name": "send"})
print("send", sent.priority, client.wait(sent.id, timeout=60).result)

with psycopg.connect(os.environ["DATABASE_URL"]) as conn:
    dropped = goqueue.pg.enqueue(conn, "greet", {"name": "rolled back"})
    conn.rollback()
    kept = goqueue.pg.enqueue(conn, greet, {"name": "committed"})
    conn.commit()
try:
    client.get(dropped.id)
except goqueue.NotFound:
    print("rolled back: no job")
print("committed", client.wait(kept.id, timeout=60).result)
"""


def test_a_fresh_virtualenv_runs_the_producers_story(tmp_path: Path) -> None:
    dsn = postgres_dsn()
    schema = f"gq_fresh_{uuid.uuid4().hex[:10]}"
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", str(ROOT)],
        check=True,
        timeout=240,
        capture_output=True,
    )
    project = tmp_path / "myproject"
    (project / "myapp").mkdir(parents=True)
    (project / "myapp" / "__init__.py").write_text("")
    (project / "myapp" / "tasks.py").write_text(textwrap.dedent(TASKS))
    (project / "produce.py").write_text(textwrap.dedent(SCRIPT))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {
        "PATH": f"{venv / 'bin'}:{os.environ['PATH']}",
        "DATABASE_URL": dsn,
        "GOQUEUE_DATABASE_SCHEMA": schema,
        "GOQUEUE_URL": url,
        # Until the node puts its working directory on the import path by itself.
        "PYTHONPATH": ".",
    }
    log = tmp_path / "node.log"
    serve = ["goqueue", "serve", "--actors", "myapp.tasks", "--port", str(port)]
    with open(log, "wb") as out:
        node = subprocess.Popen(
            [*serve, "--host", "127.0.0.1", "--workers", "1"],
            cwd=project,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:

        def ready() -> bool:
            assert node.poll() is None, log.read_text()
            try:
                return request("GET", url + "/ready").status == 200
            except OSError:
                return False

        wait_for(ready, timeout=60)
        ran = subprocess.run(
            [str(venv / "bin" / "python"), "produce.py"],
            cwd=project,
            env={k: v for k, v in env.items() if k != "PYTHONPATH"},  # a script's own folder
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert ran.returncode == 0, ran.stderr + log.read_text()[-3000:]
        assert ran.stdout.splitlines() == [
            "client {'hello': 'client', 'queue': 'greetings'}",
            "send 7 {'hello': 'send', 'queue': 'greetings'}",
            "rolled back: no job",
            "committed {'hello': 'committed', 'queue': 'greetings'}",
        ]
        installed = subprocess.run(
            [str(venv / "bin" / "python"), "-c", "import goqueue; print(goqueue.__file__)"],
            capture_output=True,
            text=True,
            check=True,
            cwd=tmp_path,
        ).stdout
        assert installed.startswith(str(venv)), installed  # not this checkout's folders
    finally:
        node.send_signal(signal.SIGTERM)
        assert node.wait(timeout=30) == 0, log.read_text()[-3000:]
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
