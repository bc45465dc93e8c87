"""The worker's reader thread: the only reader of the pipe once the worker has booted.

It keeps the attempts the supervisor handed over, in order, for the main thread to take
one at a time (`take`), marks those whose start became durable (`Go`), hands back those
withdrawn before they started (`Dropped`), routes `EnqueueReply` to the handler waiting
for it, and keeps the allowance of the attempts held on the kernel's alarm
(`lease_alarm.py`), which every `Extend` moves forward: when the allowance runs out while
the worker holds attempts (the supervisor is frozen, so their leases are no longer being
renewed) the kernel ends the process. It is also how a worker never outlives its
supervisor: at the pipe's end (the supervisor is gone, whatever killed it) the worker
kills itself at once.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import deque
from collections.abc import Callable

from goqueue.actors.lease_alarm import Alarm
from goqueue.actors.pipe import READ_SIZE, Frames, Pipe
from goqueue.actors.protocol import (
    Boot,
    Dropped,
    EnqueueReply,
    Extend,
    FromWorker,
    Go,
    RunJob,
    RunJobs,
    Shutdown,
    ToWorker,
    Withdraw,
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


class Wait:
    """What `take` returns, without waiting, when no attempt may start yet."""


WAIT = Wait()


class Inbox(threading.Thread):
    """Reads the pipe; keeps the attempts handed over and their allowance on `alarm`;
    kills the worker when the supervisor is gone."""

    def __init__(
        self,
        pipe: Pipe,
        alarm: Alarm,
        *,
        die: Callable[[], None] = kill_self,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(name="goqueue-inbox", daemon=True)
        self.pipe = pipe
        self.alarm = alarm
        self.die = die
        self.clock = clock
        self._frames = Frames(pipe.codec)
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # an attempt came, or may now start
        self._queue: deque[RunJob] = deque()  # handed over, not started, in order
        self._go: set[str] = set()  # queued attempts whose `Go` came
        self._running = False  # the main thread runs an attempt
        self._bounded = False  # the alarm is armed for the attempts held
        self._closing = False  # Shutdown came: exit once nothing is held
        self._refusing = False  # to be recycled: attempts handed over are dropped at once
        self._replies: dict[int, Reply] = {}
        self.ending = False

    # -- the job's thread ---------------------------------------------------------------

    def take(self, outbox: list[FromWorker], *, wait: bool) -> RunJob | Wait | None:
        """The next attempt to run, now marked running; None when the worker is to exit.
        Attempts past their `start_by` are left out and named in a `Dropped` added to
        `outbox`. When the next attempt may not start yet (none held, or its `Go` has not
        come): WAIT, or with `wait` block until one may."""
        with self._changed:
            while True:
                while self._queue:
                    job = self._queue[0]
                    if job.start_by is not None and self.clock() > job.start_by:
                        self._queue.popleft()
                        self._go.discard(job.job_id)
                        outbox.append(Dropped([job.job_id]))
                        continue
                    if not job.go and job.job_id not in self._go:
                        break
                    self._queue.popleft()
                    self._go.discard(job.job_id)
                    self._running = True
                    return job
                if self._closing and not self._queue:
                    return None
                if not wait:
                    return WAIT
                self._disarm_if_idle()
                self._changed.wait()

    def drop_all(self, outbox: list[FromWorker]) -> None:
        """Start none of the attempts queued, nor any handed over from now on (the worker
        is to be recycled): name them in a `Dropped` added to `outbox` (those still to
        come are answered so at once)."""
        with self._lock:
            self._refusing = True
            dropped = [job.job_id for job in self._queue]
            self._queue.clear()
            self._go.clear()
        if dropped:
            outbox.append(Dropped(dropped))

    def finished(self) -> bool:
        """The running attempt's outcome is about to be sent: stop guarding its allowance
        unless more attempts are held. False if the pipe is gone (the worker is about to
        die)."""
        with self._lock:
            self._running = False
            self._disarm_if_idle()
            return not self.ending

    def _disarm_if_idle(self) -> None:
        if self._bounded and not self._running and not self._queue:
            self.alarm.disarm()
            self._bounded = False

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
            case RunJobs(jobs=jobs):
                if self._refusing:
                    self.pipe.send(Dropped([job.job_id for job in jobs]))
                    return
                with self._changed:
                    allowance = jobs[-1].allowance
                    if allowance is not None:
                        self.alarm.arm(allowance)
                        self._bounded = True
                    self._queue.extend(jobs)
                    self._changed.notify()
            case Go(job_ids=job_ids):
                with self._changed:
                    self._go.update(job_ids)
                    self._changed.notify()
            case Withdraw(job_ids=job_ids):
                self._withdraw(set(job_ids))
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
                with self._changed:
                    self._closing = True
                    self._changed.notify()
            case Boot():
                pass  # only ever the first frame, read before the inbox starts

    def _withdraw(self, job_ids: set[str]) -> None:
        """Forget the queued attempts named (not one already started), and say which."""
        with self._changed:
            dropped = [job.job_id for job in self._queue if job.job_id in job_ids]
            if not dropped:
                return
            self._queue = deque(job for job in self._queue if job.job_id not in job_ids)
            self._go.difference_update(dropped)
            self._disarm_if_idle()
        self.pipe.send(Dropped(dropped))
