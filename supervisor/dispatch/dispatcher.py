"""Dispatch: keep each worker fed with attempts, within per-type slots, and hand what
becomes of them to their outcomes.

Each attempt this node holds is one record in `attempts.py`, in one phase. An idle worker
gets the best due job, started by the claim itself (or by its enqueue when a worker waits
for it: `at_enqueue.py`); a busy one whose queue ran low gets a batch of short jobs claimed
together, handed over in one frame (`feeding.py` chooses, `worker_queues.py` hands them
over and hears of each start). The dispatcher sleeps until woken (a job enqueued, a
worker freed, a delayed job due) and never polls. What becomes of each attempt (hooks,
retry, the fenced write, held while the store is unavailable) is its `Outcomes`'
business (`outcomes.py`).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from datetime import datetime

from goqueue.actors.protocol import JobDone, JobFailed
from goqueue.supervisor.common.catalog import Catalog
from goqueue.supervisor.common.enums import KillReason
from goqueue.supervisor.common.hooks import Hook
from goqueue.supervisor.common.jobs import Job, Lease, utcnow
from goqueue.supervisor.common.lifecycle import Lifecycle
from goqueue.supervisor.dispatch.at_enqueue import AtEnqueue
from goqueue.supervisor.dispatch.attempts import MOVES, Attempt, Attempts, Durations, Phase
from goqueue.supervisor.dispatch.claims import RETRY_CLAIM, Claims
from goqueue.supervisor.dispatch.feeding import Feeding
from goqueue.supervisor.dispatch.in_hand import InHand
from goqueue.supervisor.dispatch.outcomes import Outcomes
from goqueue.supervisor.dispatch.policy import DEFAULT_POLICY, Depth, Policy
from goqueue.supervisor.dispatch.throttle import Throttle
from goqueue.supervisor.dispatch.wakeup import Wakeup
from goqueue.supervisor.dispatch.worker_queues import WorkerQueues
from goqueue.supervisor.store.base import Store, StoreTraits
from goqueue.supervisor.workers.handle import Worker
from goqueue.supervisor.workers.pool import Handoff, Pool

log = logging.getLogger("goqueue.dispatch")


class Dispatcher:
    """Feeds the workers and turns their reports into store writes, then hook calls.

    `traits` say what the store is like (`StoreTraits`); they are read here, once.
    `prefetch` is how many attempts a worker may hold queued behind the one it runs;
    `lifecycle` is the node's phase: nothing new is handed out once it winds down."""

    def __init__(
        self,
        store: Store,
        pool: Pool,
        catalog: Catalog,
        hooks: Hook,
        *,
        traits: StoreTraits,
        wakeup: Wakeup | None = None,
        lifecycle: Lifecycle | None = None,
        policy: Policy = DEFAULT_POLICY,
        prefetch: int = 0,
        on_rate_wait: Callable[[str], None] = lambda job_type: None,  # a metric
        on_key_wait: Callable[[str], None] = lambda job_type: None,  # a metric
        on_pass: Callable[[float], None] = lambda seconds: None,  # a pass's time (a metric)
        clock: Callable[[], datetime] = utcnow,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.pool = pool
        self.catalog = catalog
        self.policy = policy
        self.lifecycle = lifecycle or Lifecycle()
        self.clock = clock
        self.monotonic = monotonic
        self.attempts = Attempts()  # every attempt this node holds, by lease token
        self.depth = Depth(1 + prefetch)  # attempts a worker may hold, adapting to the queue
        self.durations = Durations()  # how long each type's attempts take here
        self._kept: set[int] = set()  # (ids of) idle workers kept for a start being written
        self.rng = random.Random()
        self.wakeup = wakeup or Wakeup()
        self.wake = self.wakeup.wake
        # what becomes of each attempt, and the writes not to be lost
        self.outcomes = Outcomes(
            store,
            hooks,
            policy=policy,
            clock=clock,
            sleep=sleep,
            rng=self.rng,
            at_once=traits.answers_at_once,
        )
        self.on_pass = on_pass
        self.in_hand = InHand(
            store,
            pool,
            self.attempts,
            self.outcomes,
            self._kept,
            lifecycle=self.lifecycle,
            lease_seconds=policy.lease_seconds,
            run=self._start,
            wake=self.wake,
            nudge=self.nudge,
            monotonic=monotonic,
        )
        self.claims = Claims(
            store,
            pool,
            self.attempts,
            Throttle(store, self.wake, on_rate_wait, on_key_wait),  # rate limits, key waits
            self.depth,
            self.wakeup,
            self._kept,
            self.in_hand,
            self.durations,
            durable=traits.durable,
            lifecycle=self.lifecycle,
            run=self._start,
            hand_out=self._hand_out,
            monotonic=monotonic,
        )
        self.feeding = Feeding(pool, self.attempts, self.durations, self.depth, monotonic)
        self.worker_queues = WorkerQueues(
            store,
            pool,
            self.attempts,
            self.outcomes,
            self.durations,
            durable=traits.durable,
            lifecycle=self.lifecycle,
            nudge=self.nudge,
            monotonic=monotonic,
        )
        self.at_enqueue = AtEnqueue(
            store,
            pool,
            self.attempts,
            self._kept,
            catalog,
            policy,
            lifecycle=self.lifecycle,
            sees_ahead=traits.sees_ahead,
            wakeup=self.wakeup,
            run=self._start,
            fresh_since=self.in_hand.fresh_since,
            nudge=self.nudge,
            monotonic=monotonic,
        )

    def reconfigure(self, catalog: Catalog, policy: Policy) -> None:
        """Apply new actors and limits (boot, reload) and a new policy (reload)."""
        self.catalog = catalog
        self.policy = policy
        self.outcomes.policy = policy
        self.at_enqueue.reconfigure(catalog, policy)
        self.in_hand.renew(policy.lease_seconds)
        self.wake()

    def nudge(self) -> None:
        """A worker freed up: hand it an attempt in hand, but only go to the store if the
        last claim (for idle workers, or for the queues while they are deep) did not
        already come back short (an empty queue costs no round trips, and with nothing in
        hand either, not even a pass: it would do nothing)."""
        wakeup = self.wakeup
        queues = self.depth.current > 1 and wakeup.seen_short != wakeup.news
        if self.attempts.hand or wakeup.seen != wakeup.news or queues:
            wakeup.event.set()

    async def run(self) -> None:
        """The dispatch loop; cancel the task to stop it."""
        while True:
            await self.wakeup.event.wait()
            self.wakeup.event.clear()
            if self.lifecycle.winding_down:
                continue
            started = self.monotonic()
            try:
                await self.fill()
                self.wakeup.wake_at(self.store.next_due_at(), self.clock())
            except Exception:  # a bug must not stop dispatching for good
                log.exception("dispatch pass failed; retrying in 1 s")
                asyncio.get_running_loop().call_later(RETRY_CLAIM, self.wake)
            self.on_pass(self.monotonic() - started)

    # -- feeding the workers ---------------------------------------------------------

    async def fill(self) -> None:
        """Hand attempts in hand out; give idle workers attempts queued on busy ones, or
        else claim the best due job for each (started by the claim) and, in the same
        claim while the queue is deep, the next ones for their queues; then claim the next
        due jobs for workers whose queue ran low; until the workers are fed or the store
        has nothing more for them."""
        while not self.lifecycle.winding_down:
            self._hand_out()
            idle = self._idle()
            if idle:
                idle = idle[self.feeding.move_to(idle) :]
            if self.attempts.hand:
                return  # they wait for an idle worker: claim nothing behind them
            if idle:
                beside = self.feeding.room_beside(idle)
                got = await self.claims.for_idle(idle, beside, self.catalog, self.policy)
                if got:
                    continue  # the workers fed: their queues next
            low = self.feeding.low()
            if not low or self.wakeup.seen_short == self.wakeup.news:
                return
            if not await self.claims.for_queues(low, self.catalog, self.policy):
                return

    def _idle(self) -> list[Worker]:
        """Idle workers no start is being written for, that may take work."""
        return [w for w in self.pool.idle() if id(w) not in self._kept and not w.retire]

    def longest_wait(self) -> float:
        """Seconds the longest-waiting job this node claimed and has not started has
        waited since it was due (0 with none): the store counts them as taken; a worker
        count scaled on the queue must not."""
        due = self.attempts.oldest_due()
        return 0.0 if due is None else max(0.0, (self.clock() - due).total_seconds())

    def _hand_out(self) -> None:
        """Hand attempts in hand to idle workers (one each) and to workers with room in
        their queue (those a queue may hold), best first. A lease that may lapse before
        the next heartbeat could extend it is not run: it is handed back (fenced by its
        token, so one already taken over costs nothing). Nor is one of a rate-limited type
        whose window ended: its start would count in the next window, where other nodes
        may have used every start already."""
        if not self.attempts.hand or self.lifecycle.winding_down:  # nothing in hand: the usual case
            return
        for worker in self._idle():
            attempt = self.in_hand.next_for(worker)
            if attempt is None:
                continue
            if attempt.written:
                self._start(attempt.lease, worker, attempt)
            else:
                self.in_hand.begin(attempt, worker)
        if self.attempts.hand:
            short = self.durations.short_types(self.catalog)
            batches = self.feeding.plan_queues(short, self.in_hand.fresh)
            for worker, queued in batches.items():
                self.worker_queues.hand(worker, queued, self._handoff)

    def _handoff(self, attempt: Attempt) -> Handoff:
        """How `attempt` is handed to a worker's queue."""
        job = attempt.lease.job
        start_by = attempt.renewed + self.in_hand.fresh_for
        go = attempt.written or not self.worker_queues.durable
        return Handoff(attempt.lease, self.timeout_of(job), go, start_by)

    def release_stale(self) -> int:
        """Hand back attempts in hand that waited a whole lease for a worker, and those
        queued on a worker that waited as long (the job ahead of them runs far longer
        than its type's usual, or the worker is stuck), so that other workers and nodes
        take these jobs. Returns how many in hand."""
        stale = self.in_hand.release_stale()
        self.worker_queues.release_stale(self.policy.lease_seconds, self.in_hand.fresh_for)
        return stale

    def renewed(self, leases: list[Lease], at: float) -> None:
        """The store extended `leases` by a whole lease as of `at` (monotonic)."""
        self.attempts.renew(leases, at)

    # -- attempts on workers -------------------------------------------------------------

    def _start(self, lease: Lease, worker: Worker, attempt: Attempt | None = None) -> None:
        """Run a started lease on an idle worker now (`attempt`: the one it is already,
        else a new one)."""
        if attempt is None:
            self.attempts.add(lease, Phase.RUNNING, self.monotonic(), worker=worker)
        else:
            self.attempts.move(attempt, Phase.RUNNING, worker=worker)
        self.outcomes.started(lease.job)
        self.pool.run(worker, lease, self.timeout_of(lease.job))

    def timeout_of(self, job: Job) -> float:
        """The deadline in seconds that applies to one attempt of `job`."""
        return self.catalog.deadline(job, self.policy.default_timeout)[0]

    def job_started(self, lease: Lease, worker: Worker) -> None:
        """A queued attempt started on its worker (`WorkerQueues.started`)."""
        if self.worker_queues.started(lease, worker) is not None:
            self.outcomes.started(lease.job)

    def job_dropped(self, lease: Lease, worker: Worker) -> None:
        """An attempt will not run on `worker`: a queued one, or one handed to run at
        once that the worker read too late (`WorkerQueues.dropped`)."""
        self.worker_queues.dropped(lease, worker)

    # -- leases held -----------------------------------------------------------------

    def held_leases(self) -> list[Lease]:
        """Every lease this node holds (`Attempts.held`), finished attempts whose outcome
        is not yet written among them: they keep their lease until it is."""
        return self.attempts.held(list(self.outcomes.recording.values()))

    def drop(self, token: str) -> bool:
        """Forget an attempt in hand that is no longer ours (cancelled, taken over)."""
        attempt = self.attempts.get(token)
        if attempt is None or attempt.phase is not Phase.IN_HAND:
            return False
        self.attempts.move(attempt, Phase.GONE)
        return True

    def stop_lease(self, token: str, reason: KillReason) -> bool:
        """End the attempt holding `token`: kill its worker, take it back from the worker
        it is queued on, or drop it from the hand. False if this node holds no such
        lease."""
        worker = self.pool.holding(token)
        if worker is not None:
            self.pool.kill(worker, reason)
            return True
        attempt = self.attempts.get(token)
        if attempt is not None and attempt.phase in MOVES[Phase.WITHDRAWN]:  # on a queue
            self.worker_queues.withdraw(attempt, reason)
            return True
        return self.drop(token)

    def cancel_lease(self, token: str) -> bool:
        """Stop a cancelled job's attempt (the engine's `kill`)."""
        return self.stop_lease(token, KillReason.CANCEL)

    def release_buffer(self) -> list[str]:
        """Hand every attempt in hand back to the store, uncounted, and take back every
        attempt queued on a worker (shutdown); the ids of their jobs."""
        handed = []
        for attempt in list(self.attempts.hand):
            self.attempts.move(attempt, Phase.GONE)
            self.outcomes.released(attempt.lease)
            handed.append(attempt.lease.job.id)
        for worker in self.pool:
            if worker.queued:
                handed += [entry.lease.job.id for entry in worker.queued]
                self.worker_queues.take_back(worker, list(worker.queued))
        return handed

    # -- outcomes (the pool's JobEvents) ---------------------------------------------

    def job_done(self, lease: Lease, message: JobDone, worker: Worker) -> None:
        """Record a success."""
        self._finish(lease, worker, message.duration)
        self.outcomes.succeeded(lease, message.result, message.duration)

    def job_failed(self, lease: Lease, message: JobFailed, worker: Worker) -> None:
        """Record a failed attempt; retry unless the handler said Fail or retries ran out."""
        self._finish(lease, worker, message.duration)
        self.outcomes.failed(lease, message)

    def job_lost(self, lease: Lease, worker: Worker) -> None:
        """A worker died holding `lease`: timeout, crash, cancellation or shutdown."""
        self._finish(lease, worker, None)
        self.outcomes.lost(lease, worker, self.timeout_of(lease.job))

    def _finish(self, lease: Lease, worker: Worker, duration: float | None) -> None:
        job_type = lease.job.type
        attempt = self.attempts.get(lease.token)
        if attempt is not None and attempt.phase is Phase.RUNNING:
            self.attempts.move(attempt, Phase.GONE)
        if duration is not None:
            self.durations.add(job_type, duration)
        if worker.queued:
            self.worker_queues.grant(worker)
        # Hand out on the next turn (once the pool has retired the worker if it must):
        # a claimed job's start then shares the group commit of this attempt's outcome.
        if self.attempts.hand:  # else a lease claimed meanwhile is handed out by its claim
            asyncio.get_running_loop().call_soon(self._hand_out)
        if self.catalog.limit(job_type) is not None or job_type in self.catalog.key_limits:
            self.wake()  # a limited slot opened: jobs of that type may now be claimable
        else:
            self.nudge()

    def store_back(self) -> None:
        """The store answers again after being unreachable: held writes try at once."""
        self.outcomes.store_back()

    def retry_delay(self, attempt: int) -> float:
        """Seconds before retry number `attempt` of a job, with the policy's backoff."""
        return self.outcomes.retry_delay(attempt)

    async def flush(self, timeout: float) -> None:
        """Wait for outstanding writes (shutdown)."""
        await self.outcomes.flush(timeout)
