"""A node's start, as an operator meets it: a database that is down, a stop signal during
boot, a port that is taken, and a first run with one's own actors from a project folder
through the real `goqueue` console script."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import free_port, postgres_dsn, request, stop_node, wait_for
from tests.pgcluster import PgCluster

pytestmark = pytest.mark.timeout(120)

GOQUEUE = Path(sys.executable).parent / "goqueue"  # the console script, as users run it


class Started:
    """A `goqueue serve` started from a folder of our choosing, its output in a file."""

    def __init__(self, cwd: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = cwd / f"node-{self.port}.log"
        environ = {"PATH": str(GOQUEUE.parent), "HOME": os.environ.get("HOME", "/")}
        environ.update(env or {})
        argv = [str(GOQUEUE), "serve", "--host", "127.0.0.1", "--port", str(self.port), *args]
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                argv, cwd=cwd, env=environ, stdout=out, stderr=subprocess.STDOUT
            )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def get(self, path: str):  # type: ignore[no-untyped-def]
        return request("GET", self.url + path)

    def answers(self) -> bool:
        try:
            return self.get("/health").status == 200
        except OSError:
            return False

    def ready(self) -> bool:
        assert self.proc.poll() is None, f"node exited {self.proc.returncode}:\n{self.output()}"
        try:
            return self.get("/ready").status == 200
        except OSError:
            return False

    def run(self, job_type: str, payload: object = None) -> dict:
        job = request("POST", self.url + "/jobs", {"type": job_type, "payload": payload})
        assert job.status == 201, job

        def finished() -> dict | None:
            found = self.get(f"/jobs/{job.body['id']}").body
            return found if found["status"] in ("done", "failed") else None

        return wait_for(finished, timeout=20)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)
            raise AssertionError(f"node ignored SIGTERM:\n{self.output()[-3000:]}") from None


@pytest.fixture
def started(tmp_path: Path) -> Iterator[type[Started]]:
    made: list[Started] = []

    class Tracked(Started):
        def __init__(self, *args: str, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]
            made.append(self)

    yield Tracked
    for node in made:
        if node.proc.poll() is None:
            node.stop()


TASKS = """\
from goqueue import actor


@actor("greet")
def greet(payload, ctx):
    return {"hello": payload["name"]}
"""


def project(root: Path, package: str = "myapp", body: str = TASKS) -> Path:
    (root / package).mkdir(parents=True)
    (root / package / "__init__.py").write_text("")
    (root / package / "tasks.py").write_text(body)
    return root


# -- first run with one's own actors ---------------------------------------------------------


def test_a_project_folder_is_on_the_workers_import_path(started, tmp_path: Path) -> None:
    node = started(project(tmp_path), "--actors", "myapp.tasks", "--workers", "1")
    wait_for(node.ready, timeout=30)
    assert node.run("greet", {"name": "you"})["result"] == {"hello": "you"}
    assert node.stop() == 0


def test_path_puts_more_folders_on_the_import_path(started, tmp_path: Path) -> None:
    project(tmp_path / "src", "layout")
    project(tmp_path / "more", "other", TASKS.replace('"greet"', '"other"'))
    node = started(
        tmp_path,
        "--path", "src", "--actors", "layout.tasks,other.tasks", "--workers", "1",
        env={"GOQUEUE_PATH": "unused"},  # the flag wins over the variable...
    )  # fmt: skip
    wait_for(lambda: node.proc.poll() is not None or node.ready(), timeout=30)
    assert node.proc.poll() == 3  # ...so `more` is not on the path: other.tasks is missing
    assert "No module named 'other'" in node.output()
    node = started(
        tmp_path,
        "--path", "src", "--path", "more", "--actors", "layout.tasks,other.tasks",
        "--workers", "1",
    )  # fmt: skip
    wait_for(node.ready, timeout=30)
    assert node.run("other", {"name": "b"})["result"] == {"hello": "b"}
    assert node.stop() == 0
    node = started(
        tmp_path, "--actors", "layout.tasks", "--workers", "1", env={"GOQUEUE_PATH": "src"}
    )
    wait_for(node.ready, timeout=30)
    assert node.run("greet", {"name": "c"})["result"] == {"hello": "c"}


def test_an_actor_module_that_fails_to_import_says_so_in_one_line(started, tmp_path: Path) -> None:
    body = "from goqueue import actor\n\nsettings = load_settings()\n"
    node = started(project(tmp_path, body=body), "--actors", "myapp.tasks", "--workers", "2")
    assert node.proc.wait(timeout=30) == 3
    out = node.output()
    where = tmp_path / "myapp" / "tasks.py"
    lines = [line for line in out.splitlines() if "cannot" in line or "myapp.tasks" in line]
    assert len(lines) == 1, out
    assert (
        "cannot start: cannot import actor module 'myapp.tasks': NameError: name "
        f"'load_settings' is not defined (at {where}:3)"
    ) in lines[0]
    assert "Traceback" not in out and "BrokenPipe" not in out and "AttributeError" not in out


def test_a_missing_actor_module_says_where_it_was_looked_for(started, tmp_path: Path) -> None:
    node = started(tmp_path, "--actors", "nosuch.tasks", "--workers", "1")
    assert node.proc.wait(timeout=30) == 3
    out = node.output()
    assert "ModuleNotFoundError: No module named 'nosuch'" in out
    assert f"working directory ({tmp_path})" in out and "Traceback" not in out


# -- a node never hangs ---------------------------------------------------------------------------


def test_a_taken_port_is_one_line_and_exit_1(started, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        node = started(tmp_path, "--actors", "goqueue.actors.examples", "--port", str(port))
        assert node.proc.wait(timeout=20) == 1
    out = node.output()
    assert f"cannot start: cannot listen on 127.0.0.1:{port}" in out and "Traceback" not in out


@pytest.mark.postgres
def test_a_node_whose_database_is_down_listens_and_waits_for_it(
    started, tmp_path: Path, pg_cluster: PgCluster
) -> None:
    pg_cluster.stop()
    node = started(
        project(tmp_path), "--actors", "myapp.tasks", "--workers", "1",
        "--database-url", pg_cluster.dsn,
    )  # fmt: skip
    wait_for(node.answers, timeout=20)
    wait_for(lambda: node.output().count("opening the store failed; retrying") >= 2, timeout=20)
    assert node.get("/health").status == 200
    ready = node.get("/ready")
    assert ready.status == 503 and ready.body["checks"]["store"] is False, ready
    refused = request("POST", node.url + "/jobs", {"type": "greet", "payload": {"name": "x"}})
    assert refused.status == 503, refused
    assert node.get("/jobs").status == 503
    pg_cluster.start()
    wait_for(node.ready, timeout=30)
    assert node.run("greet", {"name": "db"})["result"] == {"hello": "db"}
    assert node.stop() == 0
    retries = [line for line in node.output().splitlines() if "opening the store" in line]
    assert len(retries) < 20, retries  # backoff: one line per retry, not a tight loop


SLOW = """\
import time

from goqueue import actor

time.sleep(60)  # a module that takes its time to import


@actor("never")
def never(payload, ctx):
    return None
"""


@pytest.mark.postgres
def test_a_stop_signal_during_boot_closes_what_was_opened(started, tmp_path: Path) -> None:
    dsn, schema = postgres_dsn(), f"gq_startup_{uuid.uuid4().hex[:10]}"
    node_id = f"boot-{uuid.uuid4().hex[:8]}"
    node = started(
        project(tmp_path, body=SLOW), "--actors", "myapp.tasks", "--workers", "1",
        "--database-url", dsn, "--database-schema", schema, "--node-id", node_id,
        "--shutdown-grace", "5",
    )  # fmt: skip
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        try:
            wait_for(lambda: node.answers() and node.get("/ready").body["checks"]["store"], 30)
            worker = wait_for(lambda: _children(node.proc.pid), timeout=10)[0]
            sessions = "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
            assert conn.execute(sessions, (f"goqueue/{node_id}",)).fetchone()[0] > 0
            node.proc.send_signal(signal.SIGTERM)
            stopped = time.monotonic()
            assert node.proc.wait(timeout=15) == 0
            assert time.monotonic() - stopped < 5.0
            assert not Path(f"/proc/{worker}").exists()
            assert "stopped while starting" in node.output()
            wait_for(
                lambda: conn.execute(sessions, (f"goqueue/{node_id}",)).fetchone()[0] == 0,
                timeout=5,
            )
        finally:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(") ", 1)[1].split()[1]) == pid:
                found.append(int(entry))
    return found


@pytest.mark.parametrize("store", ["memory", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_a_job_posted_as_soon_as_health_answers_is_taken(make_node, store: str) -> None:
    """A client that waits only for /health (as load balancers and scripts do) and posts
    at once, while the store opens and the first worker boots, gets its 201: the enqueue
    (and the --max-queues check before it) waits for the boot instead of answering 503."""
    args: list[str] = []
    if store == "postgres":
        dsn, schema = postgres_dsn(), f"gq_boot_{uuid.uuid4().hex[:10]}"
        args = ["--database-url", dsn, "--database-schema", schema]
    node = make_node(*args, wait=False)
    try:
        wait_for(lambda: _answers(node.url + "/health"), timeout=20, interval=0.005)
        resp = node.post("/jobs", {"type": "noop", "payload": 1})
        assert resp.status == 201, resp
        node.wait_status(resp.body["id"], "done")
    finally:
        if store == "postgres":
            stop_node(node)
            import psycopg

            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def _answers(url: str) -> bool:
    try:
        return request("GET", url).status == 200
    except OSError:
        return False
