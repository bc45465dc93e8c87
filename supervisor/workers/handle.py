"""The supervisor's handle on one worker process, and the state it moves through.

`Worker` owns its own bookkeeping (state, the lease it runs, its timers, the attempt's
latest progress); the pool owns the process, the pipe and the signals, and moves a
worker only through these methods.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import msgspec
from goqueue.actors.protocol import JobFailed
from goqueue.supervisor.common.enums import KillReason, WorkerState
from goqueue.supervisor.common.jobs import Lease

if TYPE_CHECKING:
    from goqueue.supervisor.workers.channel import Channel


DEADLINE_SLACK = 0.001  # loop timers are kept in milliseconds: one may fire this early


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


def death_notice(worker: Worker, timeout: float) -> str:
    """The error of the attempt `worker` died running (its deadline `timeout` seconds)."""
    exit_text = describe_exit(worker.exitcode)
    if worker.kill_reason == KillReason.TIMEOUT:
        return f"timed out after {timeout:g}s; worker {worker.pid} {exit_text}"
    return f"worker {worker.pid} {exit_text} while running the job"


@dataclass(slots=True)
class Queued:
    """An attempt handed to a worker behind another one: its lease (replaced by the
    started one once its start is written), its deadline's length (armed when the worker
    says it starts), and the last moment the worker may start it (monotonic)."""

    lease: Lease
    timeout: float
    start_by: float


@dataclass(eq=False)
class Worker:
    """One child process: its pipe, the attempt it runs and those queued behind it, why
    it is being ended."""

    slot: int
    generation: int
    pid: int
    pidfd: int  # readable once the process has exited; -1 once it is reaped
    channel: Channel
    state: WorkerState = WorkerState.BOOTING
    types: frozenset[str] = frozenset()
    lease: Lease | None = None  # the attempt running
    queued: deque[Queued] = field(default_factory=deque)  # handed over, not started
    attempt_started: float = 0.0
    jobs_run: int = 0
    last_type: str | None = None  # the type of the last attempt it ended
    rss_kb: int = 0
    kill_reason: KillReason | None = None
    retire: bool = False  # replace once it holds nothing (reload, shrink, recycling)
    exitcode: int | None = None
    progress: msgspec.Raw | None = None  # the running attempt's latest report
    # what the attempt's outcome is, when the supervisor decided it before the process
    # was gone (a memory kill, a worker that gave up on a silent supervisor)
    verdict: JobFailed | None = None
    deadline: float | None = None  # (loop time) when the running attempt must have ended
    _timers: list[asyncio.TimerHandle] = field(default_factory=list)
    _deadline_timer: asyncio.TimerHandle | None = None
    _on_deadline: Callable[[Worker], None] | None = None

    def booted(self, types: frozenset[str]) -> None:
        """The child imported its actors and can take jobs of `types`."""
        self.types = types
        if self.state == WorkerState.BOOTING:
            self.state = WorkerState.IDLE

    @property
    def held(self) -> int:
        """How many attempts it holds: the one running and those queued."""
        return len(self.queued) + (self.lease is not None)

    def begin(self, lease: Lease) -> None:
        """An attempt was handed to this idle worker, and starts at once."""
        self.state = WorkerState.BUSY
        self.lease = lease
        self.progress = None
        self.attempt_started = time.monotonic()

    def queue(self, lease: Lease, timeout: float, start_by: float) -> None:
        """An attempt was handed to this worker, to run after those it holds."""
        self.state = WorkerState.BUSY
        self.queued.append(Queued(lease, timeout, start_by))

    def restarted(self, lease: Lease) -> None:
        """The queued attempt under `lease`'s token was started in the store: keep the
        started lease (its job as the store now has it)."""
        for entry in self.queued:
            if entry.lease.token == lease.token:
                entry.lease = lease
                return

    def start(self, job_id: str) -> Queued | None:
        """The worker says the queued attempt of `job_id` starts now; None if it holds no
        such attempt."""
        for entry in self.queued:
            if entry.lease.job.id == job_id:
                self.queued.remove(entry)
                self.begin(entry.lease)
                return entry
        return None

    def drop(self, job_ids: list[str]) -> list[Lease]:
        """The worker will not run these attempts, queued or handed to run at once (read
        past its `start_by`): their leases."""
        names = set(job_ids)
        dropped = [entry.lease for entry in self.queued if entry.lease.job.id in names]
        if dropped:
            self.queued = deque(e for e in self.queued if e.lease.job.id not in names)
        if self.lease is not None and self.lease.job.id in names:
            dropped.append(self.lease)
            self.lease = None
            self.cancel_timers()
        if dropped:
            self._free_if_empty()
        return dropped

    def end(self, rss_kb: int) -> Lease | None:
        """The child reported its attempt's outcome: disarm, count it, free the worker
        (unless attempts are queued). Returns the lease the attempt ran under."""
        self.deadline = None  # its timer may stay armed: the next attempt may reuse it
        self.cancel_timers(keep_deadline_timer=True)
        self.jobs_run += 1
        self.rss_kb = rss_kb
        self.progress = None
        lease, self.lease = self.lease, None
        if lease is not None:
            self.last_type = lease.job.type
        self._free_if_empty()
        return lease

    def _free_if_empty(self) -> None:
        if self.state == WorkerState.BUSY and self.lease is None and not self.queued:
            self.state = WorkerState.IDLE

    def ending(self, reason: KillReason) -> None:
        """The supervisor is ending this worker, for `reason`."""
        self.kill_reason = reason
        self.state = WorkerState.STOPPING

    def condemn(self, reason: KillReason, verdict: JobFailed) -> None:
        """End this worker for `reason`; its attempt's outcome is already `verdict`,
        reported once the process is gone."""
        self.ending(reason)
        self.verdict = verdict

    def send_signal(self, sig: signal.Signals) -> None:
        """Signal the process through its pidfd (nothing once it is reaped: the pidfd
        never names another process)."""
        if self.pidfd < 0:
            return
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(self.pidfd, sig)

    @property
    def gone(self) -> bool:
        """True once the process has exited and been reaped."""
        return self.pidfd < 0

    def holds(self, token: str) -> bool:
        """True while this worker runs the attempt leased with `token`."""
        return self.lease is not None and self.lease.token == token

    def queues(self, token: str) -> bool:
        """True while the attempt leased with `token` is queued on this worker."""
        return any(entry.lease.token == token for entry in self.queued)

    def running(self, job_id: str) -> bool:
        """True while this worker runs an attempt of `job_id`."""
        return self.lease is not None and self.lease.job.id == job_id

    def arm(
        self, loop: asyncio.AbstractEventLoop, delay: float, callback: Callable[[], None]
    ) -> None:
        """Call `callback` after `delay` seconds unless `cancel_timers` comes first (the
        SIGKILL that follows a SIGTERM, or a stopping worker's grace)."""
        self._timers.append(loop.call_later(delay, callback))

    def set_deadline(
        self, loop: asyncio.AbstractEventLoop, at: float, expired: Callable[[Worker], None]
    ) -> None:
        """Call `expired` at `at` (loop time) unless the attempt ends first. A timer left
        armed by an earlier attempt is kept when it fires no later (it then re-arms for
        this deadline): a worker running short jobs back to back arms a timer about once
        per deadline's length instead of once per job."""
        self.deadline, self._on_deadline = at, expired
        timer = self._deadline_timer
        if timer is not None:
            if timer.when() <= at:
                return
            timer.cancel()
        self._deadline_timer = loop.call_at(at, self._deadline_due, loop)

    def _deadline_due(self, loop: asyncio.AbstractEventLoop) -> None:
        self._deadline_timer = None
        at, expired = self.deadline, self._on_deadline
        if at is None or expired is None:
            return  # no attempt running: nothing to watch
        if loop.time() < at - DEADLINE_SLACK:  # armed for an earlier attempt
            self._deadline_timer = loop.call_at(at, self._deadline_due, loop)
            return
        self.deadline = None
        expired(self)

    def cancel_timers(self, *, keep_deadline_timer: bool = False) -> None:
        """Drop the pending deadline and kill timers (the deadline's timer too, unless
        `keep_deadline_timer`: with no deadline set it only re-checks, and stops)."""
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()
        self.deadline = None
        if self._deadline_timer is not None and not keep_deadline_timer:
            self._deadline_timer.cancel()
            self._deadline_timer = None
