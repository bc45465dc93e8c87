"""The worker's end of its pipe to the supervisor: length-prefixed msgspec frames over the
socket the supervisor handed it at spawn.

Several threads write (the job's thread with outcomes and requests, the progress courier,
the inbox when it gives up on a frozen supervisor), so writes take a lock; only the inbox
reads once the worker has booted.
"""

from __future__ import annotations

import socket
import struct
import threading

from goqueue.actors.protocol import FromWorker, ToWorker, WorkerCodec

HEADER = struct.Struct("!I")
READ_SIZE = 256 * 1024


class Pipe:
    """Frames to and from the supervisor over a connected stream socket."""

    def __init__(self, sock: socket.socket, codec: WorkerCodec | None = None) -> None:
        self.sock = sock
        self.codec = codec or WorkerCodec()
        self._lock = threading.Lock()

    def fileno(self) -> int:
        """The socket's descriptor (for poll)."""
        return self.sock.fileno()

    def send(self, message: FromWorker) -> None:
        """Write one whole frame; blocks while the supervisor's side is full."""
        frame = self.codec.frame(message)
        with self._lock:
            self.sock.sendall(frame)

    def send_all(self, messages: list[FromWorker]) -> None:
        """Write several frames in one write (an outcome and the next `Started`)."""
        buffer = self.codec.frames(messages)
        with self._lock:
            self.sock.sendall(buffer)

    def read(self) -> ToWorker | None:
        """Block for one whole frame (boot only: later the inbox reads); None at EOF."""
        header = self._read_exactly(HEADER.size)
        if header is None:
            return None
        (length,) = HEADER.unpack(header)
        body = self._read_exactly(length)
        return None if body is None else self.codec.decode(body)

    def _read_exactly(self, size: int) -> bytes | None:
        data = bytearray()
        while len(data) < size:
            chunk = self.sock.recv(size - len(data))
            if not chunk:
                return None
            data += chunk
        return bytes(data)


class Frames:
    """Whole frames out of a byte stream that arrives in arbitrary pieces."""

    def __init__(self, codec: WorkerCodec) -> None:
        self.codec = codec
        self.buffer = bytearray()

    def feed(self, data: bytes) -> list[ToWorker]:
        """Add `data`; return every message now complete, in order."""
        self.buffer += data
        messages: list[ToWorker] = []
        offset = 0
        view = memoryview(self.buffer)
        while len(view) - offset >= HEADER.size:
            (length,) = HEADER.unpack_from(view, offset)
            end = offset + HEADER.size + length
            if end > len(view):
                break
            messages.append(self.codec.decode(view[offset + HEADER.size : end]))
            offset = end
        view.release()
        del self.buffer[:offset]
        return messages
