"""A worker's loop and inbox driven in this process over a real socket pair, the test
playing the supervisor (its death notice recorded instead of SIGKILL, and the lease
alarm a thread's timer recording a death instead of the kernel's SIGALRM)."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

from goqueue.actors.child import Worker
from goqueue.actors.inbox import Inbox
from goqueue.actors.pipe import HEADER, Pipe
from goqueue.actors.protocol import FromWorker, Shutdown, SupervisorCodec, ToWorker
from goqueue.actors.registry import Actor, Registry


class ThreadAlarm:
    """The lease alarm on a thread's timer: it records a death in `deaths`, and every
    arming is kept in `armed` (seconds)."""

    def __init__(self, deaths: list[float]) -> None:
        self.deaths = deaths
        self.armed: list[float] = []
        self._timer: threading.Timer | None = None

    def arm(self, seconds: float) -> None:
        self.disarm()
        self.armed.append(seconds)
        self._timer = threading.Timer(seconds, lambda: self.deaths.append(time.monotonic()))
        self._timer.daemon = True
        self._timer.start()

    def disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class Harness:
    """The supervisor's side of one in-process worker."""

    def __init__(self, *actors: Actor, max_result_bytes: int | None = None) -> None:
        self.sock, theirs = socket.socketpair()
        self.codec = SupervisorCodec()
        self.deaths: list[float] = []
        pipe = Pipe(theirs)
        self.alarm = ThreadAlarm(self.deaths)
        self.inbox = Inbox(pipe, self.alarm, die=lambda: self.deaths.append(time.monotonic()))
        registry = Registry({a.name: a for a in actors})
        self.worker = Worker(pipe, self.inbox, registry, max_result_bytes=max_result_bytes)
        self.inbox.start()
        self.thread = threading.Thread(target=self.worker.serve, daemon=True)
        self.thread.start()
        self._buffer = b""

    def send(self, message: ToWorker) -> None:
        payload = self.codec.encode(message)
        self.sock.sendall(HEADER.pack(len(payload)) + payload)

    def recv(self, timeout: float = 5.0) -> FromWorker:
        """The next message from the worker; raises TimeoutError."""
        deadline = time.monotonic() + timeout
        while True:
            if len(self._buffer) >= HEADER.size:
                (length,) = HEADER.unpack_from(self._buffer)
                end = HEADER.size + length
                if len(self._buffer) >= end:
                    frame, self._buffer = self._buffer[HEADER.size : end], self._buffer[end:]
                    return self.codec.decode(frame)
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no message from the worker")
            self.sock.settimeout(left)
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError("the worker closed its end")
            self._buffer += chunk

    def recv_until(self, kind: type[Any], timeout: float = 5.0) -> tuple[Any, list[FromWorker]]:
        """Read up to the first message of `kind`; it and what came before it."""
        before: list[FromWorker] = []
        while True:
            message = self.recv(timeout)
            if isinstance(message, kind):
                return message, before
            before.append(message)

    def close(self) -> None:
        """Ask the loop to stop and wait for it."""
        if self.thread.is_alive():
            self.send(Shutdown())
            self.thread.join(5)
        self.sock.close()
