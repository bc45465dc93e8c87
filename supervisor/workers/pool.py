"""Worker processes: spawning, the pipes, deadlines, the two-phase kill and reaping.

Each worker is a direct child (`spawn.py`). Its pipe and its pidfd are watched by the
loop, so nothing here blocks; the pidfd firing is the death notice, and the exit code or
signal is named in the error of whatever attempt the child was running.

While attempts run, two timers of the pool's own (`watch.py`: never the arbiter's tick,
which may be waiting on a database) keep watch over busy workers.

The pool reports on two channels: what became of each attempt (`JobEvents`, the
dispatcher) and a worker's lifecycle (`WorkerEvents`, the arbiter). Replacing a worker
after a job (its own policy, `Recycle`) happens here, before either hears of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

import msgspec
from goqueue.actors.protocol import (
    WORKER_BOOT_ERROR,
    Boot,
    BootFailed,
    Dropped,
    EnqueueReply,
    EnqueueRequest,
    FromWorker,
    Go,
    JobDone,
    JobFailed,
    Progress,
    Ready,
    Refusal,
    RunJob,
    RunJobs,
    Shutdown,
    Started,
    SupervisorCodec,
    ToWorker,
    Withdraw,
)
from goqueue.supervisor.common.enums import KillReason, Status, WorkerState
from goqueue.supervisor.common.jobs import Lease
from goqueue.supervisor.workers import child_enqueues as child_jobs
from goqueue.supervisor.workers.channel import Channel
from goqueue.supervisor.workers.events import JobEvents, Listeners, WorkerEvents
from goqueue.supervisor.workers.handle import Worker, describe_exit
from goqueue.supervisor.workers.spawn import WorkerConfig, launch, reap
from goqueue.supervisor.workers.watch import Watch

if TYPE_CHECKING:
    from goqueue.supervisor.settings.config import Settings

__all__ = [
    "Handoff",
    "JobEvents",
    "Listeners",
    "Pool",
    "Recycle",
    "WorkerConfig",
    "WorkerEvents",
    "describe_exit",
]

log = logging.getLogger("goqueue.pool")

STOP_GRACE = 5.0  # seconds a worker asked to exit cleanly gets before SIGKILL
EOF_GRACE = 0.2  # seconds to wait for a dead child's pipe to drain before settling it


@dataclass(frozen=True, slots=True)
class Handoff:
    """An attempt handed to a worker behind those it holds: its lease, its deadline's
    length, whether its start is durable already (`go`: it may run when its turn comes,
    else it waits for `go`), and the latest moment (monotonic) it may start."""

    lease: Lease
    timeout: float
    go: bool
    start_by: float


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

    def left(self, worker: Worker) -> int | None:
        """How many more attempts `worker` may be handed before it is due (those it holds
        counted); None: no bound by count."""
        if not self.max_jobs:
            return None
        return max(0, self.max_jobs - worker.jobs_run - worker.held)

    def due(self, worker: Worker) -> bool:
        """True when `worker` should be replaced now."""
        if self.max_jobs and worker.jobs_run >= self.max_jobs:
            return True
        return bool(self.max_rss_kb and worker.rss_kb > self.max_rss_kb)


class Pool:
    """The set of child processes, and the mechanics of talking to and killing them.

    `lease_allowance` (seconds, None for no bound) is how long a running job may go
    without word from the supervisor before the kernel ends its worker; `memory_limit_mb`
    kills a worker whose job takes more than that (None: no limit during a job).
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        config: WorkerConfig,
        *,
        kill_grace: float = 0.05,
        recycle: Recycle = Recycle(),
        lease_allowance: float | None = None,
        memory_limit_mb: int | None = None,
        listeners: Listeners | None = None,
        on_read: Callable[[float], None] = lambda seconds: None,
    ) -> None:
        self.loop = loop
        self.config = config
        self.kill_grace = kill_grace
        self.recycle = recycle
        self.lease_allowance = lease_allowance
        self.listeners = listeners or Listeners()  # who hears what becomes of workers (`listen`)
        self.on_read = on_read  # the time each read of a pipe took (a metric)
        self.codec = SupervisorCodec()
        self.workers: dict[int, Worker] = {}
        self._tasks: set[asyncio.Future[object]] = set()
        self._slots = 0
        self._all_gone = asyncio.Event()
        self._freed = asyncio.Event()  # a worker stopped being busy
        # the pool's own timers over busy workers: Extend, memory samples
        self.watch = Watch(
            loop,
            self.workers,
            self.codec,
            lease_allowance=lease_allowance,
            memory_limit_mb=memory_limit_mb,
        )

    def listen(self, listeners: Listeners) -> None:
        """Report to `listeners` from now on: given whole, once, before the first spawn."""
        self.listeners = listeners

    def reconfigure(
        self, config: WorkerConfig, recycle: Recycle, memory_limit_mb: int | None
    ) -> None:
        """Apply a reload: what new workers boot with, recycling and the memory limit."""
        self.config = config
        self.recycle = recycle
        self.watch.limit_memory(memory_limit_mb)

    def __iter__(self) -> Iterator[Worker]:
        return iter(list(self.workers.values()))

    def __len__(self) -> int:
        return len(self.workers)

    def count(self, *states: WorkerState) -> int:
        """How many workers are in any of `states`."""
        return sum(1 for w in self.workers.values() if w.state in states)

    def idle(self) -> list[Worker]:
        """Workers ready for a job, the newest generation first (after a reload, jobs run
        the new code wherever a worker of it is free)."""
        idle = [w for w in self.workers.values() if w.state == WorkerState.IDLE]
        if (len(idle) > 1 and idle[0].generation != idle[-1].generation) or len(idle) > 2:
            idle.sort(key=_newest_first)  # only a reload mixes generations
        return idle

    def idle_for(self, job_type: str, skip: set[int]) -> Worker | None:
        """The idle worker `idle()` would list first among those that run `job_type`,
        leaving out those whose id is in `skip`; None if there is none."""
        best: Worker | None = None
        for worker in self.workers.values():
            if worker.state != WorkerState.IDLE or job_type not in worker.types:
                continue
            if skip and id(worker) in skip:
                continue
            if best is None or worker.generation > best.generation:
                best = worker
        return best

    def is_idle(self, worker: Worker) -> bool:
        """True while `worker` is one of this pool's and ready for a job."""
        return worker.state == WorkerState.IDLE and self.workers.get(worker.pid) is worker

    def holding(self, token: str) -> Worker | None:
        """The worker running the attempt with lease `token`."""
        for worker in self.workers.values():
            if worker.holds(token):
                return worker
        return None

    def progress_of(self, job_id: str) -> msgspec.Raw | None:
        """The latest progress a running attempt of `job_id` reported on this node."""
        for worker in self.workers.values():
            if worker.running(job_id):
                return worker.progress
        return None

    # -- lifecycle -------------------------------------------------------------------

    def spawn(self, generation: int, config: WorkerConfig | None = None) -> Worker:
        """Start one child; it reports Ready (or BootFailed) over its pipe. Raises
        OSError when no process can be started (descriptors or memory exhausted)."""
        config = config or self.config
        launched = launch()
        self._slots += 1
        channel = Channel(self.codec.decode, self.on_read)
        worker = Worker(self._slots, generation, launched.pid, launched.pidfd, channel)
        channel.listen(partial(self.received, worker), partial(self.pipe_closed, worker))
        self.workers[worker.pid] = worker
        self._all_gone.clear()
        channel.attach(self.loop, launched.sock)
        self.loop.add_reader(launched.pidfd, self._on_exit, worker)
        modules, paths = list(config.modules), list(config.paths)
        limits = (config.max_result_bytes, config.max_traceback_bytes)
        level = config.log_level
        boot = Boot(modules, paths, *limits, level, config.otel, config.node, config.max_rss_kb)
        self._send(worker, boot)
        log.debug("worker spawned", extra={"worker_pid": worker.pid, "slot": worker.slot})
        return worker

    def run(self, worker: Worker, lease: Lease, timeout: float) -> None:
        """Hand a started `lease` to an idle worker, which runs it at once, and arm its
        deadline. With a lease allowance, the worker drops it (`Dropped`) instead if it
        reads it only once the allowance has passed: the node was frozen (a SIGSTOP, a
        paused machine) before the worker could start it, so its lease may have lapsed
        and another node may be running the job already."""
        worker.begin(lease)
        worker.set_deadline(self.loop, self.loop.time() + timeout, self._timed_out)
        allowance = self.lease_allowance
        start_by = None if allowance is None else time.monotonic() + allowance
        self._send(worker, RunJobs([self._attempt(lease, start_by=start_by)]))
        if not self.watch.armed:
            self.watch.arm()

    def hand(self, worker: Worker, handoffs: list[Handoff]) -> None:
        """Queue attempts on `worker`, to run in this order after those it holds, each
        announced (`Started`) before it runs; its deadline is armed then."""
        jobs = []
        for handoff in handoffs:
            worker.queue(handoff.lease, handoff.timeout, handoff.start_by)
            attempt = self._attempt(
                handoff.lease, go=handoff.go, start_by=handoff.start_by, announce=True
            )
            jobs.append(attempt)
        self._send(worker, RunJobs(jobs))
        if not self.watch.armed:
            self.watch.arm()

    def go(self, worker: Worker, job_ids: list[str]) -> None:
        """The starts of these attempts queued on `worker` are durable: they may run."""
        self._send(worker, Go(job_ids))

    def withdraw(self, worker: Worker, job_ids: list[str]) -> None:
        """Take back attempts queued on `worker`; it answers with those it had not
        started (`Dropped`, heard as `job_dropped`)."""
        self._send(worker, Withdraw(job_ids))

    def _attempt(
        self,
        lease: Lease,
        *,
        go: bool = True,
        start_by: float | None = None,
        announce: bool = False,
    ) -> RunJob:
        job = lease.job
        started = job.status == Status.RUNNING  # a claimed job is charged when it starts
        return RunJob(
            job.id,
            job.type,
            job.attempts if started else job.attempts + 1,
            job.queue,
            bytes(job.payload),
            self.lease_allowance,
            job.trace_context,
            None if job.parents is None else bytes(job.parents),
            announce=announce,
            go=go,
            start_by=start_by,
        )

    def stop(self, worker: Worker) -> None:
        """Ask an idle worker to exit cleanly (recycling, reload, shrink)."""
        worker.ending(worker.kill_reason or KillReason.STOPPED)
        self._send(worker, Shutdown())
        worker.arm(self.loop, STOP_GRACE, partial(self._sigkill, worker))

    def kill(self, worker: Worker, reason: KillReason) -> None:
        """Two-phase kill: SIGTERM now, SIGKILL after the grace if it is still there."""
        if worker.gone or worker.kill_reason not in (None, KillReason.STOPPED):
            return
        worker.ending(reason)
        worker.cancel_timers()
        self._signal(worker, signal.SIGTERM)
        worker.arm(self.loop, self.kill_grace, partial(self._sigkill, worker))

    def _timed_out(self, worker: Worker) -> None:
        self.kill(worker, KillReason.TIMEOUT)

    def _sigkill(self, worker: Worker) -> None:
        self._signal(worker, signal.SIGKILL)

    def _signal(self, worker: Worker, sig: signal.Signals) -> None:
        worker.send_signal(sig)

    def _send(self, worker: Worker, message: ToWorker) -> None:
        worker.channel.send_frame(self.codec.frame(message))

    def _track(self, awaitable: Awaitable[object]) -> None:
        task = asyncio.ensure_future(awaitable)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

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
                if worker.verdict is None:
                    self._settle(worker, message)
            case Started(job_id=job_id):
                self._started(worker, job_id)
            case Dropped(job_ids=job_ids):  # queued ones, or the one handed to run at once
                for lease in worker.drop(job_ids):
                    self.listeners.jobs.job_dropped(lease, worker)
                if worker.state == WorkerState.IDLE:
                    self._freed.set()  # it held only queued attempts: a drain waits on it
                self._after_attempts(worker)
            case Progress(job_id=job_id, value=value):
                if worker.running(job_id) and worker.verdict is None:
                    worker.progress = msgspec.Raw(value)
            case EnqueueRequest() as request:
                self._track(self._answer(worker, request))
            case Ready():
                worker.booted(frozenset(a.name for a in message.actors))
                self.listeners.workers.worker_ready(worker, message)
            case BootFailed():
                self.listeners.workers.worker_boot_failed(worker, message)

    async def _answer(self, worker: Worker, request: EnqueueRequest) -> None:
        if worker.running(request.job_id):
            reply = await child_jobs.answer(self.listeners.children, request)
        else:
            reply = EnqueueReply(request.request_id)
            child_jobs.refuse(reply, Refusal.INVALID, f"job {request.job_id} is not running here")
        self._send(worker, reply)

    def _started(self, worker: Worker, job_id: str) -> None:
        """A queued attempt starts: arm its deadline and report it."""
        entry = worker.start(job_id)
        if entry is None or worker.verdict is not None:
            return
        worker.set_deadline(self.loop, self.loop.time() + entry.timeout, self._timed_out)
        self.listeners.jobs.job_started(entry.lease, worker)

    def _settle(self, worker: Worker, message: JobDone | JobFailed) -> None:
        """Free the worker, report the outcome, then replace the worker if it is due
        (the dispatcher hands out work on its next pass, so a retiring worker gets none)."""
        lease = worker.end(message.rss_kb)
        self._freed.set()
        if lease is not None:
            if isinstance(message, JobDone):
                self.listeners.jobs.job_done(lease, message, worker)
            else:
                self.listeners.jobs.job_failed(lease, message, worker)
        if not worker.retire and worker.state != WorkerState.STOPPING and self.recycle.due(worker):
            worker.kill_reason = KillReason.RECYCLE
            worker.retire = True
            self.listeners.workers.worker_recycled(worker)
        self._after_attempts(worker)

    def _after_attempts(self, worker: Worker) -> None:
        """A worker holds fewer attempts: a retiring one gives its queue back, and is
        stopped once it holds nothing."""
        if not worker.retire or worker.state == WorkerState.STOPPING:
            return
        if worker.state == WorkerState.IDLE:
            self.stop(worker)
        elif worker.queued and worker.lease is None:
            self.withdraw(worker, [entry.lease.job.id for entry in worker.queued])

    def pipe_closed(self, worker: Worker) -> None:
        """`worker`'s pipe reached its end; settle it if the process is gone too."""
        if worker.gone:
            self._finalize(worker)

    def _on_exit(self, worker: Worker) -> None:
        """The pidfd fired: collect the exit status, then settle once the pipe has been
        read to its end (whatever the child said before dying still counts)."""
        exited, exitcode = reap(worker.pid)
        if not exited:
            return  # not an exit after all; the pidfd stays watched
        self.loop.remove_reader(worker.pidfd)
        os.close(worker.pidfd)
        worker.pidfd = -1
        worker.exitcode = exitcode
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
        self.watch.forget(worker.pid)
        self._freed.set()
        if not self.workers:
            self._all_gone.set()
        if worker.exitcode == WORKER_BOOT_ERROR and worker.kill_reason is None:
            worker.kill_reason = KillReason.BOOT
        lease = worker.lease  # kept on the worker: the arbiter notes which job it ran
        if lease is not None and worker.exitcode == -signal.SIGALRM and worker.kill_reason is None:
            self._allowance_ran_out(worker, lease)
        if lease is not None and worker.verdict is not None:
            self.listeners.jobs.job_failed(lease, worker.verdict, worker)
        elif lease is not None:
            self.listeners.jobs.job_lost(lease, worker)
        queued, worker.queued = list(worker.queued), deque()
        for entry in queued:  # never started: handed back at no cost
            self.listeners.jobs.job_dropped(entry.lease, worker)
        self.listeners.workers.worker_exited(worker)

    def _allowance_ran_out(self, worker: Worker, lease: Lease) -> None:
        """The kernel ended `worker` mid-job (SIGALRM, `actors/lease_alarm.py`): no
        `Extend` reached it within its allowance, so its job's lease may be gone."""
        error = (
            f"abandoned: worker {worker.pid} was killed by SIGALRM, its lease alarm: the "
            f"supervisor sent no word for {self.lease_allowance or 0:g}s, so the attempt was "
            "stopped before its lease could run out"
        )
        duration = time.monotonic() - worker.attempt_started
        worker.condemn(KillReason.LEASE_LOST, JobFailed(lease.job.id, error, duration))
        log.warning(error, extra={"job_id": lease.job.id, "worker_pid": worker.pid})

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
        self.watch.stop()
        for task in list(self._tasks):
            task.cancel()


def _newest_first(worker: Worker) -> int:
    return -worker.generation
