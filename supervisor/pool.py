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
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Protocol

from actors import child
from actors.protocol import (
    WORKER_BOOT_ERROR,
    BootFailed,
    JobDone,
    JobFailed,
    Ready,
    RunJob,
    Shutdown,
    SupervisorCodec,
)
from supervisor.jobs import Lease

log = logging.getLogger("goqueue.pool")

BOOTING, IDLE, BUSY, STOPPING = "booting", "idle", "busy", "stopping"


@dataclass(eq=False)
class Worker:
    """The supervisor's handle on one child process."""

    slot: int
    generation: int
    process: BaseProcess
    conn: Connection
    state: str = BOOTING
    types: frozenset[str] = frozenset()
    lease: Lease | None = None
    started_at: float = field(default_factory=time.monotonic)
    attempt_started: float = 0.0
    jobs_run: int = 0
    rss_kb: int = 0
    kill_reason: str | None = None
    retire: bool = False  # replace after the current job (reload, recycle, shrink)
    exitcode: int | None = None
    _timers: list[asyncio.TimerHandle] = field(default_factory=list)

    @property
    def pid(self) -> int:
        """The child's process id."""
        return self.process.pid or 0

    def cancel_timers(self) -> None:
        """Drop the pending deadline and kill timers."""
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()


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
        self._slots = 0
        self._all_gone = asyncio.Event()
        self._mp = multiprocessing.get_context("forkserver")
        self._mp.set_forkserver_preload(["actors.child"])

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
        worker = Worker(self._slots, generation, process, ours)
        self.workers[worker.pid] = worker
        self._all_gone.clear()
        self.loop.add_reader(ours.fileno(), self._on_readable, worker)
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
        try:
            worker.conn.send_bytes(self.codec.encode(message))
        except OSError as exc:  # the child died; its sentinel will report it
            log.warning("pipe to worker broken", extra={"worker_pid": worker.pid, "err": str(exc)})

    # -- reading ---------------------------------------------------------------------

    def _on_readable(self, worker: Worker) -> None:
        try:
            while worker.conn.poll():
                self._dispatch(worker, self.codec.decode(worker.conn.recv_bytes()))
        except (EOFError, OSError):
            self.loop.remove_reader(worker.conn.fileno())

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
        self.loop.remove_reader(worker.process.sentinel)
        if not worker.conn.closed:
            self._on_readable(worker)  # whatever it said before dying still counts
            self.loop.remove_reader(worker.conn.fileno())
            worker.conn.close()
        worker.process.join(0)
        worker.exitcode = worker.process.exitcode
        worker.cancel_timers()
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
