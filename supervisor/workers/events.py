"""What the pool reports: what became of each attempt (`JobEvents`, heard by the
dispatcher) and a worker's lifecycle (`WorkerEvents`, heard by the arbiter), the
listener nobody named yet (`Unheard`), and who hears them (`Listeners`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Protocol

from goqueue.actors.protocol import BootFailed, JobDone, JobFailed, Ready
from goqueue.supervisor.common.jobs import Lease
from goqueue.supervisor.workers import child_enqueues as child_jobs
from goqueue.supervisor.workers.child_enqueues import EnqueueChild
from goqueue.supervisor.workers.handle import Worker

log = logging.getLogger("goqueue.pool")


class JobEvents(Protocol):
    """What became of the attempts the pool ran; implemented by the dispatcher."""

    def job_started(self, lease: Lease, worker: Worker) -> None:
        """A queued attempt started on `worker` (it said so before running it)."""

    def job_dropped(self, lease: Lease, worker: Worker) -> None:
        """An attempt queued on `worker` will not run there: withdrawn, past its
        `start_by`, or its worker gone before it started."""

    def job_done(self, lease: Lease, message: JobDone, worker: Worker) -> None:
        """An attempt on `worker` succeeded."""

    def job_failed(self, lease: Lease, message: JobFailed, worker: Worker) -> None:
        """An attempt on `worker` raised (or the supervisor failed it: memory limit,
        abandoned)."""

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

    def job_started(self, lease: Lease, worker: Worker) -> None:
        """Logged."""
        log.error("attempt start with no listener", extra={"job_id": lease.job.id})

    def job_dropped(self, lease: Lease, worker: Worker) -> None:
        """Logged."""
        log.error("attempt dropped with no listener", extra={"job_id": lease.job.id})

    def job_done(self, lease: Lease, message: JobDone, worker: Worker) -> None:
        """Logged."""
        log.error("attempt outcome with no listener", extra={"job_id": lease.job.id})

    def job_failed(self, lease: Lease, message: JobFailed, worker: Worker) -> None:
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
class Listeners:
    """Who hears the pool: the dispatcher (attempts), the arbiter (workers) and the
    engine (jobs that running jobs enqueue).

    Each of them needs the pool, so the pool cannot be given them when it is made: they
    are given to it whole when it starts (`Pool.listen`, by the arbiter, with itself as
    the workers' listener). Until then, events are logged (`Unheard`)."""

    jobs: JobEvents = field(default_factory=Unheard)
    workers: WorkerEvents = field(default_factory=Unheard)
    children: EnqueueChild = child_jobs.unwired
