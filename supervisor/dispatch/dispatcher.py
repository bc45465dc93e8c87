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
from goqueue.supervisor.dispatch.at_enqueue import AtEnqueue
from goqueue.supervisor.dispatch.attempts import HELD, Attempt, Attempts, Phase
from goqueue.supervisor.dispatch.catalog import Catalog
from goqueue.supervisor.dispatch.feeding import Feeding, types_of
from goqueue.supervisor.dispatch.hooks import Hook
from goqueue.supervisor.dispatch.outcomes import Outcomes
from goqueue.supervisor.dispatch.policy import DEFAULT_POLICY, Policy
from goqueue.supervisor.dispatch.queues import Depth, Durations
from goqueue.supervisor.dispatch.throttle import Held, Throttle
from goqueue.supervisor.dispatch.worker_queues import WorkerQueues
from goqueue.supervisor.enums import AttemptOutcome, KillReason, Status
from goqueue.supervisor.errors import StoreUnavailable
from goqueue.supervisor.jobs import Enqueued, Job, Lease, utcnow
from goqueue.supervisor.lifecycle import Lifecycle
from goqueue.supervisor.store.base import NewJob, Store, StoreTraits
from goqueue.supervisor.workers.handle import Worker, death_notice
from goqueue.supervisor.workers.pool import Handoff, Pool

log = logging.getLogger("goqueue.dispatch")

RETRY_CLAIM = 1.0  # seconds before claiming again after a failed pass


class Wakeup:
    """The dispatcher's wake-up: made before the store (which calls `wake` when work may
    be claimable) and given to both, so neither is wired to the other afterwards. It
    also notes what the last short claims saw: nothing new since means nothing to ask."""

    __slots__ = ("event", "news", "seen", "seen_short")

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.news = 1  # bumped by wake(): work may have arrived
        self.seen = 0  # `news` as of the last claim for idle workers that came back short
        self.seen_short = 0  # likewise for the last claim for the workers' queues

    def wake(self) -> None:
        """New work may be claimable (enqueued, due, a slot freed): claim on the next pass."""
        self.news += 1
        self.event.set()

    def drained(self) -> bool:
        """True while nothing may have arrived since a claim found nothing more."""
        return self.seen == self.news


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
        self._ends: dict[str, float] = {}  # by type: when starts the last claim took expire
        self._due_timer: asyncio.TimerHandle | None = None
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
        self.throttle = Throttle(store, self.wake, on_rate_wait)  # rate limits
        self.on_pass = on_pass
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
            drained=self.wakeup.drained,
            run=self._start,
            nudge=self.nudge,
            monotonic=monotonic,
        )

    def reconfigure(self, catalog: Catalog, policy: Policy) -> None:
        """Apply new actors and limits (boot, reload) and a new policy (reload)."""
        self.catalog = catalog
        self.policy = policy
        self.outcomes.policy = policy
        self.at_enqueue.reconfigure(catalog, policy)
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

    @property
    def _serving(self) -> bool:
        return not self.lifecycle.winding_down

    async def run(self) -> None:
        """The dispatch loop; cancel the task to stop it."""
        while True:
            await self.wakeup.event.wait()
            self.wakeup.event.clear()
            if not self._serving:
                continue
            started = self.monotonic()
            try:
                await self.fill()
                self._arm_due_timer()
            except Exception:  # a bug must not stop dispatching for good
                log.exception("dispatch pass failed; retrying in 1 s")
                asyncio.get_running_loop().call_later(RETRY_CLAIM, self.wake)
            self.on_pass(self.monotonic() - started)

    def _arm_due_timer(self) -> None:
        due = self.store.next_due_at()
        if self._due_timer is not None:
            self._due_timer.cancel()
            self._due_timer = None
        if due is not None:
            delay = max(0.0, (due - self.clock()).total_seconds())
            self._due_timer = asyncio.get_running_loop().call_later(delay + 0.001, self.wake)

    # -- feeding the workers ---------------------------------------------------------

    async def fill(self) -> None:
        """Hand attempts in hand out; give idle workers attempts queued on busy ones, or
        else claim the best due job for each (started by the claim); then claim the next
        due jobs for workers whose queue ran low; until the workers are fed or the store
        has nothing more for them."""
        while self._serving:
            self._hand_out()
            idle = self._idle()
            if idle:
                idle = idle[self.feeding.move_to(idle) :]
            if self.attempts.hand:
                return  # they wait for an idle worker: claim nothing behind them
            if idle:
                got = await self._claim_heads(idle)
                if got:
                    continue  # the workers fed: their queues next
            low = self.feeding.low()
            if not low or self.wakeup.seen_short == self.wakeup.news:
                return
            if not await self._claim_queues(low):
                return

    def _idle(self) -> list[Worker]:
        """Idle workers no start is being written for, that may take work."""
        return [w for w in self.pool.idle() if id(w) not in self._kept and not w.retire]

    def longest_wait(self) -> float:
        """Seconds the longest-waiting job this node claimed and has not started has
        waited since it was due (0 with none): those in hand, and those queued on
        workers (the store counts them as taken; a worker count scaled on the queue
        must not)."""
        waiting = self.attempts.in_phase(
            Phase.IN_HAND, Phase.QUEUED, Phase.GOING, Phase.GRANTED, Phase.MOVING
        )
        if not waiting:
            return 0.0
        due: datetime = min(a.lease.job.run_at for a in waiting)
        waited: float = (self.clock() - due).total_seconds()
        return max(0.0, waited)

    async def _claim_heads(self, idle: list[Worker]) -> int | None:
        """Claim the best due job for each idle worker, started by the claim (the workers
        are kept for them meanwhile: a job charged is a job that runs), and run it there;
        how many, or None when nothing could be asked (every type throttled, the store
        unavailable, drained since the last look)."""
        if self.wakeup.drained():
            return None
        want = len(idle)
        news = self.wakeup.news
        kept = {id(w) for w in idle} - self._kept
        self._kept |= kept
        try:
            asked = self.monotonic()
            leases = await self._take(want, types_of(idle), want)
        finally:
            self._kept -= kept
        if leases is None:
            return None
        # a lease the claim started runs at once on a worker kept for it (the rest, and
        # any the claim took too long to run safely, go into hand)
        fresh = self._serving and self.monotonic() - asked < self._fresh_for
        ready = [w for w in self.pool.idle() if id(w) in kept] if fresh else []
        for lease in leases:
            worker = _taker(lease, ready) if ready else None
            if worker is None:
                self._into_hand(lease, asked)
            else:
                ready.remove(worker)
                self._start(lease, worker)
        if len(leases) < want:
            self.wakeup.seen = news  # drained as of then; a wake since means look again
            self.depth.shallow()
            return None
        self.depth.deep()  # every idle worker found a job waiting: there may be more
        return len(leases)

    async def _claim_queues(self, low: dict[Worker, int]) -> int | None:
        """Claim the next due jobs for the workers whose queue ran low, claimed (not
        started: each starts on its worker), into hand, then queue those that may wait in
        a queue; the rest wait in hand for an idle worker (and so do all behind them: no
        job overtakes one ahead of it). How many, or None when nothing could be asked."""
        want = sum(low.values())
        news = self.wakeup.news
        asked = self.monotonic()
        leases = await self._take(want, types_of(list(low)), 0)
        if leases is None:
            return None
        for lease in leases:
            self._into_hand(lease, asked)
        self._hand_out()
        if len(leases) < want:
            self.wakeup.seen_short = news  # nothing more for the queues as of then
            self.depth.shallow()
        else:
            self.depth.deep()
        return len(leases)

    def _into_hand(self, lease: Lease, asked: float) -> None:
        window_end = self._ends.get(lease.job.type)
        self.attempts.add(lease, Phase.IN_HAND, asked, window_end=window_end)

    async def _take(self, want: int, types: frozenset[str], start: int) -> list[Lease] | None:
        """Claim up to `want` due jobs of `types` within the free per-type slots, the best
        `start` of them started, after taking their starts from the rate limits (the
        window each taken start must begin in is kept in `_ends`); None when nothing
        could be asked (every type throttled, the store unavailable)."""
        attempts = self.attempts
        slots = self.catalog.free_slots(
            want,
            attempts.by_type(Phase.RUNNING),
            attempts.by_type(Phase.IN_HAND),
            attempts.by_type(Phase.STARTING),
        )
        if not slots.keys() <= types:
            slots = {t: n for t, n in slots.items() if t in types}
        if not slots:
            return None
        asked = self.monotonic()
        try:
            taken: list[Held] = []
            if self.throttle.applies(self.catalog, slots):
                slots, taken = await self.throttle.admit(self.catalog, slots)
                if not slots:
                    return None  # every type is throttled: the throttle wakes us in time
            leases = await self.store.claim(want, self.policy.queues, slots, start)
            if taken:
                await self.throttle.settle(taken, leases)
        except StoreUnavailable as exc:
            log.warning("claim failed: store unavailable", extra={"err": str(exc)})
            asyncio.get_running_loop().call_later(RETRY_CLAIM, self.wake)
            return None
        self._ends = {x.job_type: x.last_start(asked) for x in taken}
        return leases

    def _hand_out(self) -> None:
        """Hand attempts in hand to idle workers (one each) and to workers with room in
        their queue (those a queue may hold), best first. A lease that may lapse before
        the next heartbeat could extend it is not run: it is handed back (fenced by its
        token, so one already taken over costs nothing). Nor is one of a rate-limited type
        whose window ended: its start would count in the next window, where other nodes
        may have used every start already."""
        if not self.attempts.hand or not self._serving:  # nothing in hand: the usual case
            return
        for worker in self._idle():
            attempt = self._next_in_hand(worker)
            if attempt is None:
                continue
            if attempt.written:
                self._start(attempt.lease, worker, attempt)
            else:
                self._begin(attempt, worker)
        if self.attempts.hand:
            short = self.durations.short_types(self.catalog)
            batches = self.feeding.plan_queues(short, self._fresh, self._handoff)
            for worker, handoffs in batches.items():
                self.worker_queues.hand(worker, handoffs)

    def _handoff(self, attempt: Attempt) -> Handoff:
        """How `attempt` is handed to a worker's queue."""
        job = attempt.lease.job
        start_by = attempt.renewed + self._fresh_for
        return Handoff(
            attempt.lease, self.timeout_of(job), not self.worker_queues.durable, start_by
        )

    def _next_in_hand(self, worker: Worker) -> Attempt | None:
        """The attempt in hand `worker` should run next, stale ones handed back on the way."""
        while True:
            attempt = self.attempts.next_for(worker.types)
            if attempt is None:
                return None
            if not self._fresh(attempt):
                self._give_back(attempt)
            elif attempt.window_end is not None and self.monotonic() >= attempt.window_end:
                self._unclaim(attempt)
            else:
                return attempt

    # -- attempts in hand --------------------------------------------------------------

    def _unclaim(self, attempt: Attempt) -> None:
        """Hand back a claimed lease whose rate window ended, and claim again once it is
        pending (taking a start from the window now open)."""
        self.attempts.move(attempt, Phase.GONE)
        done = self.outcomes.released(attempt.lease)
        done.add_done_callback(lambda _: self.wake())

    def _begin(self, attempt: Attempt, worker: Worker) -> None:
        """Start a claimed attempt in the store (durably: a job that kills its node is
        charged for it), then run it on `worker`, kept for it meanwhile."""
        self.attempts.move(attempt, Phase.STARTING, worker=worker)
        self._kept.add(id(worker))
        self.outcomes.track(self._begin_write(attempt, worker))

    async def _begin_write(self, attempt: Attempt, worker: Worker) -> None:
        held: Lease | None = None
        asked = self.monotonic()
        try:
            held = await self.store.start(attempt.lease)
            attempt.renewed = asked  # the start extends the lease
        except StoreUnavailable as exc:
            log.warning("start failed: store unavailable", extra={"err": str(exc)})
            held = attempt.lease  # still claimed: back in hand, tried again later
            asyncio.get_running_loop().call_later(RETRY_CLAIM, self.wake)
        except Exception:
            log.exception("starting a claimed job failed")
        finally:
            self._kept.discard(id(worker))
        if held is None:
            log.warning("lease lost before the job started", extra={"job_id": attempt.lease.job.id})
            self.attempts.move(attempt, Phase.GONE)
        elif not self._serving or self.monotonic() - attempt.renewed >= self._fresh_for:
            self.attempts.move(attempt, Phase.GONE)
            self.outcomes.released(held)  # it may lapse while running
        else:
            if held.job.status == Status.RUNNING:
                self.attempts.started(attempt, held)
            if attempt.written and self.pool.is_idle(worker):
                self._start(held, worker, attempt)
            else:  # the worker is gone: the next idle one takes it
                window_end = attempt.window_end
                self.attempts.move(attempt, Phase.IN_HAND, window_end=window_end, first=True)
        self.nudge()

    def _fresh(self, attempt: Attempt) -> bool:
        """True while at least a heartbeat's interval (a third of the lease) is left of
        the lease as this node last extended it."""
        return self.monotonic() - attempt.renewed < self._fresh_for

    @property
    def _fresh_for(self) -> float:
        return self.policy.lease_seconds * 2 / 3

    def _give_back(self, attempt: Attempt) -> None:
        log.warning(
            "handing back a lease claimed ahead that went stale",
            extra={"job_id": attempt.lease.job.id, "type": attempt.type},
        )
        self.attempts.move(attempt, Phase.GONE)
        self.outcomes.released(attempt.lease)

    def release_stale(self) -> int:
        """Hand back attempts in hand that waited a whole lease for a worker, and those
        queued on a worker that waited as long (the job ahead of them runs far longer
        than its type's usual, or the worker is stuck), so that other workers and nodes
        take these jobs. Returns how many in hand."""
        limit = self.monotonic() - self.policy.lease_seconds
        stale = [a for a in self.attempts.hand if a.taken <= limit or not self._fresh(a)]
        for attempt in stale:
            self._give_back(attempt)
        for worker in self.pool:  # (a queued lease's start_by is its handoff + _fresh_for)
            late = [e for e in worker.queued if e.start_by - self._fresh_for <= limit]
            if late:
                self.worker_queues.take_back(worker, late)
        return len(stale)

    def renewed(self, leases: list[Lease], at: float) -> None:
        """The store extended `leases` by a whole lease as of `at` (monotonic)."""
        self.attempts.renew(leases, at)

    # -- attempts on workers -------------------------------------------------------------

    def _start(self, lease: Lease, worker: Worker, attempt: Attempt | None = None) -> None:
        """Run a started lease on an idle worker now."""
        attempt = attempt or self.attempts.get(lease.token)
        if attempt is None:
            self.attempts.add(lease, Phase.RUNNING, self.monotonic(), worker=worker)
        else:
            self.attempts.move(attempt, Phase.RUNNING, worker=worker)
        self.outcomes.started(lease.job)
        self.pool.run(worker, lease, self.timeout_of(lease.job))

    def timeout_of(self, job: Job) -> float:
        """The deadline in seconds that applies to one attempt of `job`."""
        return job.timeout_seconds or self.catalog.timeout(job.type, self.policy.default_timeout)

    def job_started(self, lease: Lease, worker: Worker) -> None:
        """A queued attempt started on its worker (`WorkerQueues.started`)."""
        if self.worker_queues.started(lease, worker) is not None:
            self.outcomes.started(lease.job)

    def job_dropped(self, lease: Lease, worker: Worker) -> None:
        """A queued attempt will not run on `worker` (`WorkerQueues.dropped`)."""
        self.worker_queues.dropped(lease, worker)

    # -- leases held -----------------------------------------------------------------

    def held_leases(self) -> list[Lease]:
        """Every lease this node holds: attempts on workers, finished attempts whose
        outcome is not yet written (they keep their lease until it is), attempts being
        started, queued on workers, then those in hand."""
        groups: dict[Phase, list[Lease]] = {phase: [] for phase in HELD}
        for attempt in self.attempts:
            if attempt.phase in HELD:
                groups[attempt.phase].append(attempt.lease)
        return [
            *groups[Phase.RUNNING],
            *self.outcomes.recording.values(),
            *groups[Phase.STARTING],
            *groups[Phase.QUEUED],
            *groups[Phase.GOING],
            *groups[Phase.GRANTED],
            *groups[Phase.MOVING],
            *(a.lease for a in self.attempts.hand),
        ]

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
        if attempt is not None and attempt.phase in (
            Phase.QUEUED,
            Phase.GOING,
            Phase.GRANTED,
            Phase.MOVING,
        ):
            self.worker_queues.withdraw(attempt, reason)
            return True
        return self.drop(token)

    def cancel_lease(self, token: str) -> bool:
        """Stop a cancelled job's attempt (the engine's `kill`)."""
        return self.stop_lease(token, KillReason.CANCEL)

    def release_buffer(self) -> None:
        """Hand every attempt in hand back to the store, uncounted, and take back every
        attempt queued on a worker (shutdown)."""
        for attempt in list(self.attempts.hand):
            self.attempts.move(attempt, Phase.GONE)
            self.outcomes.released(attempt.lease)
        for worker in self.pool:
            if worker.queued:
                self.worker_queues.take_back(worker, list(worker.queued))

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
        reason = worker.kill_reason
        if reason in (KillReason.CANCEL, KillReason.LEASE_LOST):
            return  # the store already moved on; any write would be fenced anyway
        if reason == KillReason.SHUTDOWN:
            self.outcomes.released(lease)
            return
        # an attempt we ended on purpose (a memory kill, ...) is not counted as an outcome
        counted = {KillReason.TIMEOUT: AttemptOutcome.TIMEOUT, None: AttemptOutcome.CRASHED}
        error = death_notice(worker, self.timeout_of(lease.job))
        duration = time.monotonic() - worker.attempt_started
        self.outcomes.died(lease, error, counted.get(reason), duration)

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
        if self.catalog.limit(job_type) is not None:
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

    async def enqueue(self, new: NewJob) -> Enqueued:
        """Store `new` (`AtEnqueue.enqueue`: started at once when a worker waits for it)."""
        return await self.at_enqueue.enqueue(new)


def _taker(lease: Lease, workers: list[Worker]) -> Worker | None:
    """The first of `workers` that runs `lease`'s type, if it is started already."""
    if lease.job.status != Status.RUNNING:
        return None
    return next((w for w in workers if lease.job.type in w.types), None)
