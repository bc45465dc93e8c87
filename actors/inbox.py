"""The worker's reader thread: the only reader of the pipe once the worker has booted.

It hands `RunJob` and `Shutdown` to the main thread, routes `EnqueueReply` to the
handler waiting for it, and keeps the running job's allowance on the kernel's alarm
(`lease_alarm.py`), which every `Extend` moves forward: when the allowance runs out
mid-job (the supervisor is frozen, so the job's lease is no longer being renewed) the
kernel ends the process. It is also how a worker never outlives its supervisor: at the
pipe's end (the supervisor is gone, whatever killed it) the worker kills itself at once.
"""

from __future__ import annotations

import os
import queue
import signal
import threading
from collections.abc import Callable

from goqueue.actors.lease_alarm import Alarm
from goqueue.actors.pipe import READ_SIZE, Frames, Pipe
from goqueue.actors.protocol import (
    Boot,
    EnqueueReply,
    Extend,
    RunJob,
    Shutdown,
    ToWorker,
)


def kill_self() -> None:
    """SIGKILL this process: nothing in it may run on (not even `finally` blocks)."""
    os.kill(os.getpid(), signal.SIGKILL)


class Reply:
    """One pending `EnqueueRequest`: the handler's thread waits here for its answer."""

    def __init__(self) -> None:
        self.ready = threading.Event()
        self.answer: EnqueueReply | None = None

    def wait(self, timeout: float) -> EnqueueReply | None:
        """The answer, or None if none came within `timeout` seconds."""
        self.ready.wait(timeout)
        return self.answer


class Inbox(threading.Thread):
    """Reads the pipe; keeps the running job's allowance on `alarm`; kills the worker
    when the supervisor is gone."""

    def __init__(self, pipe: Pipe, alarm: Alarm, *, die: Callable[[], None] = kill_self) -> None:
        super().__init__(name="goqueue-inbox", daemon=True)
        self.pipe = pipe
        self.alarm = alarm
        self.die = die
        self.jobs: queue.SimpleQueue[RunJob | None] = queue.SimpleQueue()
        self._frames = Frames(pipe.codec)
        self._lock = threading.Lock()  # the alarm is armed only while a job is running
        self._bounded = False  # the running job has an allowance
        self._replies: dict[int, Reply] = {}
        self.ending = False

    # -- the job's thread ---------------------------------------------------------------

    def finished(self) -> bool:
        """The job's outcome is about to be sent: stop guarding its allowance. False if
        the pipe is gone (the worker is about to die)."""
        with self._lock:
            if self._bounded:
                self.alarm.disarm()
            self._bounded = False
            return not self.ending

    def expect(self, request_id: int) -> Reply:
        """Register a request whose answer the caller will wait for."""
        reply = Reply()
        with self._lock:
            self._replies[request_id] = reply
        return reply

    def forget(self, request_id: int) -> None:
        """Drop a request whose caller stopped waiting."""
        with self._lock:
            self._replies.pop(request_id, None)

    # -- the reader thread --------------------------------------------------------------

    def run(self) -> None:
        while True:
            try:
                data = self.pipe.sock.recv(READ_SIZE)
            except OSError:
                data = b""
            if not data:  # the supervisor is gone: nothing may outlive it
                self.ending = True
                self.die()
                return
            for message in self._frames.feed(data):
                self.handle(message)

    def handle(self, message: ToWorker) -> None:
        """Act on one message from the supervisor."""
        match message:
            case RunJob(allowance=allowance) as job:
                with self._lock:
                    self._bounded = allowance is not None
                    if allowance is not None:
                        self.alarm.arm(allowance)
                self.jobs.put(job)
            case Extend(seconds=seconds):
                with self._lock:
                    if self._bounded:
                        self.alarm.arm(seconds)
            case EnqueueReply(request_id=request_id) as answer:
                with self._lock:
                    reply = self._replies.pop(request_id, None)
                if reply is not None:
                    reply.answer = answer
                    reply.ready.set()
            case Shutdown():
                self.jobs.put(None)
            case Boot():
                pass  # only ever the first frame, read before the inbox starts
