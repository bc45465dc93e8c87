"""Worker processes: spawning, the pipes, deadlines, the two-phase kill and reaping.

Children come from a `forkserver` (never a plain fork of this threaded, event-looped
process). Each child's pipe and its process sentinel are watched by the loop, so nothing
here blocks; the sentinel firing is the death notice, and its exit code or signal is named
in the error of whatever attempt the child was running.

The pool reports on two channels: what became of each attempt (`JobEvents`, the
dispatcher) and a worker's lifecycle (`WorkerEvents`, the arbiter). Replacing a worker
after a job (its own policy, `Recycle`) happens here, before either hears of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import signal
import socket
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Protocol

from goqueue.actors import child
from goqueue.actors.protocol import (
    WORKER_BOOT_ERROR,
    BootFailed,
    FromWorker,
    JobDone,
    JobFailed,
    Ready,
    RunJob,
    Shutdown,
    SupervisorCodec,
)
from goqueue.supervisor.channel import Channel
from goqueue.supervisor.jobs import Lease
from goqueue.supervisor.vocab import KillReason, WorkerState
from goqueue.supervisor.worker import Worker

if TYPE_CHECKING:
    from goqueue.supervisor.config import Settings

log = logging.getLogger("goqueue.pool")

STOP_GRACE = 5.0  # seconds a worker asked to exit cleanly gets before SIGKILL
EOF_GRACE = 0.2  # seconds to wait for a dead child's pipe to drain before settling it


class JobEvents(Protocol):
    """What became of the attempts the pool ran; implemented by the dispatcher."""

    def job_done(self, lease: Lease, message: JobDone) -> None:
        """An attempt succeeded."""

    def job_failed(self, lease: Lease, message: JobFailed) -> None:
        """An attempt raised."""

    def job_lost(self, lease: Lease, worker: Worker) -> None:
        """A worker died holding `lease` (`worker.kill_reason` and `exitcode` say how)."""


class WorkerEvents(Protocol):
    """A worker's lifecycle; implemented by the arbiter (boot, reload, respawn)."""

    def worker_ready(self, worker: Worker, message: Ready) -> None:
        """A child booted."""

    def worker_boot_failed(self, worker: Worker, message: BootFailed) -> None:
        """A child could not import its actors."""

    def worker_recycled(self, worker: Worker) -> None:
        """A worker is being replaced after its job (the `Recycle` policy)."""

    def worker_exited(self, worker: Worker) -> None:
        """A child is gone (`worker.exitcode`, `worker.kill_reason`), its attempt settled."""


class Unheard:
    """The listener a pool starts with: events before anyone listens are logged."""

    def job_done(self, lease: Lease, message: JobDone) -> None:
        """Logged."""
        log.error("attempt outcome with no listener", extra={"job_id": lease.job.id})

    def job_failed(self, lease: Lease, message: JobFailed) -> None:
        """Logged."""
        log.error("attempt outcome with no listener", extra={"job_id": lease.job.id})

    def job_lost(self, lease: Lease, worker: Worker) -> None:
        """Logged."""
        log.error("attempt outcome with no listener", extra={"job_id": lease.job.id})

    def worker_ready(self, worker: Worker, message: Ready) -> None:
        """Ignored: nobody asked for workers yet."""

    def worker_boot_failed(self, worker: Worker, message: BootFailed) -> None:
        """Logged."""
        log.error(f"worker cannot boot: {message.error}", extra={"worker_pid": worker.pid})

    def worker_recycled(self, worker: Worker) -> None:
        """Ignored."""

    def worker_exited(self, worker: Worker) -> None:
        """Ignored."""


@dataclass(frozen=True, slots=True)
class Recycle:
    """When a worker is replaced after a job: after `max_jobs` jobs, or once its resident
    memory passes `max_rss_kb` (None: never)."""

    max_jobs: int | None = None
    max_rss_kb: int | None = None

    @classmethod
    def of(cls, settings: Settings) -> Recycle:
        """The policy `settings` ask for."""
        rss_mb = settings.max_worker_rss_mb
        return cls(settings.max_jobs_per_worker, rss_mb * 1024 if rss_mb else None)

    def due(self, worker: Worker) -> bool:
        """True when `worker` should be replaced now."""
        if self.max_jobs and worker.jobs_run >= self.max_jobs:
            return True
        return bool(self.max_rss_kb and worker.rss_kb > self.max_rss_kb)


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
        modules: Sequence[str],
        *,
        kill_grace: float = 0.05,
        recycle: Recycle = Recycle(),
    ) -> None:
        self.loop = loop
        self.modules = list(modules)
        self.kill_grace = kill_grace
        self.recycle = recycle
        self.jobs: JobEvents = Unheard()
        self.lifecycle: WorkerEvents = Unheard()
        self.codec = SupervisorCodec()
        self.workers: dict[int, Worker] = {}
        self._attaching: set[asyncio.Future[object]] = set()
        self._slots = 0
        self._all_gone = asyncio.Event()
        self._freed = asyncio.Event()  # a worker stopped being busy
        self._mp = multiprocessing.get_context("forkserver")
        self._mp.set_forkserver_preload(["goqueue.actors.child"])

    def listen(self, *, jobs: JobEvents | None = None, workers: WorkerEvents | None = None) -> None:
        """Say who hears about attempts (the dispatcher) and about workers (the arbiter)."""
        if jobs is not None:
            self.jobs = jobs
        if workers is not None:
            self.lifecycle = workers

    def reconfigure(self, modules: Sequence[str], recycle: Recycle) -> None:
        """Apply a reload: the actor modules new workers import, and the recycling policy."""
        self.modules = list(modules)
        self.recycle = recycle

    def __iter__(self) -> Iterator[Worker]:
        return iter(list(self.workers.values()))

    def __len__(self) -> int:
        return len(self.workers)

    def count(self, *states: WorkerState) -> int:
        """How many workers are in any of `states`."""
        return sum(1 for w in self.workers.values() if w.state in states)

    def idle(self) -> list[Worker]:
        """Workers ready for a job."""
        return [w for w in self.workers.values() if w.state == WorkerState.IDLE]

    def holding(self, token: str) -> Worker | None:
        """The worker running the attempt with lease `token`."""
        for worker in self.workers.values():
            if worker.holds(token):
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
        channel = Channel(self.codec.decode)
        sock = socket.socket(fileno=os.dup(ours.fileno()))
        ours.close()
        worker = Worker(self._slots, generation, process.pid or 0, process, channel)
        channel.listen(partial(self.received, worker), partial(self.pipe_closed, worker))
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
        worker.begin(lease)
        worker.arm(self.loop, timeout, partial(self.kill, worker, KillReason.TIMEOUT))
        self._send(worker, RunJob(job.id, job.type, job.attempts, job.queue, bytes(job.payload)))

    def stop(self, worker: Worker) -> None:
        """Ask an idle worker to exit cleanly (recycling, reload, shrink)."""
        worker.ending(worker.kill_reason or KillReason.STOPPED)
        self._send(worker, Shutdown())
        worker.arm(self.loop, STOP_GRACE, partial(self._sigkill, worker))

    def kill(self, worker: Worker, reason: KillReason) -> None:
        """Two-phase kill: SIGTERM now, SIGKILL after the grace if it is still there."""
        if worker.exitcode is not None or worker.kill_reason not in (None, KillReason.STOPPED):
            return
        worker.ending(reason)
        worker.cancel_timers()
        self._signal(worker, signal.SIGTERM)
        worker.arm(self.loop, self.kill_grace, partial(self._sigkill, worker))

    def _sigkill(self, worker: Worker) -> None:
        if worker.exitcode is None:
            self._signal(worker, signal.SIGKILL)

    def _signal(self, worker: Worker, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker.pid, sig)

    def _send(self, worker: Worker, message: RunJob | Shutdown) -> None:
        worker.channel.send(self.codec.encode(message))

    async def wait_idle(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds until no worker is busy; True if none is."""
        deadline = self.loop.time() + timeout
        while self.count(WorkerState.BUSY) and (left := deadline - self.loop.time()) > 0:
            self._freed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._freed.wait(), left)
        return not self.count(WorkerState.BUSY)

    # -- reading ---------------------------------------------------------------------

    def received(self, worker: Worker, message: FromWorker) -> None:
        """A message from `worker`'s pipe."""
        match message:
            case JobDone() | JobFailed():
                self._settle(worker, message)
            case Ready():
                worker.booted(frozenset(a.name for a in message.actors))
                self.lifecycle.worker_ready(worker, message)
            case BootFailed():
                self.lifecycle.worker_boot_failed(worker, message)

    def _settle(self, worker: Worker, message: JobDone | JobFailed) -> None:
        """Free the worker, report the outcome, then replace the worker if it is due
        (the dispatcher hands out work on its next pass, so a retiring worker gets none)."""
        lease = worker.end(message.rss_kb)
        self._freed.set()
        if lease is not None:
            if isinstance(message, JobDone):
                self.jobs.job_done(lease, message)
            else:
                self.jobs.job_failed(lease, message)
        if worker.retire:
            self.stop(worker)
        elif worker.state == WorkerState.IDLE and self.recycle.due(worker):
            worker.kill_reason = KillReason.RECYCLE
            self.stop(worker)
            self.lifecycle.worker_recycled(worker)

    def pipe_closed(self, worker: Worker) -> None:
        """`worker`'s pipe reached its end; settle it if the process is gone too."""
        if worker.exitcode is not None:
            self._finalize(worker)

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
            self.loop.call_later(EOF_GRACE, self._finalize, worker)

    def _finalize(self, worker: Worker) -> None:
        if self.workers.get(worker.pid) is not worker:
            return  # already settled
        worker.channel.close()
        self.workers.pop(worker.pid, None)
        self._freed.set()
        if not self.workers:
            self._all_gone.set()
        if worker.exitcode == WORKER_BOOT_ERROR and worker.kill_reason is None:
            worker.kill_reason = KillReason.BOOT
        if worker.lease is not None:
            self.jobs.job_lost(worker.lease, worker)
        self.lifecycle.worker_exited(worker)
        worker.process.close()

    async def shutdown(self, timeout: float = 5.0) -> None:
        """Stop every child: Shutdown to the idle, SIGTERM/SIGKILL to the rest."""
        for worker in self:
            if worker.state == WorkerState.IDLE:
                self.stop(worker)
            elif worker.state != WorkerState.STOPPING:
                self.kill(worker, KillReason.SHUTDOWN)
        if self.workers:
            try:
                await asyncio.wait_for(self._all_gone.wait(), timeout)
            except TimeoutError:
                for worker in self:
                    self._signal(worker, signal.SIGKILL)
                await asyncio.wait_for(self._all_gone.wait(), 2.0)
