"""Connection hygiene: slow and idle clients cannot hold a node's descriptors. Before, there
was no header deadline, keep-alive lasted 3,630 s, and about 1,000 idle connections at a
soft limit of 1,024 descriptors stopped /health and worker respawns."""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from goqueue.api.http.connections import (
    BUSY_RESPONSE,
    ConnectionGuard,
    Guarded,
    connection_cap,
    raise_open_files_limit,
)
from goqueue.supervisor.observe.metrics import ConnectionClose, Metrics
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import (
    FIXTURES,
    Node,
    free_port,
    request,
    stays_true_async,
    stop_node,
    wait_for,
    wait_for_async,
)

pytestmark = pytest.mark.timeout(120)

QUICK = ("--header-timeout", "1.5", "--body-timeout", "1.5", "--keepalive-timeout", "2")


def connect(node: Node) -> socket.socket:
    port = int(node.url.rsplit(":", 1)[1])
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def closed_after(sock: socket.socket, limit: float) -> tuple[float, bytes]:
    """Seconds until the server closes `sock` (at most `limit`), and what it sent."""
    started = time.monotonic()
    sock.settimeout(limit)
    received = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            received += chunk
    return time.monotonic() - started, received


def closed_counts(node: Node) -> dict[str, float]:
    text = node.get("/metrics").body
    return {
        s.labels["reason"]: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "goqueue_http_connections_closed_total"
    }


# -- live nodes ------------------------------------------------------------------------


def test_a_slowloris_client_is_cut_off_after_the_header_timeout(
    make_node: Callable[..., Node],
) -> None:
    node = make_node("--workers", "1", *QUICK)
    slow = connect(node)
    slow.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
    started = time.monotonic()
    cut = False
    while time.monotonic() - started < 10:  # a header line every 0.3 s, never the end
        try:
            slow.sendall(b"X-Trickle: 1\r\n")
        except (BrokenPipeError, ConnectionResetError):
            cut = True
            break
        slow.settimeout(0.3)
        try:
            if slow.recv(1) == b"":
                cut = True
                break
        except TimeoutError:
            continue
        except ConnectionResetError:
            cut = True
            break
    took = time.monotonic() - started
    assert cut and 1.0 < took < 5.0, took
    idle = connect(node)  # connected, never says a word
    took, sent = closed_after(idle, 10)
    assert 1.0 < took < 5.0 and sent == b"", (took, sent)
    assert closed_counts(node)[ConnectionClose.HEADER_TIMEOUT] >= 2
    assert node.get("/health").status == 200  # an ordinary request is not affected


def test_a_slow_body_is_408_and_an_idle_kept_alive_connection_is_closed(
    make_node: Callable[..., Node],
) -> None:
    node = make_node("--workers", "1", *QUICK)
    slow = connect(node)
    slow.sendall(
        b"POST /jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 100\r\n\r\n" + b'{"type": '
    )
    started = time.monotonic()
    slow.settimeout(10)
    answer = slow.recv(65536)
    answered = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert b'"error":"the request body did not arrive within 1.5 s"' in answer
    assert b"Connection: close" in answer
    assert 1.0 < answered < 4.0, answered
    # then aiohttp lingers up to 5 s (`lingering_time`) for the rest of the body, and closes
    took, _ = closed_after(slow, 15)
    assert took < 7.0, took
    assert node.get("/stats").body["counts"]["pending"] == 0

    kept = connect(node)
    kept.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    kept.settimeout(5)
    assert kept.recv(65536).startswith(b"HTTP/1.1 200")
    took, _ = closed_after(kept, 10)  # aiohttp's keep-alive timeout, 2 s here
    assert 1.0 < took < 6.0, took


def start_limited_node(tmp_path: Path, soft: int, hard: int, *args: str) -> Node:
    """`goqueue serve` started with this open-files limit (as a shell's `ulimit -n` would)."""
    port = free_port()
    log_path = tmp_path / f"node-{port}.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GOQUEUE_")}
    env.pop("API_KEY", None)
    env["PYTHONPATH"] = str(FIXTURES)
    cmd = [sys.executable, "-m", "goqueue.api.cli.main", "serve", "--host", "127.0.0.1",
           "--port", str(port), "--actors", "testactors", *args]  # fmt: skip

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                cwd=tmp_path, preexec_fn=limit)  # fmt: skip
    node = Node(proc, f"http://127.0.0.1:{port}", log_path)

    def ready() -> bool:
        assert proc.poll() is None, node.logs()
        try:
            return request("GET", node.url + "/ready").status == 200
        except OSError:
            return False

    wait_for(ready, timeout=30)
    return node


@pytest.fixture
def limited_nodes(tmp_path: Path) -> Iterator[Callable[..., Node]]:
    nodes: list[Node] = []

    def make(soft: int, hard: int, *args: str) -> Node:
        nodes.append(start_limited_node(tmp_path, soft, hard, *args))
        return nodes[-1]

    yield make
    for node in nodes:
        stop_node(node)


def open_files_limit(pid: int) -> tuple[int, int]:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return int(soft), int(hard)
    raise AssertionError("no open-files line")


def test_the_soft_limit_is_raised_to_the_hard_limit_at_start(limited_nodes: Any) -> None:
    node = limited_nodes(1024, 4096, "--workers", "1")
    assert open_files_limit(node.proc.pid) == (4096, 4096)
    assert '"open_files":4096' in node.logs()  # told in the `listening` line


def test_a_thousand_idle_connections_at_1024_descriptors_do_not_stop_the_node(
    limited_nodes: Any, tmp_path: Path
) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 3000:  # the client side holds as many sockets
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    if resource.getrlimit(resource.RLIMIT_NOFILE)[0] < 3000:
        pytest.fail("the test process cannot open 1,100 sockets (open-files limit)")
    # Both limits at 1,024, so the node cannot raise its way out; a long header timeout,
    # so the idle connections stay until the cap has to make room.
    node = limited_nodes(1024, 1024, "--workers", "2", "--header-timeout", "60")
    assert open_files_limit(node.proc.pid) == (1024, 1024)
    idle: list[socket.socket] = []
    try:
        port = int(node.url.rsplit(":", 1)[1])
        for _ in range(1100):
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=10))
        started = time.monotonic()
        assert request("GET", node.url + "/health").status == 200
        assert time.monotonic() - started < 5
        job = request("POST", node.url + "/jobs", {"type": "noop", "payload": 1}).body
        wait_for(lambda: node.get(f"/jobs/{job['id']}").body["status"] == "done", timeout=30)
        assert closed_counts(node)[ConnectionClose.EVICTED] >= 100
    finally:
        for sock in idle:
            sock.close()
    assert "EMFILE" not in node.logs() and "Too many open files" not in node.logs()


# -- the guard itself ----------------------------------------------------------------------


class FakeTransport(asyncio.Transport):
    """A transport that records what the guard does to it."""

    def __init__(self) -> None:
        super().__init__()
        self.written = b""
        self.closing = False
        self.aborted = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += bytes(data)

    def close(self) -> None:
        self.closing = True

    def abort(self) -> None:
        self.aborted = self.closing = True

    def is_closing(self) -> bool:
        return self.closing


class Inner(asyncio.Protocol):
    def __init__(self) -> None:
        self.made = self.lost = False
        self.data = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.made = True

    def data_received(self, data: bytes) -> None:
        self.data += data

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True


async def test_the_guard_evicts_the_longest_idle_and_refuses_when_all_are_busy() -> None:
    guard = ConnectionGuard(max_connections=2, header_timeout=60, metrics=Metrics())
    conns = [Guarded(guard, Inner()) for _ in range(4)]
    transports = [FakeTransport() for _ in conns]
    conns[0].connection_made(transports[0])
    conns[1].connection_made(transports[1])
    guard.busy(transports[1])  # a request is being answered on the second
    conns[2].connection_made(transports[2])  # over the cap: the idle first one goes
    assert transports[0].aborted and not transports[1].closing and len(guard) == 2
    conns[0].connection_lost(None)
    guard.busy(transports[2])
    conns[3].connection_made(transports[3])  # over the cap, every one busy: 503, closed
    assert transports[3].written == BUSY_RESPONSE and transports[3].closing
    assert not transports[3].aborted and len(guard) == 2
    conns[3].connection_lost(None)
    guard.idle(transports[1])
    assert guard.is_idle(conns[1]) and not guard.is_idle(conns[2])
    for conn in conns[1:3]:
        conn.disarm()


async def test_the_header_deadline_spares_busy_connections_and_rearms_on_new_requests() -> None:
    guard = ConnectionGuard(max_connections=10, header_timeout=0.05, metrics=Metrics())
    slow, busy = Guarded(guard, Inner()), Guarded(guard, Inner())
    slow_t, busy_t = FakeTransport(), FakeTransport()
    slow.connection_made(slow_t)
    busy.connection_made(busy_t)
    busy.data_received(b"GET / HTTP/1.1\r\n\r\n")
    guard.busy(busy_t)  # its handler runs longer than the header deadline
    await wait_for_async(lambda: slow_t.aborted, timeout=2, what="the silent one aborted")
    spared = "a busy connection closed by the header deadline"
    await stays_true_async(lambda: not busy_t.closing, for_seconds=0.2, what=spared)
    assert slow_t.aborted and not busy_t.closing
    guard.idle(busy_t)
    idle = "an idle keep-alive connection closed by the header deadline"
    await stays_true_async(lambda: not busy_t.closing, for_seconds=0.2, what=idle)
    assert not busy_t.closing  # idle between requests: keep-alive's business, not ours
    busy.data_received(b"GET / HT")  # a new request starts, and stalls
    await wait_for_async(lambda: busy_t.aborted, timeout=2, what="the stalled request aborted")
    assert busy_t.aborted


def test_the_connection_cap_leaves_descriptors_for_everything_else() -> None:
    assert connection_cap(10_000, workers=2, open_files=1024) == 1024 - 64 - 16
    assert connection_cap(500, workers=2, open_files=65_536) == 500
    assert connection_cap(10_000, workers=500, open_files=1024) == 16
    soft, hard = raise_open_files_limit()
    assert soft == hard or hard == resource.RLIM_INFINITY
