"""The worker's reader thread: the only reader of the pipe once the worker has booted.

It hands `RunJob` and `Shutdown` to the main thread, routes `EnqueueReply` to the
handler waiting for it, and keeps the running job's allowance, which every `Extend`
moves forward. It is also how a worker never outlives its supervisor: at the pipe's end
(the supervisor is gone, whatever killed it) the worker kills itself at once, and when
the allowance runs out mid-job (the supervisor is frozen, so the job's lease is no longer
being renewed) it tells the supervisor why, if the pipe takes it, and kills itself.
"""

from __future__ import annotations

import os
import queue
import select
import signal
import threading
import time
from collections.abc import Callable

from goqueue.actors.pipe import READ_SIZE, Frames, Pipe
from goqueue.actors.protocol import (
    Abandoned,
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
    """Reads the pipe; keeps the running job's allowance; kills the worker when the
    supervisor is gone or has gone silent during a job."""

    def __init__(
        self,
        pipe: Pipe,
        *,
        die: Callable[[], None] = kill_self,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(name="goqueue-inbox", daemon=True)
        self.pipe = pipe
        self.die = die
        self.clock = clock
        self.jobs: queue.SimpleQueue[RunJob | None] = queue.SimpleQueue()
        self._frames = Frames(pipe.codec)
        self._lock = threading.Lock()
        self._job: RunJob | None = None
        self._job_started = 0.0
        self._heard = 0.0  # when the supervisor last extended the running job
        self._deadline: float | None = None
        self._replies: dict[int, Reply] = {}
        self.ending = False

    # -- the job's thread ---------------------------------------------------------------

    def finished(self) -> bool:
        """The job's outcome is about to be sent: stop guarding its allowance. False if
        the inbox already gave the attempt up (the worker is about to die)."""
        with self._lock:
            self._job, self._deadline = None, None
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
        poller = select.poll()
        poller.register(self.pipe.fileno(), select.POLLIN)
        while True:
            if not poller.poll(self._wait_ms()):
                self.check_allowance()
                if self.ending:
                    return
                continue
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
            self.check_allowance()
            if self.ending:
                return

    def _wait_ms(self) -> int:
        with self._lock:
            deadline = self._deadline
        if deadline is None:
            return -1
        return max(0, int((deadline - self.clock()) * 1000) + 1)

    def handle(self, message: ToWorker) -> None:
        """Act on one message from the supervisor."""
        match message:
            case RunJob() as job:
                now = self.clock()
                with self._lock:
                    self._job, self._job_started, self._heard = job, now, now
                    self._deadline = now + job.allowance if job.allowance else None
                self.jobs.put(job)
            case Extend(seconds=seconds):
                now = self.clock()
                with self._lock:
                    if self._job is not None and self._deadline is not None:
                        self._heard, self._deadline = now, now + seconds
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

    def check_allowance(self) -> None:
        """Kill the worker if the running job outlived its allowance."""
        with self._lock:
            job, deadline = self._job, self._deadline
            now = self.clock()
            if self.ending or job is None or deadline is None or now < deadline:
                return
            self.ending = True
            silent, ran = now - self._heard, now - self._job_started
        error = (
            f"abandoned by worker {os.getpid()}: the supervisor sent no word for "
            f"{silent:.1f}s, past the worker's allowance, so the worker stopped the "
            "attempt before its lease could run out"
        )
        self.pipe.send_nowait(Abandoned(job.job_id, error, ran))
        self.die()
