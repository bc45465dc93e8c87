"""A real API server for route tests: `create_app` over a node built as `goqueue serve`
builds it (in-memory store, a pool with no workers unless a test spawns one), served on
127.0.0.1 by a background thread with its own event loop, and spoken to over real HTTP
with `http.client`.

Fixture names carry an `api_` prefix so they never shadow the suite-wide ones.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, TypeVar

import pytest
import uvloop
from aiohttp import web
from goqueue.actors.protocol import ActorInfo, BootFailed, Ready
from goqueue.api.cli.serve import build_served_node
from goqueue.api.http.app import create_app
from goqueue.supervisor.common.catalog import Catalog
from goqueue.supervisor.common.lifecycle import NodePhase
from goqueue.supervisor.engine import Engine
from goqueue.supervisor.node import Node
from goqueue.supervisor.queue_budget import reserved_queues
from goqueue.supervisor.settings.config import Settings
from goqueue.supervisor.store.memory.store import MemoryStore
from goqueue.supervisor.workers.handle import Worker

T = TypeVar("T")

ACTORS = [ActorInfo("email", None, None, None), ActorInfo("report", 60.0, 1, 2)]
CALL_TIMEOUT = 15.0


class NoArbiter:
    """Worker events nobody needs here: no arbiter runs in these tests (and no job is
    ever handed to a worker, so no dispatcher either)."""

    def worker_ready(self, worker: Worker, message: Ready) -> None:
        """Ignored."""

    def worker_boot_failed(self, worker: Worker, message: BootFailed) -> None:
        """Ignored."""

    def worker_recycled(self, worker: Worker) -> None:
        """Ignored."""

    def worker_exited(self, worker: Worker) -> None:
        """Ignored."""


@dataclass
class Reply:
    """An HTTP answer: status, headers (lower-case names) and the raw body."""

    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> Any:
        """The body as JSON."""
        return json.loads(self.body)


@dataclass
class ApiServer:
    """One served app and the engine behind it; `call` runs code on the server's loop."""

    settings: Settings
    loop: asyncio.AbstractEventLoop = field(default_factory=uvloop.new_event_loop)
    thread: threading.Thread | None = None
    port: int = 0
    store: MemoryStore | None = None
    node: Node | None = None
    engine: Engine | None = None
    runner: web.AppRunner | None = None

    def start(self) -> ApiServer:
        """Start the loop thread, then build and serve the app on it."""
        self.thread = threading.Thread(target=self.loop.run_forever, name="api-server", daemon=True)
        self.thread.start()
        self.call(self._open())
        return self

    def stop(self) -> None:
        """Stop serving, close the engine's parts, stop and close the loop."""
        try:
            self.call(self._close())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            assert self.thread is not None
            self.thread.join(timeout=CALL_TIMEOUT)
            self.loop.close()

    def call(self, coro: Awaitable[T], timeout: float = CALL_TIMEOUT) -> T:
        """Run a coroutine on the server's loop and return its result."""
        return asyncio.run_coroutine_threadsafe(_await(coro), self.loop).result(timeout)

    def sync(self, fn: Callable[[], T]) -> T:
        """Run a plain function on the server's loop (the store is single-threaded)."""

        async def run() -> T:
            return fn()

        return self.call(run())

    async def _open(self) -> None:
        """Build a node as `goqueue serve` does, but run no arbiter (so no workers and no
        dispatching), and serve `create_app` over its engine on an ephemeral port."""
        node = self.node = build_served_node(self.settings, lambda: self.settings)
        assert isinstance(node.store, MemoryStore)
        self.store = node.store
        self.engine = node.engine
        node.pool.listen(replace(node.listeners, workers=NoArbiter()))
        await self.store.open(node.links)
        catalog = Catalog(ACTORS, {})
        node.engine.set_catalog(catalog, reserved_queues(None, catalog.actors.values(), ()))
        await self.store.register_node(catalog.limits())
        node.lifecycle.enter(NodePhase.SERVING)
        await node.webhooks.start()
        self.runner = web.AppRunner(create_app(self.engine, self.settings), access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = self.runner.addresses[0][1]

    async def _close(self) -> None:
        """Undo whatever `_open` got to, in reverse."""
        if self.runner is not None:
            await self.runner.cleanup()
        if self.node is not None:
            await self.node.pool.shutdown()
            await self.node.webhooks.close(0)

    # -- HTTP ------------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        raw: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> Reply:
        """One request on a fresh connection; `body` is sent as JSON, `raw` as is."""
        data = raw if raw is not None else None if body is None else json.dumps(body).encode()
        sent = {"Content-Type": "application/json"} if data is not None else {}
        sent.update(headers or {})
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=CALL_TIMEOUT)
        try:
            conn.request(method, path, body=data, headers=sent)
            resp = conn.getresponse()
            return Reply(resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read())
        finally:
            conn.close()

    def get(self, path: str, **kw: Any) -> Reply:
        """GET `path`."""
        return self.request("GET", path, **kw)

    def post(self, path: str, body: Any = None, **kw: Any) -> Reply:
        """POST `body` as JSON to `path`."""
        return self.request("POST", path, body, **kw)

    def delete(self, path: str, **kw: Any) -> Reply:
        """DELETE `path`."""
        return self.request("DELETE", path, **kw)

    def server_errors(self) -> list[str]:
        """Requests answered 500 so far (route, method), from the HTTP request counter."""
        assert self.engine is not None
        return [
            f"{s.labels['method']} {s.labels['route']}"
            for metric in self.engine.metrics.http_requests.collect()
            for s in metric.samples
            if s.name.endswith("_total") and s.labels["status"] == "500" and s.value
        ]

    def job_count(self) -> int:
        """How many jobs the store holds (every status), read on the server's loop."""
        assert self.store is not None
        return sum(self.call(self.store.stats()).counts.values())


async def _await(awaitable: Awaitable[T]) -> T:
    return await awaitable


def wait_until(predicate: Callable[[], Any], what: str, timeout: float = 10.0) -> Any:
    """Poll until `predicate` is truthy, failing with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


@pytest.fixture
def make_api_server() -> Iterator[Callable[..., ApiServer]]:
    """Start servers with the given settings overrides; all are stopped afterwards. Their
    store is in memory (the tests read and drive it directly, on the server's loop)."""
    servers: list[ApiServer] = []

    def make(**overrides: Any) -> ApiServer:
        server = ApiServer(Settings(workers=1, **{"database_url": "memory://", **overrides}))
        servers.append(server)
        return server.start()

    yield make
    errors = [error for server in servers for error in server.server_errors()]
    for server in servers:
        server.stop()
    assert not errors, f"requests answered 500 (a bug in the API): {errors}"


@pytest.fixture
def api_server(make_api_server: Callable[..., ApiServer]) -> ApiServer:
    """A server with default settings (no API key)."""
    return make_api_server()


# -- live nodes on either store ----------------------------------------------------------


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def api_store(request: pytest.FixtureRequest) -> str:
    """Which store a live-node test runs against (each: a rule must hold on every one)."""
    return str(request.param)


@pytest.fixture
def make_store_node(make_node: Callable[..., Any], api_store: str) -> Iterator[Callable[..., Any]]:
    """`make_node` on the store under test: PostgreSQL nodes share a fresh schema of the
    test database (dropped afterwards); memory nodes each hold their own jobs, and SQLite
    nodes each a file of their own (`start_node`'s default)."""
    from tests.conftest import postgres_dsn, stop_node

    if api_store == "memory":
        yield partial(make_node, "--database-url", "memory://")
        return
    if api_store == "sqlite":
        yield make_node
        return
    dsn = postgres_dsn()
    schema = f"gq_api_{uuid.uuid4().hex[:10]}"
    nodes: list[Any] = []

    def make(*args: str, **kw: Any) -> Any:
        node = make_node("--database-url", dsn, "--database-schema", schema, *args, **kw)
        nodes.append(node)
        return node

    yield make
    for node in nodes:  # before the schema goes: a drain still writes to it
        stop_node(node)
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
