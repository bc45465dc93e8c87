"""The attempts queued on a worker behind the one it runs: their starts, written ahead
when the store outlives the node (`grant`), their taking back, and what the worker says
of each (it started it, or dropped it).

With a store that outlives the node a queued attempt waits for its start to be written
before it runs (`Go`): a job that kills its node is charged for it. In memory a queued
attempt runs when its turn comes and is charged as it starts (`charge`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from goqueue.supervisor.common import eager
from goqueue.supervisor.common.enums import KillReason
from goqueue.supervisor.common.errors import StoreUnavailable
from goqueue.supervisor.common.jobs import Lease
from goqueue.supervisor.common.lifecycle import Lifecycle
from goqueue.supervisor.dispatch.attempts import Attempt, Attempts, Durations, Phase
from goqueue.supervisor.dispatch.outcomes import Outcomes
from goqueue.supervisor.store.base import Store
from goqueue.supervisor.workers.handle import Queued, Worker
from goqueue.supervisor.workers.pool import Handoff, Pool
from goqueue.supervisor.workers.watch import EXTEND_EVERY

log = logging.getLogger("goqueue.dispatch")

RETRY_GRANT = 1.0  # seconds before writing starts again after the store was unavailable


class WorkerQueues:
    """Hands attempts to workers' queues, lets them go, takes them back, and hears of
    their start or drop. `nudge` asks the dispatcher for a pass."""

    def __init__(
        self,
        store: Store,
        pool: Pool,
        attempts: Attempts,
        outcomes: Outcomes,
        durations: Durations,
        *,
        durable: bool,
        lifecycle: Lifecycle,
        nudge: Callable[[], None],
        monotonic: Callable[[], float],
    ) -> None:
        self.store = store
        self.pool = pool
        self.attempts = attempts
        self.outcomes = outcomes
        self.durations = durations
        self.durable = durable  # a queued attempt runs once its start is written
        self.lifecycle = lifecycle
        self.nudge = nudge
        self.monotonic = monotonic

    def hand(
        self, worker: Worker, queued: list[Attempt], handoff: Callable[[Attempt], Handoff]
    ) -> None:
        """Queue attempts in hand on `worker`, in this order, in one frame (`handoff`
        says how each is handed over)."""
        handoffs = [handoff(attempt) for attempt in queued]
        for attempt in queued:  # one started by its claim goes at once
            phase = Phase.GRANTED if attempt.written else Phase.QUEUED
            self.attempts.move(attempt, phase, worker=worker)
        self.pool.hand(worker, handoffs)
        self.grant(worker)

    def grant(self, worker: Worker) -> None:
        """With a store that outlives the node: write the starts of the attempts queued
        on `worker` that should start within `go_ahead` seconds (by the usual run time of
        those ahead of them), and let each go once written. A job that kills its node is
        then charged for it, and a node that dies charges at most that much work that
        never ran. Attempts behind a job of unknown or long run time wait for its end."""
        if not self.durable or self.lifecycle.winding_down:
            return
        durations = self.durations
        ahead = 0.0 if worker.lease is None else durations.expected(worker.lease.job.type)
        for entry in worker.queued:
            attempt = self.attempts.get(entry.lease.token)
            if attempt is None:
                return
            if not attempt.written and attempt.phase is not Phase.GOING:
                if attempt.phase is not Phase.QUEUED or ahead > durations.go_ahead:
                    return  # withdrawn, moving, or too far ahead
                self.attempts.move(attempt, Phase.GOING)
                self.outcomes.track(self._go_write(attempt, worker))
            ahead += durations.expected(attempt.type)

    async def _go_write(self, attempt: Attempt, worker: Worker) -> None:
        try:
            held = await self.store.start(attempt.lease)
        except StoreUnavailable as exc:
            log.warning("start failed: store unavailable", extra={"err": str(exc)})
            if attempt.phase is Phase.GOING:
                self.attempts.move(attempt, Phase.QUEUED)
            asyncio.get_running_loop().call_later(RETRY_GRANT, self.grant, worker)
            return
        except Exception:
            log.exception("starting a queued job failed")
            held = None
        if attempt.phase is Phase.GONE:  # dropped meanwhile: its start goes back
            if held is not None and attempt.reason is None:
                self.outcomes.released(held)
            return
        if attempt.phase is not Phase.GOING:  # withdrawn meanwhile: no longer ours
            return
        if held is None:
            log.warning("lease lost before the job started", extra={"job_id": attempt.lease.job.id})
            self.withdraw(attempt, KillReason.LEASE_LOST)
            return
        self.attempts.started(attempt, held)
        self.attempts.move(attempt, Phase.GRANTED)
        worker.restarted(held)
        self.pool.go(worker, [held.job.id])

    def withdraw(self, attempt: Attempt, reason: KillReason) -> None:
        """Take back a queued attempt that is no longer ours (`reason`)."""
        if attempt.phase is Phase.WITHDRAWN:
            return
        self.attempts.withdraw(attempt, reason)
        assert attempt.worker is not None
        self.pool.withdraw(attempt.worker, [attempt.lease.job.id])

    def take_back(self, worker: Worker, entries: list[Queued]) -> None:
        """Take back attempts queued on `worker` to give them to the store: those it
        drops come back through `dropped`. One its worker cannot start goes back at
        once, a stuck worker notwithstanding: its start not written and none on its way
        (it waits for a `Go`), or, with a lease allowance, past its `start_by` by more
        than the allowance (a worker that reached it in time and was stopped before it
        began is killed by its lease alarm as it resumes)."""
        ids = []
        now = self.monotonic()
        allowance = self.pool.lease_allowance
        for entry in entries:
            attempt = self.attempts.get(entry.lease.token)
            if attempt is None or attempt.phase in (Phase.WITHDRAWN, Phase.GOING):
                continue
            ids.append(attempt.lease.job.id)
            unstarted = self.durable and not attempt.written
            lapsed = allowance is not None and now > entry.start_by + allowance + EXTEND_EVERY
            if unstarted or lapsed:
                self.attempts.withdraw(attempt, KillReason.LEASE_LOST)  # never to run
                self.outcomes.released(attempt.lease)
        if ids:
            self.pool.withdraw(worker, ids)

    def release_stale(self, lease_seconds: float, fresh_for: float) -> None:
        """Take back the attempts queued a whole lease ago (`start_by` is the handoff plus
        `fresh_for`): the job ahead of them runs far longer than its type's usual, or the
        worker is stuck."""
        limit = self.monotonic() - lease_seconds
        for worker in self.pool:
            late = [e for e in worker.queued if e.start_by - fresh_for <= limit]
            if late:
                self.take_back(worker, late)

    def started(self, lease: Lease, worker: Worker) -> Attempt | None:
        """A queued attempt started on `worker`: charge it (unless its start was written
        before it ran), and let the next ones on that worker go. Returns it, None when it
        is no longer ours (its worker is being killed)."""
        attempt = self.attempts.get(lease.token)
        if attempt is None:
            log.error("a worker started an attempt not held here", extra={"job_id": lease.job.id})
            return None
        written = attempt.written
        self.attempts.move(attempt, Phase.RUNNING, worker=worker)
        if attempt.reason is not None:  # cancelled or lost while its frame was on its way
            self.pool.kill(worker, attempt.reason)
            return None
        if not written:
            self._charge(attempt, worker)
        self.grant(worker)
        return attempt

    def _charge(self, attempt: Attempt, worker: Worker) -> None:
        """Start a queued attempt in a store whose starts need not be durable first (in
        memory: at once, in this step)."""
        started = eager.step(self.store.start(attempt.lease))
        if isinstance(started, eager.Done):
            self._charged(attempt, worker, started.value)
        else:
            self.outcomes.track(self._charge_later(attempt, worker, started))

    async def _charge_later(
        self, attempt: Attempt, worker: Worker, write: eager.Waiting[Lease | None]
    ) -> None:
        try:
            held = await write
        except StoreUnavailable as exc:
            log.warning("start failed: store unavailable", extra={"err": str(exc)})
            held = attempt.lease
        self._charged(attempt, worker, held)

    def _charged(self, attempt: Attempt, worker: Worker, held: Lease | None) -> None:
        if held is None:  # cancelled meanwhile: its job must not run on
            log.warning("lease lost before the job started", extra={"job_id": attempt.lease.job.id})
            if worker.holds(attempt.token):
                self.pool.kill(worker, KillReason.LEASE_LOST)
            return
        if worker.holds(attempt.token) and attempt.phase is Phase.RUNNING:
            worker.lease = held
            self.attempts.started(attempt, held)

    def dropped(self, lease: Lease, worker: Worker) -> None:
        """An attempt will not run on `worker` (queued, or handed to run at once and read
        past its `start_by`): in hand again for an idle worker when it was taken back
        for one, else back to the store at no cost (unless it is no longer ours, or its
        start being written hands it back when done)."""
        attempt = self.attempts.get(lease.token)
        if attempt is None:
            log.error("a worker dropped an attempt not held here", extra={"job_id": lease.job.id})
            return
        came = attempt.phase
        if came is Phase.MOVING and not self.lifecycle.winding_down:
            self.attempts.move(attempt, Phase.IN_HAND, first=True)
        else:
            self.attempts.move(attempt, Phase.GONE)
            if came not in (Phase.WITHDRAWN, Phase.GOING):
                self.outcomes.released(attempt.lease)
        self.nudge()
