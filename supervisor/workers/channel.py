"""The supervisor's end of a worker's pipe: length-prefixed frames over a non-blocking
socket watched by the loop, decoded as they arrive and handed to whoever listens (the pool).

It reads and writes the socket itself rather than through an asyncio transport: a worker
that dies leaves its last words (an outcome) unread in the pipe, and a transport whose
write fails (the peer is gone) closes itself before reading them. Here a
failed write only stops the writing; reading goes on to the end of the pipe.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from collections.abc import Callable

from goqueue.actors.protocol import FromWorker

_HEADER = struct.Struct("!I")  # 4-byte big-endian length, as actors/pipe.py writes
READ_SIZE = 256 * 1024


class Channel:
    """One worker's pipe: whole frames in, buffered non-blocking writes out."""

    def __init__(
        self,
        decode: Callable[[memoryview], FromWorker],
        timed: Callable[[float], None] = lambda seconds: None,
    ) -> None:
        self.decode = decode
        self.timed = timed  # told how long each read (with what it set off) took
        self.on_message: Callable[[FromWorker], None] = _ignore
        self.on_closed: Callable[[], None] = _nothing
        self.buffer = bytearray()
        self.closed = False  # the worker's end is closed: everything it sent has been read
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sock: socket.socket | None = None
        self._out = bytearray()
        self._broken = False  # writing failed (the worker is gone): writes are dropped

    def listen(
        self, on_message: Callable[[FromWorker], None], on_closed: Callable[[], None]
    ) -> None:
        """Say where decoded messages, and the end of the pipe, are reported."""
        self.on_message = on_message
        self.on_closed = on_closed

    def attach(self, loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
        """Start reading `sock` on `loop`."""
        sock.setblocking(False)
        self._loop, self._sock = loop, sock
        loop.add_reader(sock.fileno(), self._readable)

    def send(self, payload: bytes) -> None:
        """Write one frame of `payload`, now or as soon as the pipe takes it."""
        self.send_frame(_HEADER.pack(len(payload)) + payload)

    def send_frame(self, frame: bytes | bytearray) -> None:
        """Write one whole frame (length prefix included, as `SupervisorCodec.frame`
        makes it), now or as soon as the pipe takes it. Frames sent while earlier ones
        wait for the pipe join them, and go out together in one write."""
        if self._sock is None or self._broken or self.closed:
            return
        if self._out:
            self._out += frame
            return
        try:
            sent = self._sock.send(frame)
        except BlockingIOError:
            sent = 0
        except OSError:
            self._broken = True
            return
        if sent < len(frame):
            self._out += memoryview(frame)[sent:]
            assert self._loop is not None
            self._loop.add_writer(self._sock.fileno(), self._writable)

    def _writable(self) -> None:
        assert self._sock is not None and self._loop is not None
        try:
            sent = self._sock.send(self._out)
        except BlockingIOError:
            return
        except OSError:
            sent, self._broken = len(self._out), True
        del self._out[:sent]
        if not self._out:
            self._loop.remove_writer(self._sock.fileno())

    def _readable(self) -> None:
        started = time.perf_counter()
        try:
            self._read()
        finally:
            self.timed(time.perf_counter() - started)

    def _read(self) -> None:
        while self._sock is not None:  # a listener may close the channel as it reads
            try:
                data = self._sock.recv(READ_SIZE)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self._end()
                return
            self.data_received(data)
            if len(data) < READ_SIZE:
                return

    def data_received(self, data: bytes) -> None:
        """Decode every whole frame in what has arrived; keep the rest for later."""
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

    def _end(self) -> None:
        self.closed = True
        self._detach()
        self.on_closed()

    def _detach(self) -> None:
        if self._sock is None or self._loop is None:
            return
        self._loop.remove_reader(self._sock.fileno())
        if self._out:
            self._loop.remove_writer(self._sock.fileno())
        self._sock.close()
        self._sock = None

    def close(self) -> None:
        """Stop watching the pipe and close our end."""
        self._detach()


def _ignore(message: FromWorker) -> None:
    """A channel's reader before the pool listens."""


def _nothing() -> None:
    """A channel's close callback before the pool listens."""
