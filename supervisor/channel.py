"""The supervisor's end of a worker's pipe: length-prefixed frames over an asyncio
transport, decoded as they arrive and handed to whoever listens (the pool)."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable
from typing import cast

from goqueue.actors.protocol import FromWorker

_HEADER = struct.Struct("!I")  # 4-byte big-endian length, as actors/pipe.py writes


class Channel(asyncio.Protocol):
    """The supervisor's end of a worker's pipe as an asyncio transport: buffered
    non-blocking writes, and whole frames decoded as they arrive (no extra syscalls)."""

    def __init__(self, decode: Callable[[memoryview], FromWorker]) -> None:
        self.decode = decode
        self.on_message: Callable[[FromWorker], None] = _ignore
        self.on_closed: Callable[[], None] = _nothing
        self.transport: asyncio.WriteTransport | None = None
        self.pending: list[bytes] = []
        self.buffer = bytearray()
        self.closed = False

    def listen(
        self, on_message: Callable[[FromWorker], None], on_closed: Callable[[], None]
    ) -> None:
        """Say where decoded messages, and the end of the pipe, are reported."""
        self.on_message = on_message
        self.on_closed = on_closed

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # a connected stream socket's transport writes (uvloop's does not subclass
        # asyncio.WriteTransport, so this cannot be an isinstance check)
        self.transport = cast(asyncio.WriteTransport, transport)
        for frame in self.pending:
            self.transport.write(frame)
        self.pending.clear()

    def send(self, payload: bytes) -> None:
        """Write one frame (queued until the transport is attached)."""
        frame = _HEADER.pack(len(payload)) + payload
        if self.transport is None:
            self.pending.append(frame)
        elif not self.closed:
            self.transport.write(frame)

    def data_received(self, data: bytes) -> None:
        if self.buffer:
            self.buffer += data
            data = bytes(self.buffer)
            self.buffer.clear()
        view = memoryview(data)
        offset, size = 0, len(data)
        while size - offset >= 4:
            (length,) = _HEADER.unpack_from(view, offset)
            end = offset + 4 + length
            if end > size:
                break
            message = self.decode(view[offset + 4 : end])
            offset = end
            self.on_message(message)
        if offset < size:
            self.buffer += view[offset:]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.on_closed()

    def close(self) -> None:
        """Drop the transport."""
        if self.transport is not None:
            self.transport.close()


def _ignore(message: FromWorker) -> None:
    """A channel's reader before the pool listens."""


def _nothing() -> None:
    """A channel's close callback before the pool listens."""
