"""The supervisor's handle on one worker process, and the state it moves through.

`Worker` owns its own bookkeeping (state, the lease it runs, its timers); the pool owns
the process, the pipe and the signals, and moves a worker only through these methods.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING

from goqueue.supervisor.jobs import Lease
from goqueue.supervisor.vocab import KillReason, WorkerState

if TYPE_CHECKING:
    from goqueue.supervisor.channel import Channel


@dataclass(eq=False)
class Worker:
    """One child process: its pipe, what it runs, why it is being ended."""

    slot: int
    generation: int
    pid: int  # kept here: the Process object is closed once the child is reaped
    process: BaseProcess
    channel: Channel
    state: WorkerState = WorkerState.BOOTING
    types: frozenset[str] = frozenset()
    lease: Lease | None = None
    attempt_started: float = 0.0
    jobs_run: int = 0
    rss_kb: int = 0
    kill_reason: KillReason | None = None
    retire: bool = False  # replace after the current job (reload, shrink)
    exitcode: int | None = None
    _timers: list[asyncio.TimerHandle] = field(default_factory=list)

    def booted(self, types: frozenset[str]) -> None:
        """The child imported its actors and can take jobs of `types`."""
        self.types = types
        if self.state == WorkerState.BOOTING:
            self.state = WorkerState.IDLE

    def begin(self, lease: Lease) -> None:
        """An attempt was handed to this worker."""
        self.state = WorkerState.BUSY
        self.lease = lease
        self.attempt_started = time.monotonic()

    def end(self, rss_kb: int) -> Lease | None:
        """The child reported its attempt's outcome: disarm, count it, free the worker.
        Returns the lease the attempt ran under."""
        self.cancel_timers()
        self.jobs_run += 1
        self.rss_kb = rss_kb
        if self.state == WorkerState.BUSY:
            self.state = WorkerState.IDLE
        lease, self.lease = self.lease, None
        return lease

    def ending(self, reason: KillReason) -> None:
        """The supervisor is ending this worker, for `reason`."""
        self.kill_reason = reason
        self.state = WorkerState.STOPPING

    def holds(self, token: str) -> bool:
        """True while this worker runs the attempt leased with `token`."""
        return self.lease is not None and self.lease.token == token

    def arm(
        self, loop: asyncio.AbstractEventLoop, delay: float, callback: Callable[[], None]
    ) -> None:
        """Call `callback` after `delay` seconds unless `cancel_timers` comes first
        (a deadline, or the SIGKILL that follows a SIGTERM)."""
        self._timers.append(loop.call_later(delay, callback))

    def cancel_timers(self) -> None:
        """Drop the pending deadline and kill timers."""
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()
