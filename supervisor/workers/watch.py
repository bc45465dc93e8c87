"""The pool's own watch over busy workers, two timers that never wait on the arbiter's
tick (which may be waiting on a database): every `EXTEND_EVERY` the workers holding
attempts are told the supervisor is alive (`Extend`, when leases bound how long a job may
go unwatched), and with a memory limit the busy ones' resident memory is sampled every
`SAMPLE_EVERY`; a worker past the limit is killed at once, its attempt failed with why.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time

from goqueue.actors.protocol import Extend, JobFailed, SupervisorCodec
from goqueue.supervisor.common.enums import KillReason
from goqueue.supervisor.workers.handle import Worker
from goqueue.supervisor.workers.spawn import open_statm, rss_kb

log = logging.getLogger("goqueue.pool")

EXTEND_EVERY = 0.5  # seconds between two `Extend` to each busy worker
SAMPLE_EVERY = 0.05  # seconds between two memory samples of each busy worker


class Watch:
    """Extends and memory samples over the pool's `workers` (by pid, the pool's own
    table); `memory_limit_mb` is replaced on a reload."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        workers: dict[int, Worker],
        codec: SupervisorCodec,
        *,
        lease_allowance: float | None,
        memory_limit_mb: int | None,
    ) -> None:
        self.loop = loop
        self.workers = workers
        self.codec = codec
        self.lease_allowance = lease_allowance
        self.memory_limit_mb = memory_limit_mb
        self._statm: dict[int, int] = {}  # pid -> /proc/PID/statm descriptor
        self._extend_timer: asyncio.TimerHandle | None = None
        self._sample_timer: asyncio.TimerHandle | None = None
        self.armed = False  # every timer needed runs: `arm` has nothing to do

    def arm(self) -> None:
        """Arm the timers that watch busy workers, if they are not running."""
        if self.lease_allowance is not None and self._extend_timer is None:
            self._extend_timer = self.loop.call_later(self._extend_every(), self._extend)
        if self.memory_limit_mb is not None and self._sample_timer is None:
            self._sample_timer = self.loop.call_later(SAMPLE_EVERY, self._sample)
        self.armed = True

    def limit_memory(self, memory_limit_mb: int | None) -> None:
        """A reload's memory limit (None: none)."""
        self.memory_limit_mb = memory_limit_mb
        self.armed = False

    def forget(self, pid: int) -> None:
        """A worker was reaped: close what sampling it kept open."""
        statm = self._statm.pop(pid, None)
        if statm is not None:
            os.close(statm)

    def stop(self) -> None:
        """Cancel both timers (the pool shuts down)."""
        for timer in (self._extend_timer, self._sample_timer):
            if timer is not None:
                timer.cancel()
        self._extend_timer = self._sample_timer = None
        self.armed = False

    def _busy(self) -> list[Worker]:
        """Workers running an attempt whose outcome is still open."""
        return [
            w
            for w in self.workers.values()
            if w.lease is not None and w.verdict is None and not w.gone
        ]

    def _holding(self) -> list[Worker]:
        """Workers holding attempts (running or queued) whose outcomes are still open."""
        return [
            w
            for w in self.workers.values()
            if (w.lease is not None or w.queued) and w.verdict is None and not w.gone
        ]

    def _extend(self) -> None:
        """Tell every worker holding attempts the supervisor is alive: they may go on."""
        self._extend_timer = None
        busy = self._holding()
        if self.lease_allowance is None or not busy:
            self.armed = False
            return
        frame = self.codec.frame(Extend(self.lease_allowance))
        for worker in busy:
            worker.channel.send_frame(frame)
        self._extend_timer = self.loop.call_later(self._extend_every(), self._extend)

    def _extend_every(self) -> float:
        """Seconds between two `Extend`: a few of them fit in any allowance (short leases
        give short allowances)."""
        allowance = self.lease_allowance or EXTEND_EVERY
        return min(EXTEND_EVERY, allowance / 4)

    def _sample(self) -> None:
        """Kill the busy workers whose resident memory passed the limit."""
        self._sample_timer = None
        limit = self.memory_limit_mb
        busy = self._busy()
        if limit is None or not busy:
            self.armed = False
            return
        for worker in busy:
            fd = self._statm.get(worker.pid)
            if fd is None:
                try:
                    fd = self._statm[worker.pid] = open_statm(worker.pid)
                except OSError:  # out of descriptors: sample it next time
                    continue
            rss = rss_kb(fd)
            if rss > limit * 1024:
                self._kill_for_memory(worker, rss, limit)
        self._sample_timer = self.loop.call_later(SAMPLE_EVERY, self._sample)

    def _kill_for_memory(self, worker: Worker, rss: int, limit: int) -> None:
        """SIGKILL at once (memory grows fast); the attempt fails with the reason."""
        lease = worker.lease
        assert lease is not None
        error = (
            f"exceeded the memory limit ({limit} MB): worker {worker.pid} reached "
            f"{rss // 1024} MB and was killed"
        )
        duration = time.monotonic() - worker.attempt_started
        worker.cancel_timers()
        worker.condemn(KillReason.MEMORY, JobFailed(lease.job.id, error, duration, rss_kb=rss))
        worker.send_signal(signal.SIGKILL)
        log.warning(error, extra={"job_id": lease.job.id, "worker_pid": worker.pid})
