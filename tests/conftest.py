"""Shared fixtures: real `goqueue serve` processes on loopback, and an HTTP helper."""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

pytest_plugins = ["tests.pgcluster"]  # the private PostgreSQL cluster fixture

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"


def free_port() -> int:
    """An unused loopback port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(
    predicate: Callable[[], Any],
    timeout: float = 10.0,
    interval: float = 0.02,
    what: str = "condition met",
) -> Any:
    """Poll `predicate` until it returns something truthy; fail after `timeout`, saying
    `what` was awaited."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g}s: {what}")
        time.sleep(interval)


def stays_true(
    predicate: Callable[[], Any],
    for_seconds: float,
    interval: float = 0.05,
    what: str | Callable[[], str] = "condition held",
) -> None:
    """Poll `predicate` over the whole of `for_seconds` and fail as soon as it turns falsy,
    saying `what` stopped holding (a callable `what` is asked only then). A test that
    something does NOT happen within a time must wait that time; this checks throughout,
    so it fails early and says what broke, instead of sleeping and looking once."""
    start = time.monotonic()
    deadline = start + for_seconds
    while True:
        now = time.monotonic()  # read before the check: the last one starts past the end
        if not predicate():
            said = what() if callable(what) else what
            raise AssertionError(f"stopped holding after {now - start:.2f}s: {said}")
        if now >= deadline:
            return
        time.sleep(min(interval, deadline - now))


async def wait_for_async(
    predicate: Callable[[], Any],
    timeout: float = 10.0,
    interval: float = 0.01,
    what: str = "condition met",
) -> Any:
    """`wait_for` inside an event loop: poll `predicate` (its result awaited when it is
    awaitable) without blocking the loop, until truthy; fail after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g}s: {what}")
        await asyncio.sleep(interval)


async def stays_true_async(
    predicate: Callable[[], Any],
    for_seconds: float,
    interval: float = 0.01,
    what: str = "condition held",
) -> None:
    """`stays_true` inside an event loop: the loop runs on while the predicate is
    polled over the whole window."""
    start = time.monotonic()
    deadline = start + for_seconds
    while True:
        now = time.monotonic()
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if not value:
            raise AssertionError(f"stopped holding after {now - start:.2f}s: {what}")
        if now >= deadline:
            return
        await asyncio.sleep(min(interval, deadline - now))


@dataclass
class Response:
    """An HTTP answer: status, parsed JSON body (or None), headers."""

    status: int
    body: Any
    headers: dict[str, str] = field(default_factory=dict)


def request(
    method: str, url: str, body: Any = None, headers: dict[str, str] | None = None
) -> Response:
    """One HTTP request with urllib; JSON in, JSON out; errors are returned, not raised."""
    data = body if isinstance(body, bytes) else None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=15) as resp:
            raw, status, hdrs = resp.read(), resp.status, dict(resp.headers)
    except urllib.error.HTTPError as err:
        raw, status, hdrs = err.read(), err.code, dict(err.headers)
    try:
        parsed = json.loads(raw) if raw else None
    except ValueError:
        parsed = raw.decode(errors="replace")
    return Response(status, parsed, hdrs)


@dataclass
class Node:
    """A running `goqueue serve` process."""

    proc: subprocess.Popen[bytes]
    url: str
    log_path: Path

    def get(self, path: str, **kw: Any) -> Response:
        return request("GET", self.url + path, **kw)

    def post(self, path: str, body: Any = None, **kw: Any) -> Response:
        return request("POST", self.url + path, body, **kw)

    def delete(self, path: str, **kw: Any) -> Response:
        return request("DELETE", self.url + path, **kw)

    def enqueue(self, **job: Any) -> dict[str, Any]:
        resp = self.post("/jobs", job)
        assert resp.status == 201, resp
        return resp.body

    def wait_status(self, job_id: str, *statuses: str, timeout: float = 15.0) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            job = self.get(f"/jobs/{job_id}").body
            return job if job["status"] in statuses else None

        return wait_for(check, timeout)

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace")

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)


def start_node(
    tmp_path: Path,
    *args: str,
    env: dict[str, str] | None = None,
    session: bool = False,
    wait: bool = True,
    default_store: bool = False,
    port: int | None = None,
) -> Node:
    """Start `goqueue serve` with the test actors (on `port`, else a free one) and wait
    until /ready answers 200; a node that does not get there is killed, not left behind.

    A node given no store keeps its jobs in a SQLite file of its own (the default store,
    but named for its port: nodes of one test never share a file, and a node started again
    starts empty, unless the test names the file with `--database-url`). With
    `default_store` it is given nothing, so it uses `goqueue.db` in the test's folder."""
    port = port or free_port()
    log_path = tmp_path / f"node-{port}.log"
    environ = {
        k: v for k, v in os.environ.items() if not k.startswith("GOQUEUE_") and k != "API_KEY"
    }
    environ["PYTHONPATH"] = str(FIXTURES)
    environ.pop("DATABASE_URL", None)
    environ.update(env or {})
    cmd = [
        sys.executable,
        "-m",
        "goqueue.api.cli.main",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    if "--actors" not in args:
        cmd += ["--actors", "testactors"]
    if "--workers" not in args:
        cmd += ["--workers", "2"]
    if (
        not default_store
        and not any(a.startswith("--database-url") for a in args)
        and not {"DATABASE_URL", "GOQUEUE_DATABASE_URL"} & set(environ)
    ):
        cmd += ["--database-url", f"sqlite:///node-{port}.db"]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [*cmd, *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=environ,
            cwd=tmp_path,
            start_new_session=session,
        )
    node = Node(proc, f"http://127.0.0.1:{port}", log_path)

    def ready() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"node exited with {proc.returncode}:\n{node.logs()}")
        try:
            return request("GET", node.url + "/ready").status == 200
        except OSError:
            return False

    if wait:
        try:
            wait_for(ready, timeout=20)
        except BaseException:
            proc.kill()
            proc.wait(timeout=10)
            raise
    return node


def stop_node(node: Node) -> None:
    """SIGTERM; the node must drain and exit 0 within 15 s (else it is killed and the
    test errors)."""
    if node.proc.poll() is not None:
        return  # the test ended it (or it died, which the test has judged)
    node.proc.send_signal(signal.SIGTERM)
    try:
        code = node.proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        node.proc.kill()
        node.proc.wait(timeout=5)
        raise AssertionError(f"node ignored SIGTERM for 15 s:\n{node.logs()[-3000:]}") from None
    assert code == 0, f"node exited with {code} on SIGTERM:\n{node.logs()[-3000:]}"


@pytest.fixture
def make_node(tmp_path: Path) -> Iterator[Callable[..., Node]]:
    """A factory of nodes, each stopped at the end of the test."""
    nodes: list[Node] = []

    def make(
        *args: str,
        env: dict[str, str] | None = None,
        session: bool = False,
        wait: bool = True,
        default_store: bool = False,
        port: int | None = None,
    ) -> Node:
        node = start_node(
            tmp_path,
            *args,
            env=env,
            session=session,
            wait=wait,
            default_store=default_store,
            port=port,
        )
        nodes.append(node)
        return node

    yield make
    for node in nodes:
        stop_node(node)


@pytest.fixture
def node(make_node: Callable[..., Node]) -> Node:
    """One node with two workers and the test actors."""
    return make_node()


# Modules that load the machine (thousands of jobs, 100k rows, a fresh install, faults
# injected into nodes and databases) or time what a node does against the clock (rate
# limits, scaling, the cost of open dashboards): under xdist they take turns on one
# process, while the other modules share both.
HEAVY_MODULES = frozenset(
    {"tests/e2e/test_fresh_install.py", "tests/e2e/api/test_metrics_cost.py",
     "tests/e2e/supervisor/test_cluster.py", "tests/e2e/test_chaos.py",
     "tests/e2e/test_faults.py", "tests/e2e/test_hardening.py",
     "tests/e2e/supervisor/test_rate_limit_nodes.py", "tests/e2e/supervisor/test_scaling.py",
     "tests/e2e/supervisor/test_sqlite_disk.py", "tests/e2e/ui/test_dashboard.py"}
)  # fmt: skip


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under xdist (`.ci/run` uses `-n 2`) a module's tests stay together on one process,
    in order (some share a module's node and read what earlier ones did), and the heavy
    modules form one unit, so no two of them load the machine at once. (xdist's own
    `loadgroup` marks do not take effect under this pytest.)"""
    from xdist.scheduler import LoadScopeScheduling

    class ByModule(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return "heavy" if module in HEAVY_MODULES else module

    return ByModule(config, log)


def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Run `async def` tests on a fresh event loop (no pytest-asyncio needed)."""
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    names = pyfuncitem._fixtureinfo.argnames
    asyncio.run(pyfuncitem.obj(**{n: pyfuncitem.funcargs[n] for n in names}))
    return True


def postgres_dsn() -> str:
    """TEST_DATABASE_URL if PostgreSQL answers there; otherwise skip loudly (fail under CI)."""
    dsn = os.environ.get("TEST_DATABASE_URL")
    reason = None
    if not dsn:
        reason = "TEST_DATABASE_URL is not set"
    else:
        try:
            import psycopg

            psycopg.connect(dsn, connect_timeout=3).close()
        except Exception as exc:
            reason = f"PostgreSQL at TEST_DATABASE_URL is unreachable: {exc}"
    if reason is None:
        return dsn  # type: ignore[return-value]
    if os.environ.get("CI"):
        pytest.fail(f"PostgreSQL tests must run under CI: {reason}")
    pytest.skip(f"SKIPPING POSTGRESQL TESTS: {reason}")


def schema_args(prefix: str) -> tuple[str, ...]:
    """`goqueue serve` flags naming a fresh schema (`PREFIX_…`) of the test database."""
    schema = f"{prefix}_{uuid.uuid4().hex[:10]}"
    return ("--database-url", postgres_dsn(), "--database-schema", schema)


def nodes_started_with(
    make_node: Callable[..., Node], *fixed: str
) -> Iterator[Callable[..., Node]]:
    """For a fixture: a factory of nodes started with `fixed` and each call's arguments,
    all stopped at the end; then the schema `fixed` names (`schema_args`), if any, is
    dropped, after its nodes."""
    nodes: list[Node] = []

    def start(*args: str, **kw: Any) -> Node:
        node = make_node(*fixed, *args, **kw)
        nodes.append(node)
        return node

    yield start
    for node in nodes:
        stop_node(node)
    if "--database-schema" in fixed:
        import psycopg

        dsn, schema = (
            fixed[fixed.index("--database-url") + 1],
            fixed[fixed.index("--database-schema") + 1],
        )
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
