"""What the fault-injection tests observe with: the jobs' own run log, the processes in
/proc, a webhook receiver, a TCP proxy in front of PostgreSQL, and the faults injected.

Nothing here reads the node's internals: a test judges the product by what its jobs did
(tests/fixtures/faultactors.py), what the kernel shows, what a receiver got and what the
HTTP API answers.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import select
import socket
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from goqueue.supervisor.dispatch.outcomes import WRITE_RETRY_CAP

from tests.conftest import Node, wait_for

# -- the run log ---------------------------------------------------------------------


@dataclass
class Run:
    """One execution of a job's handler, as the job itself logged it."""

    job_id: str
    attempt: int
    pid: int
    pgid: int  # the node: each node is a session leader, so this is its supervisor's pid
    start: float  # CLOCK_MONOTONIC
    end: float | None = None  # None: interrupted (or still running)

    @property
    def completed(self) -> bool:
        return self.end is not None


def read_runs(directory: Path) -> dict[str, list[Run]]:
    """Every job's runs, in start order, from `directory/runs.log`."""
    path = directory / "runs.log"
    runs: dict[str, list[Run]] = defaultdict(list)
    open_runs: dict[tuple[str, int, int], Run] = {}
    lines = path.read_text().splitlines() if path.exists() else []
    for line in lines:
        kind, job_id, attempt, pid, pgid, at = line.split()
        key = (job_id, int(attempt), int(pid))
        if kind == "start":
            run = Run(job_id, int(attempt), int(pid), int(pgid), float(at))
            open_runs[key] = run
            runs[job_id].append(run)
        else:
            open_runs.pop(key).end = float(at)
    return runs


def ended(directory: Path) -> int:
    """How many runs have ended so far."""
    path = directory / "runs.log"
    return path.read_text().count("\nend ") if path.exists() else 0


def started_on(directory: Path, pgid: int) -> list[Run]:
    """Runs started on the node whose supervisor (process group) is `pgid`."""
    return [r for rs in read_runs(directory).values() for r in rs if r.pgid == pgid]


# -- faults --------------------------------------------------------------------------


class FaultKind(StrEnum):
    """What a test did to a node or to the database."""

    KILL_GROUP = "kill -9 of the node's process group"
    KILL_SUPERVISOR = "kill -9 of the supervisor alone"
    STOP = "SIGSTOP of the node's process group"
    STOP_SUPERVISOR = "SIGSTOP of the supervisor alone"
    DATABASE = "PostgreSQL down"


@dataclass
class Fault:
    """One injected fault: on node `pgid` (None: the database), from `at` to `until`."""

    kind: FaultKind
    pgid: int | None
    at: float
    until: float


START_SLACK = 0.5  # seconds


def excused(run: Run, faults: Sequence[Fault], slack: float) -> bool:
    """May this completed run be repeated? Only when a fault hit its own node while it was
    in progress, or shortly after it ended (its outcome write was in flight, `slack`), or
    while its outcome was held because the database was down. A run that started after
    a fault on its node is never excused (nothing forced the repeat), except within
    START_SLACK: a worker may begin a job handed to it just before its supervisor died
    or stopped."""
    assert run.end is not None
    for fault in faults:
        if fault.pgid != run.pgid or run.start > fault.at + START_SLACK:
            continue
        if run.end >= fault.at - slack:
            return True
        if any(_held_through(run.end, fault.at, d, slack) for d in _outages(faults)):
            return True
    return False


def _outages(faults: Sequence[Fault]) -> list[tuple[float, float]]:
    """The database's outages, those apart by less than a held write's longest retry
    pause merged into one: a node holding an outcome may sleep through such a gap."""
    spans: list[tuple[float, float]] = []
    for at, until in sorted((d.at, d.until) for d in faults if d.pgid is None):
        if spans and at - spans[-1][1] <= WRITE_RETRY_CAP:
            spans[-1] = (spans[-1][0], max(spans[-1][1], until))
        else:
            spans.append((at, until))
    return spans


def _held_through(end: float, death: float, outage: tuple[float, float], slack: float) -> bool:
    """The run ended while the database was down, and its node died before the outcome
    could be written (during the outage, or just after it)."""
    at, until = outage
    return at - slack <= end <= until and at <= death <= until + slack


def avoidable_double_completions(
    runs: dict[str, list[Run]], faults: Sequence[Fault], slack: float = 1.0
) -> dict[str, list[Run]]:
    """Jobs run to completion more than once where not every extra completion is excused
    (see `excused`): each job may have one completion that nothing excuses."""
    bad = {}
    for job_id, job_runs in runs.items():
        done = [r for r in job_runs if r.completed]
        if len(done) > 1 and sum(not excused(r, faults, slack) for r in done) > 1:
            bad[job_id] = done
    return bad


def describe_runs(runs: Iterable[Run], origin: float) -> str:
    """Runs as text, times relative to `origin` (for failure messages)."""
    return "; ".join(
        f"attempt {r.attempt} on node {r.pgid} pid {r.pid} "
        f"{r.start - origin:+.2f}s..{'never' if r.end is None else f'{r.end - origin:+.2f}s'}"
        for r in runs
    )


# -- processes -----------------------------------------------------------------------


@dataclass(frozen=True)
class ProcStat:
    """A process as /proc/PID/stat shows it."""

    pid: int
    state: str
    ppid: int
    pgid: int
    name: str

    @property
    def alive(self) -> bool:
        return self.state not in ("Z", "X")  # a zombie has exited already


def proc_stat(pid: int) -> ProcStat | None:
    """The process `pid`, or None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    name = raw[raw.index("(") + 1 : raw.rindex(")")]
    fields = raw[raw.rindex(")") + 2 :].split()
    return ProcStat(pid, fields[0], int(fields[1]), int(fields[2]), name)


def processes() -> list[ProcStat]:
    """Every process on the machine."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := proc_stat(int(entry.name))) is not None:
            found.append(stat)
    return found


def alive(pid: int) -> bool:
    """True while `pid` runs (a zombie does not)."""
    stat = proc_stat(pid)
    return stat is not None and stat.alive


def children(ppid: int) -> list[ProcStat]:
    """Live processes whose parent is `ppid`."""
    return [p for p in processes() if p.ppid == ppid and p.alive]


def group(pgid: int) -> list[ProcStat]:
    """Live processes of the process group `pgid`."""
    return [p for p in processes() if p.pgid == pgid and p.alive]


# -- the HTTP API, in bulk -----------------------------------------------------------

TERMINAL = frozenset({"done", "failed", "cancelled"})


def fetch_all(node: Node, paths: Sequence[str], workers: int = 8) -> list[Any]:
    """GET many paths concurrently; the parsed bodies, in order. Any non-200 fails."""

    def get(path: str) -> Any:
        resp = node.get(path)
        assert resp.status == 200, (path, resp)
        return resp.body

    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(get, paths))


def jobs_by_id(node: Node, ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The jobs `ids`, as GET /jobs/{id} answers them."""
    return dict(zip(ids, fetch_all(node, [f"/jobs/{i}" for i in ids]), strict=True))


def events_by_id(node: Node, ids: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
    """The audit trails of `ids`."""
    bodies = fetch_all(node, [f"/jobs/{i}/events" for i in ids])
    return {i: body["events"] for i, body in zip(ids, bodies, strict=True)}


def batch_enqueue(node: Node, jobs: list[dict[str, Any]]) -> list[str]:
    """Enqueue through POST /jobs/batch, 500 at a time; the new ids in order."""
    ids: list[str] = []
    for start in range(0, len(jobs), 500):
        resp = node.post("/jobs/batch", {"jobs": jobs[start : start + 500]})
        assert resp.status == 200, resp
        assert all(r["status"] == 201 for r in resp.body["results"]), resp.body
        ids += [r["job"]["id"] for r in resp.body["results"]]
    return ids


def wait_job(node: Node, job_id: str, *statuses: str, timeout: float) -> dict[str, Any]:
    """Poll GET /jobs/{id} until the job is in one of `statuses`; answers the job. A
    refused connection or a 503 (the store is down, the node still booting) is waited
    out like any other status."""

    def check() -> dict[str, Any] | None:
        try:
            resp = node.get(f"/jobs/{job_id}")
        except OSError:
            return None
        if resp.status == 200 and resp.body["status"] in statuses:
            return resp.body
        return None

    return wait_until(check, timeout, f"job {job_id} {' or '.join(statuses)}")


def counts(node: Node) -> dict[str, int]:
    """Jobs by status, from GET /stats (statuses with no job are absent or 0)."""
    return node.get("/stats").body["counts"]


def unfinished(node: Node) -> int:
    """Jobs not yet in a terminal status."""
    return sum(n for status, n in counts(node).items() if status not in TERMINAL)


# -- a webhook receiver --------------------------------------------------------------


@dataclass
class Hit:
    """One request the receiver got, and how it answered."""

    headers: dict[str, str]  # names in lower case
    body: bytes
    status: int
    at: float
    peer_closed: bool  # the sender had hung up by the time the answer was ready

    @property
    def job_id(self) -> str | None:
        try:
            return json.loads(self.body).get("id")
        except ValueError:
            return None


class Receiver:
    """A webhook receiver on 127.0.0.1 in a thread: it answers `statuses` in order (then
    200), optionally holding the first request `hold` seconds, and records every hit."""

    def __init__(self, statuses: Sequence[int] = (), hold: float = 0.0) -> None:
        self.statuses = list(statuses)
        self.hold = hold
        self.hits: list[Hit] = []
        self.arrived = threading.Event()  # the first request came in (before any hold)
        self._lock = threading.Lock()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with receiver._lock:
                    first = not receiver.arrived.is_set()
                    status = receiver.statuses.pop(0) if receiver.statuses else 200
                receiver.arrived.set()
                if first and receiver.hold:
                    time.sleep(receiver.hold)
                closed = _peer_closed(self.connection)
                with contextlib.suppress(OSError):
                    self.send_response(status)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                hit = Hit(
                    {k.lower(): v for k, v in self.headers.items()},
                    body,
                    status,
                    time.monotonic(),
                    closed,
                )
                with receiver._lock:
                    receiver.hits.append(hit)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Receiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def of(self, job_id: str) -> list[Hit]:
        """The hits carrying job `job_id`."""
        with self._lock:
            return [h for h in self.hits if h.job_id == job_id]

    def delivered(self) -> set[str]:
        """Jobs with at least one hit answered 2xx."""
        with self._lock:
            return {h.job_id for h in self.hits if 200 <= h.status < 300 and h.job_id}


def _peer_closed(sock: socket.socket) -> bool:
    readable, _, _ = select.select([sock], [], [], 0)
    if not readable:
        return False
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


# -- a proxy in front of PostgreSQL --------------------------------------------------


class PgProxy:
    """A TCP proxy on 127.0.0.1 to PostgreSQL. In `blackhole` mode it still forwards what
    the client sends but drops every answer, as when a COMMIT succeeds and its reply is
    lost; `cut()` then drops every connection."""

    def __init__(self, upstream: tuple[str, int], port: int = 0) -> None:
        self.upstream = upstream
        self.blackhole = False
        self._listener = socket.create_server(("127.0.0.1", port))
        self.port = self._listener.getsockname()[1]
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._pairs.append((client, server))
            threading.Thread(target=self._pump, args=(client, server), daemon=True).start()

    def _pump(self, client: socket.socket, server: socket.socket) -> None:
        try:
            while True:
                readable, _, _ = select.select([client, server], [], [], 0.5)
                for sock in readable:
                    data = sock.recv(65536)
                    if not data:
                        return
                    if sock is client:
                        server.sendall(data)
                    elif not self.blackhole:
                        client.sendall(data)
        except (OSError, ValueError):
            return
        finally:
            for sock in (client, server):
                with contextlib.suppress(OSError):
                    sock.close()

    def cut(self) -> None:
        """Close every proxied connection (both ends)."""
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            for sock in pair:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        self.cut()


# -- waiting -------------------------------------------------------------------------


def wait_until(
    predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.05
) -> Any:
    """`wait_for` with the message first: the fault tests always say what they await."""
    return wait_for(predicate, timeout, interval, what)


@dataclass
class Timeline:
    """Faults injected during a test, for the analysis and for failure messages."""

    origin: float = field(default_factory=time.monotonic)
    faults: list[Fault] = field(default_factory=list)

    def add(self, kind: FaultKind, pgid: int | None, at: float, until: float | None = None) -> None:
        self.faults.append(Fault(kind, pgid, at, at if until is None else until))

    def __str__(self) -> str:
        return "\n".join(
            f"{f.at - self.origin:+7.2f}s {f.kind} on "
            f"{'the database' if f.pgid is None else f'node {f.pgid}'} "
            f"for {f.until - f.at:.2f}s"
            for f in self.faults
        )
