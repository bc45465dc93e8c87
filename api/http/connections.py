"""Connection hygiene: no client may hold the node's file descriptors for free.

aiohttp bounds an idle kept-alive connection (`keepalive_timeout`) but not the time a
client takes to send a request's headers: a client that trickles a byte every few
seconds (slowloris) holds its connection for ever, and a thousand of them exhaust the
descriptors the supervisor needs to answer `/health` and to respawn workers. So each
connection is wrapped in a thin protocol (`Guarded`, delegating everything to aiohttp's
own) that

- closes it when a request's headers are not complete `header_timeout` seconds after
  the connection opened or after the request's first byte;
- counts it: beyond `max_connections` open at once the connection idle the longest is
  closed to make room, and when every connection is busy the new one is answered 503
  and closed.

The application tells the guard when a request starts and ends (`front_middleware`).
`max_connections` is lowered at start to fit the open-files limit, which the node first
raises to its hard limit (`raise_open_files_limit`), leaving room for workers' pipes, the
database pool and logs.
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest
from aiohttp.web_server import Server
from goqueue.supervisor.observe.metrics import ConnectionClose, Metrics

log = logging.getLogger("goqueue.api")


RESERVED_FILES = 64  # listener, logs, database pool, LISTEN connection, imports
FILES_PER_WORKER = 8  # pipes, sentinel, and what a respawn briefly holds twice
MIN_CONNECTIONS = 16
NR_OPEN = "/proc/sys/fs/nr_open"
BUSY_BODY = (
    b'{"error":"too many open connections; retry shortly","details":{"reason":"connections"}}'
)
BUSY_RESPONSE = (
    b"HTTP/1.1 503 Service Unavailable\r\n"
    b"Content-Type: application/json\r\n"
    b"Content-Length: " + str(len(BUSY_BODY)).encode() + b"\r\n"
    b"Retry-After: 1\r\n"
    b"Connection: close\r\n\r\n" + BUSY_BODY
)


def raise_open_files_limit() -> tuple[int, int]:
    """Raise this process's soft limit on open files to its hard limit (children inherit
    it); returns the (soft, hard) limits in force afterwards."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else _nr_open()
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the open-files limit", extra={"error": str(exc)})
    return soft, hard


def _nr_open() -> int:
    """The kernel's ceiling for a soft limit when the hard limit is unlimited."""
    try:
        with open(NR_OPEN) as file:
            return int(file.read())
    except (OSError, ValueError):
        return 65_536


def connection_cap(configured: int, workers: int, open_files: int | None = None) -> int:
    """`configured`, lowered so that connections leave descriptors for everything else."""
    if open_files is None:
        open_files = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if open_files == resource.RLIM_INFINITY:
        return configured
    spare = open_files - RESERVED_FILES - FILES_PER_WORKER * workers
    return max(MIN_CONNECTIONS, min(configured, spare))


class ConnectionGuard:
    """Every connection of one listener: the header deadline, the cap, busy or idle."""

    def __init__(self, max_connections: int, header_timeout: float, metrics: Metrics) -> None:
        self.max_connections = max_connections
        self.header_timeout = header_timeout
        self.metrics = metrics
        self._open: dict[asyncio.BaseTransport, Guarded] = {}
        self._idle: OrderedDict[Guarded, None] = OrderedDict()  # longest idle first

    def __len__(self) -> int:
        return len(self._open)

    def factory(self, server: Server, settings: Mapping[str, Any]) -> Callable[[], Guarded]:
        """A protocol factory for `loop.create_server`: aiohttp's protocol for `server`
        (made with `settings`, see `handler_settings`), wrapped."""
        loop = asyncio.get_running_loop()
        return lambda: Guarded(self, JsonErrors(server, loop=loop, **settings))

    def admit(self, conn: Guarded, transport: asyncio.BaseTransport) -> bool:
        """Count a new connection; False when it must be refused (all others busy)."""
        if len(self._open) >= self.max_connections and not self._evict_idlest():
            self.metrics.connection_closed(ConnectionClose.REFUSED)
            return False
        self._open[transport] = conn
        self._idle[conn] = None
        self.metrics.set_connections(len(self._open))
        return True

    def forget(self, conn: Guarded, transport: asyncio.BaseTransport | None) -> None:
        """A connection closed."""
        if transport is not None and self._open.get(transport) is conn:
            del self._open[transport]
        self._idle.pop(conn, None)
        self.metrics.set_connections(len(self._open))

    def busy(self, transport: asyncio.BaseTransport | None) -> None:
        """A request's handler started on this connection."""
        conn = self._open.get(transport) if transport is not None else None
        if conn is not None:
            conn.hold()
            self._idle.pop(conn, None)

    def idle(self, transport: asyncio.BaseTransport | None) -> None:
        """A request's handler ended: the connection waits for the next request."""
        conn = self._open.get(transport) if transport is not None else None
        if conn is not None:
            self._idle[conn] = None
            self._idle.move_to_end(conn)

    def is_idle(self, conn: Guarded) -> bool:
        """True when no request's handler runs on `conn`."""
        return conn in self._idle

    def _evict_idlest(self) -> bool:
        while self._idle:
            conn, _ = self._idle.popitem(last=False)
            if conn.close(ConnectionClose.EVICTED):
                return True
        return False


class Guarded(asyncio.Protocol):
    """aiohttp's protocol for one connection, with the guard's deadline and counting."""

    def __init__(self, guard: ConnectionGuard, inner: asyncio.Protocol) -> None:
        self.guard = guard
        self.inner = inner
        self.transport: asyncio.BaseTransport | None = None
        self.refused = False
        self._due: float | None = None  # when the awaited headers are due (loop time)
        self._timer: asyncio.TimerHandle | None = None  # fires at or before `_due`

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        if not self.guard.admit(self, transport):
            self.refused = True
            if isinstance(transport, asyncio.WriteTransport):
                transport.write(BUSY_RESPONSE)
            transport.close()
            return
        self.inner.connection_made(transport)
        self.arm()  # the first request's headers are due

    def data_received(self, data: bytes) -> None:
        if self.refused:
            return
        if self._due is None and self.guard.is_idle(self):
            self.arm()  # the first byte of a request: its headers are due
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return None if self.refused else self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self.disarm()
        self.guard.forget(self, self.transport)
        if not self.refused:
            self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if not self.refused:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if not self.refused:
            self.inner.resume_writing()

    def arm(self) -> None:
        """Start the header deadline. The timer is kept across requests: a request that
        starts in time only clears `_due` (`hold`), and a timer that fires early re-arms
        itself for the current deadline, so a busy kept-alive connection costs one timer
        per header timeout rather than one per request."""
        loop = asyncio.get_running_loop()
        self._due = loop.time() + self.guard.header_timeout
        if self._timer is None:
            self._timer = loop.call_at(self._due, self._check)

    def hold(self) -> None:
        """A request's headers arrived: no deadline until the next request starts."""
        self._due = None

    def disarm(self) -> None:
        """Stop the header deadline and its timer."""
        self._due = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def close(self, reason: ConnectionClose) -> bool:
        """Drop the connection now (it is idle or misbehaving); False if already gone."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return False
        self.disarm()
        self.guard.forget(self, transport)
        self.guard.metrics.connection_closed(reason)
        if isinstance(transport, asyncio.Transport):
            transport.abort()  # frees the descriptor at once
        else:
            transport.close()
        return True

    def _check(self) -> None:
        self._timer = None
        if self._due is None:
            return
        loop = asyncio.get_running_loop()
        if loop.time() < self._due:  # a later request's deadline: wait for that one
            self._timer = loop.call_at(self._due, self._check)
            return
        self._due = None
        log.debug("closing a connection that sent no complete request headers in time")
        self.close(ConnectionClose.HEADER_TIMEOUT)


def handler_settings(keepalive_timeout: float) -> dict[str, Any]:
    """aiohttp's own per-connection limits (`RequestHandler`'s arguments)."""
    return {
        "keepalive_timeout": keepalive_timeout,  # aiohttp's default is 3,630 s
        "lingering_time": 5.0,  # reading an unread body after answering (default 10 s)
        "max_line_size": 8190,  # request line and each header line (aiohttp's default)
        "max_field_size": 8190,
        "max_headers": 100,  # aiohttp's default is 128
        "access_log": None,  # requests are counted in metrics, not logged one by one
    }


class JsonErrors(RequestHandler):
    """aiohttp's protocol, answering a request it cannot even parse (a control character
    in a header, a line too long) in the API's JSON error format rather than as text
    echoing the bytes, and logging it at debug level: it is the client's mistake, and a
    hostile client must not be able to fill the log."""

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if request.writer.output_size > 0:
            raise ConnectionError("the answer was already started")
        log.debug("unparsable request", exc_info=exc)
        if status >= 500:
            text = "internal server error"
        else:
            first = (message or "").strip().splitlines()
            text = f"malformed request: {first[0][:200]}" if first else "malformed request"
        body = b'{"error":' + json.dumps(text).encode() + b',"details":null}'
        response = web.Response(status=status, body=body, content_type="application/json")
        response.force_close()
        return response
