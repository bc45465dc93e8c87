"""A lean HTTP/1.1 keep-alive client for `goqueue bench`.

aiohttp's client costs more CPU per request than the server being measured, and on a
2-core machine that shows up as the server's latency. This one writes prebuilt request
bytes and parses only the status line and Content-Length: enough for our JSON answers.
"""

from __future__ import annotations

import asyncio
import socket


class _Connection(asyncio.Protocol):
    """One keep-alive connection; one request in flight at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.waiter: asyncio.Future[tuple[int, bytes]] | None = None
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionError("connection closed"))

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        head_end = self.buffer.find(b"\r\n\r\n")
        if head_end < 0:
            return
        head = bytes(self.buffer[:head_end]).decode("latin-1")
        length = 0
        for line in head.split("\r\n")[1:]:
            name, _, value = line.partition(":")
            if name.lower() == "content-length":
                length = int(value)
        end = head_end + 4 + length
        if len(self.buffer) < end:
            return
        body = bytes(self.buffer[head_end + 4 : end])
        del self.buffer[:end]
        status = int(head[9:12])
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result((status, body))

    def send(self, raw: bytes) -> asyncio.Future[tuple[int, bytes]]:
        assert self.transport is not None
        if self.closed:  # a write would vanish and the answer never come
            raise ConnectionError("connection closed")
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(raw)
        return self.waiter


class LoadClient:
    """A pool of keep-alive connections to one host; grows when all are busy."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self.idle: list[_Connection] = []
        self.all: list[_Connection] = []

    @staticmethod
    def build(
        method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
    ) -> bytes:
        """Prebuilt request bytes, reusable for every send (with `headers` besides)."""
        extra = "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items())
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
            f"{extra}Content-Length: {len(body)}\r\n\r\n"
        )
        return head.encode() + body

    async def send(self, raw: bytes) -> tuple[int, bytes]:
        """Send one prebuilt request; returns (status, body)."""
        conn = None
        while self.idle and conn is None:
            conn = self.idle.pop()
            if conn.closed:  # the server closed it while idle (keep-alive timeout)
                conn = None
        if conn is None:
            conn = await self._connect()
        try:
            return await conn.send(raw)
        finally:
            if not conn.closed:
                self.idle.append(conn)

    async def request(self, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
        """Build and send one request."""
        return await self.send(self.build(method, path, body))

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_connection(_Connection, self.host, self.port)
        self.all.append(conn)
        return conn

    def close(self) -> None:
        """Close every connection."""
        for conn in self.all:
            if conn.transport is not None:
                conn.transport.close()
