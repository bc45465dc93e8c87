"""Worker processes: spawning, the pipes, deadlines, the two-phase kill and reaping.

Children come from a `forkserver` (never a plain fork of this threaded, event-looped
process). Each child's pipe and its process sentinel are watched with `add_reader`, so
nothing here blocks the loop; the sentinel firing is the death notice, and its exit code
or signal is named in the error of whatever attempt the child was running.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import signal
import socket
import struct
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from typing import Protocol

from goqueue.actors import child
from goqueue.actors.protocol import (
    WORKER_BOOT_ERROR,
    BootFailed,
    JobDone,
    JobFailed,
    Ready,
    RunJob,
    Shutdown,
    SupervisorCodec,
)
from goqueue.supervisor.jobs import Lease

log = logging.getLogger("goqueue.pool")

BOOTING, IDLE, BUSY, STOPPING = "booting", "idle", "busy", "stopping"


@dataclass(eq=False)
class Worker:
    """The supervisor's handle on one child process."""

    slot: int
    generation: int
    pid: int  # kept here: the Process object is closed once the child is reaped
    process: BaseProcess
    channel: Channel
    state: str = BOOTING
    types: frozenset[str] = frozenset()
    lease: Lease | None = None
    attempt_started: float = 0.0
    jobs_run: int = 0
    rss_kb: int = 0
    kill_reason: str | None = None
    retire: bool = False  # replace after the current job (reload, recycle, shrink)
    exitcode: int | None = None
    _timers: list[asyncio.TimerHandle] = field(default_factory=list)

    def cancel_timers(self) -> None:
        """Drop the pending deadline and kill timers."""
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()


_HEADER = struct.Struct("!i")  # multiprocessing.Connection's frame header


class Channel(asyncio.Protocol):
    """The supervisor's end of a worker's pipe as an asyncio transport: buffered
    non-blocking writes, and whole frames decoded as they arrive (no extra syscalls)."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.worker: Worker | None = None
        self.transport: asyncio.Transport | None = None
        self.pending: list[bytes] = []
        self.buffer = bytearray()
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
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
            message = self.pool.codec.decode(view[offset + 4 : end])
            offset = end
            if self.worker is not None:
                self.pool._dispatch(self.worker, message)
        if offset < size:
            self.buffer += view[offset:]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.worker is not None and self.worker.exitcode is not None:
            self.pool._finalize(self.worker)

    def close(self) -> None:
        """Drop the transport."""
        if self.transport is not None:
            self.transport.close()


class PoolEvents(Protocol):
    """What the pool reports; implemented by the dispatcher."""

    def worker_ready(self, worker: Worker, message: Ready) -> None:
        """A child booted."""

    def worker_boot_failed(self, worker: Worker, message: BootFailed) -> None:
        """A child could not import its actors."""

    def job_done(self, worker: Worker, message: JobDone) -> None:
        """An attempt succeeded."""

    def job_failed(self, worker: Worker, message: JobFailed) -> None:
        """An attempt raised."""

    def worker_exited(self, worker: Worker) -> None:
        """A child is gone (`worker.exitcode`, `worker.kill_reason`, maybe `worker.lease`)."""


def describe_exit(exitcode: int | None) -> str:
    """Name an exit status for humans: 'killed by SIGKILL', 'exited with code 3'."""
    if exitcode is None:
        return "exit status unknown"
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exited with code {exitcode}"


class Pool:
    """The set of child processes, and the mechanics of talking to and killing them."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        events: PoolEvents,
        modules: Sequence[str],
        *,
        kill_grace: float = 0.05,
    ) -> None:
        self.loop = loop
        self.events = events
        self.modules = list(modules)
        self.kill_grace = kill_grace
        self.codec = SupervisorCodec()
        self.workers: dict[int, Worker] = {}
        self._attaching: set[asyncio.Future[object]] = set()
        self._slots = 0
        self._all_gone = asyncio.Event()
        self._mp = multiprocessing.get_context("forkserver")
        self._mp.set_forkserver_preload(["goqueue.actors.child"])

    def __iter__(self) -> Iterator[Worker]:
        return iter(list(self.workers.values()))

    def __len__(self) -> int:
        return len(self.workers)

    def count(self, *states: str) -> int:
        """How many workers are in any of `states`."""
        return sum(1 for w in self.workers.values() if w.state in states)

    def idle(self) -> list[Worker]:
        """Workers ready for a job."""
        return [w for w in self.workers.values() if w.state == IDLE]

    def holding(self, token: str) -> Worker | None:
        """The worker running the attempt with lease `token`."""
        for worker in self.workers.values():
            if worker.lease is not None and worker.lease.token == token:
                return worker
        return None

    # -- lifecycle -------------------------------------------------------------------

    def spawn(self, generation: int, modules: Sequence[str] | None = None) -> Worker:
        """Start one child; it reports Ready (or BootFailed) over its pipe."""
        ours, theirs = self._mp.Pipe(duplex=True)
        self._slots += 1
        process = self._mp.Process(
            target=child.main,
            args=(theirs, list(modules or self.modules)),
            name=f"goqueue-worker-{self._slots}",
        )
        process.start()
        theirs.close()
        channel = Channel(self)
        sock = socket.socket(fileno=os.dup(ours.fileno()))
        ours.close()
        worker = Worker(self._slots, generation, process.pid or 0, process, channel)
        channel.worker = worker
        self.workers[worker.pid] = worker
        self._all_gone.clear()
        self._attaching.add(
            asyncio.ensure_future(self.loop.connect_accepted_socket(lambda: channel, sock))
        )
        self.loop.add_reader(process.sentinel, self._on_exit, worker)
        log.debug("worker spawned", extra={"worker_pid": worker.pid, "slot": worker.slot})
        return worker

    def run(self, worker: Worker, lease: Lease, timeout: float) -> None:
        """Hand `lease` to an idle worker and arm its deadline."""
        job = lease.job
        message = RunJob(job.id, job.type, job.attempts, job.queue, bytes(job.payload))
        worker.state = BUSY
        worker.lease = lease
        worker.attempt_started = time.monotonic()
        worker._timers.append(self.loop.call_later(timeout, self.kill, worker, "timeout"))
        self._send(worker, message)

    def stop(self, worker: Worker) -> None:
        """Ask an idle worker to exit cleanly (recycling, reload, shrink)."""
        worker.state = STOPPING
        worker.kill_reason = worker.kill_reason or "stopped"
        self._send(worker, Shutdown())
        worker._timers.append(self.loop.call_later(5.0, self._sigkill, worker))

    def kill(self, worker: Worker, reason: str) -> None:
        """Two-phase kill: SIGTERM now, SIGKILL after the grace if it is still there."""
        if worker.exitcode is not None or worker.kill_reason not in (None, "stopped"):
            return
        worker.kill_reason = reason
        worker.state = STOPPING
        worker.cancel_timers()
        self._signal(worker, signal.SIGTERM)
        worker._timers.append(self.loop.call_later(self.kill_grace, self._sigkill, worker))

    def _sigkill(self, worker: Worker) -> None:
        if worker.exitcode is None:
            self._signal(worker, signal.SIGKILL)

    def _signal(self, worker: Worker, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker.pid, sig)

    def _send(self, worker: Worker, message: RunJob | Shutdown) -> None:
        worker.channel.send(self.codec.encode(message))

    # -- reading ---------------------------------------------------------------------

    def _dispatch(self, worker: Worker, message: object) -> None:
        match message:
            case JobDone() | JobFailed():
                worker.cancel_timers()
                worker.jobs_run += 1
                worker.rss_kb = message.rss_kb
                if worker.state == BUSY:
                    worker.state = IDLE
                if isinstance(message, JobDone):
                    self.events.job_done(worker, message)
                else:
                    self.events.job_failed(worker, message)
                worker.lease = None
            case Ready():
                worker.types = frozenset(a.name for a in message.actors)
                if worker.state == BOOTING:
                    worker.state = IDLE
                self.events.worker_ready(worker, message)
            case BootFailed():
                self.events.worker_boot_failed(worker, message)

    def _on_exit(self, worker: Worker) -> None:
        """The sentinel fired: note the exit code, then settle once the pipe has been read
        to its end (whatever the child said before dying still counts)."""
        self.loop.remove_reader(worker.process.sentinel)
        worker.process.join(0)
        worker.exitcode = worker.process.exitcode
        worker.cancel_timers()
        if worker.channel.closed:
            self._finalize(worker)
        else:  # EOF normally follows at once; don't wait on it forever
            self.loop.call_later(0.2, self._finalize, worker)

    def _finalize(self, worker: Worker) -> None:
        if self.workers.get(worker.pid) is not worker:
            return  # already settled
        worker.channel.close()
        self.workers.pop(worker.pid, None)
        if not self.workers:
            self._all_gone.set()
        if worker.exitcode == WORKER_BOOT_ERROR and worker.kill_reason is None:
            worker.kill_reason = "boot"
        self.events.worker_exited(worker)
        worker.process.close()

    async def shutdown(self, timeout: float = 5.0) -> None:
        """Stop every child: Shutdown to the idle, SIGTERM/SIGKILL to the rest."""
        for worker in self:
            if worker.state == IDLE:
                self.stop(worker)
            elif worker.state != STOPPING:
                self.kill(worker, "shutdown")
        if self.workers:
            try:
                await asyncio.wait_for(self._all_gone.wait(), timeout)
            except TimeoutError:
                for worker in self:
                    self._signal(worker, signal.SIGKILL)
                await asyncio.wait_for(self._all_gone.wait(), 2.0)
