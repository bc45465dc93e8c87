"""Dispatch: claim due jobs for idle workers within per-type slots, start a new job at
its enqueue when a worker waits for it, and hand attempts' ends to their outcomes.

The dispatcher sleeps until woken (a job enqueued, a worker freed, a delayed job due)
and never polls. It hears the pool's job events directly and keeps its own books (what
runs where); what becomes of each attempt (hooks, retry, the fenced write, held while
the store is unavailable) is its `Outcomes`' business (`outcomes.py`).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import datetime

from goqueue.actors.protocol import JobDone, JobFailed
from goqueue.supervisor.dispatch.catalog import Catalog
from goqueue.supervisor.dispatch.hooks import Hook
from goqueue.supervisor.dispatch.in_hand import Hand
from goqueue.supervisor.dispatch.outcomes import Outcomes
from goqueue.supervisor.dispatch.policy import DEFAULT_POLICY, Policy
from goqueue.supervisor.dispatch.throttle import Held, Throttle
from goqueue.supervisor.enums import AttemptOutcome, KillReason, Status
from goqueue.supervisor.errors import StoreUnavailable
from goqueue.supervisor.jobs import Enqueued, Job, Lease, utcnow
from goqueue.supervisor.store.base import NewJob, StartNow, Store, StoreTraits
from goqueue.supervisor.workers.handle import Worker, death_notice
from goqueue.supervisor.workers.pool import Pool

log = logging.getLogger("goqueue.dispatch")

RETRY_CLAIM = 1.0  # seconds before claiming again after a failed pass


class Wakeup:
    """The dispatcher's wake-up: made before the store (which calls `wake` when work may
    be claimable) and given to both, so neither is wired to the other afterwards."""

    __slots__ = ("event", "news")

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.news = 1  # bumped by wake(): work may have arrived

    def wake(self) -> None:
        """New work may be claimable (enqueued, due, a slot freed): claim on the next pass."""
        self.news += 1
        self.event.set()


class Dispatcher:
    """Feeds idle workers and turns their reports into store writes, then hook calls.

    `traits` say what the store is like (`StoreTraits`); they are read here, once."""

    def __init__(
        self,
        store: Store,
        pool: Pool,
        catalog: Catalog,
        hooks: Hook,
        *,
        traits: StoreTraits,
        wakeup: Wakeup | None = None,
        policy: Policy = DEFAULT_POLICY,
        prefetch: int = 0,
        on_rate_wait: Callable[[str], None] = lambda job_type: None,  # a metric
        clock: Callable[[], datetime] = utcnow,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.pool = pool
        self.catalog = catalog
        self.policy = policy
        # a store whose claims cost a round trip keeps a worker's worth in hand
        self.prefetch = prefetch if traits.claim_ahead else 0
        self._sees_ahead = traits.sees_ahead
        self.clock = clock
        self.monotonic = monotonic
        self._running: Counter[str] = Counter()
        self._started: dict[str, Lease] = {}  # token -> lease of each attempt on a worker
        self._hand = Hand()  # claimed, not yet on a worker (prefetch)
        self._starting: dict[str, Lease] = {}  # claimed leases whose start is being written
        self._reserved: set[int] = set()  # (ids of) idle workers waiting for such a start
        self._prefetch_paused = False  # buffered leases went stale: claim only for idle
        self._deep = False  # the last claim came back full: more jobs are due
        self.dispatching = True
        self.rng = random.Random()
        self.wakeup = wakeup or Wakeup()
        self.wake = self.wakeup.wake
        self._seen = 0  # the `wakeup.news` value as of the last claim that came back short
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

    def reconfigure(self, catalog: Catalog, policy: Policy) -> None:
        """Apply new actors and limits (boot, reload) and a new policy (reload)."""
        self.catalog = catalog
        self.policy = policy
        self.outcomes.policy = policy
        self.wake()

    def nudge(self) -> None:
        """A worker freed up: hand it a held lease, but only go to the store if the last
        claim did not already come back short (an empty queue costs no round trips, and
        with nothing in hand either, not even a pass: it would do nothing)."""
        if self._hand.leases or self._seen != self.wakeup.news:
            self.wakeup.event.set()

    async def run(self) -> None:
        """The dispatch loop; cancel the task to stop it."""
        while True:
            await self.wakeup.event.wait()
            self.wakeup.event.clear()
            if not self.dispatching:
                continue
            try:
                await self.fill()
                self._arm_due_timer()
            except Exception:  # a bug must not stop dispatching for good
                log.exception("dispatch pass failed; retrying in 1 s")
                asyncio.get_running_loop().call_later(RETRY_CLAIM, self.wake)

    def _arm_due_timer(self) -> None:
        due = self.store.next_due_at()
        if self._due_timer is not None:
            self._due_timer.cancel()
            self._due_timer = None
        if due is not None:
            delay = max(0.0, (due - self.clock()).total_seconds())
            self._due_timer = asyncio.get_running_loop().call_later(delay + 0.001, self.wake)

    async def fill(self) -> None:
        """Hand buffered leases to idle workers, then claim for the rest (plus `prefetch`
        more to keep in hand, so a freed worker never waits on a store round trip)."""
        while self.dispatching:
            self._hand_out()
            idle = self._idle()
            if not idle and self._hand.leases and self._deep:
                return  # a deep queue: claim ahead again once the leases in hand ran out
            ahead = 0 if self._prefetch_paused else self.prefetch
            want = len(idle) + ahead - len(self._hand)
            if want <= 0 or self._seen == self.wakeup.news:
                return  # (or drained, and nothing enqueued or freed since)
            slots = self.catalog.free_slots(want, self._running, self._hand.by_type)
            types = self.catalog.types if ahead else _types_of(idle)
            if not slots.keys() <= types:
                slots = {t: n for t, n in slots.items() if t in types}
            if not slots:
                return
            news = self.wakeup.news
            got = await self._claim(idle, want, slots)
            if got is None:
                return
            self._deep = got == want
            if got < want:
                self._seen = news  # drained as of then; a wake since means look again
                self._hand_out()
                return

    async def _claim(self, idle: list[Worker], want: int, slots: dict[str, int]) -> int | None:
        """Claim up to `want` leases within `slots` into the hand; how many, or None
        when nothing could be asked (every type throttled, the store unavailable)."""
        asked = self.monotonic()
        # the best go straight to the idle workers, started by the claim itself; the
        # workers are kept for them meanwhile (a job charged is a job that runs)
        start = min(len(idle), want)
        kept = {id(w) for w in idle[:start]} - self._reserved
        self._reserved |= kept
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
        finally:
            self._reserved -= kept
        ends = {x.job_type: x.last_start(asked) for x in taken}
        # a lease the claim started runs at once on a worker kept for it (the rest, and
        # any the claim took too long to run safely, go through the hand)
        fresh = self.dispatching and self.monotonic() - asked < self._fresh_for
        ready = [w for w in self.pool.idle() if id(w) in kept] if fresh else []
        for lease in leases:
            worker = _taker(lease, ready) if ready else None
            if worker is None:
                self._hand.add(lease, asked, ends.get(lease.job.type))
            else:
                ready.remove(worker)
                self._start(lease, worker)
        return len(leases)

    def _hand_out(self) -> None:
        """Start buffered leases on idle workers that know their type, best first. A
        lease that may lapse before the next heartbeat could extend it is not run: it
        is handed back (fenced by its token, so one already taken over costs nothing).
        Nor is one of a rate-limited type whose window ended: its start would count in
        the next window, where other nodes may have used every start already."""
        if not self.dispatching or not self._hand.leases:  # nothing in hand: the usual case
            return
        for worker in self._idle():
            while True:
                lease = self._hand.next_for(worker.types)
                if lease is None:
                    break
                if not self._fresh(lease):
                    self._give_back(lease)
                elif self._window_over(lease):
                    self._unclaim(lease)
                else:
                    break
            if lease is None:
                continue
            if lease.job.status == Status.CLAIMED:
                self._begin(lease, worker)
            else:
                self._hand.remove(lease)
                self._start(lease, worker)

    def _idle(self) -> list[Worker]:
        idle = self.pool.idle()
        if not self._reserved:
            return idle
        return [w for w in idle if id(w) not in self._reserved]

    def store_back(self) -> None:
        """The store answers again after being unreachable: held writes try at once."""
        self.outcomes.store_back()

    async def enqueue(self, new: NewJob) -> Enqueued:
        """Store `new`, the engine's one call for a new job. When a worker of this node
        waits for it (`_keeper`), the store starts it in the insert's own statement
        (`NewJob.start`: no claim is needed) and it runs on that worker on the next turn
        of the loop, once the enqueue's answer is written: a client hears of its job
        before the job can do anything (even kill its node)."""
        worker = self._keeper(new)
        if worker is None:
            return await self.store.enqueue(new)
        try:
            enqueued = await self.store.enqueue(new)
        except BaseException:
            self._reserved.discard(id(worker))
            self.nudge()
            raise
        if enqueued.lease is None:  # stored pending: the store woke us for it
            self._reserved.discard(id(worker))
            self.nudge()
        else:
            asyncio.get_running_loop().call_soon(self._run_started, worker, enqueued.lease)
        return enqueued

    def _keeper(self, new: NewJob) -> Worker | None:
        """An idle worker to keep for `new` while it is enqueued, when it may start at
        once (setting `new.start`), or None when it must wait its turn. Only while this
        node holds nothing in hand, for a type without a limit of its own, in a queue
        this node serves; and so that no job the worker could run waits ahead of this
        one, only when the store checks that itself (`StoreTraits.sees_ahead`, across
        nodes) or else this node's last claim found nothing more it could take."""
        if not self.dispatching or self._hand.leases:
            return None
        if self._seen != self.wakeup.news and not self._sees_ahead:
            return None
        spec, catalog, queues = new.spec, self.catalog, self.policy.queues
        if spec.run_at is not None or spec.delay_seconds or spec.type in catalog.rates:
            return None
        if catalog.limit(spec.type) is not None:
            return None
        if queues is not None and spec.queue_name not in queues:
            return None
        worker = self.pool.idle_for(spec.type, self._reserved)
        if worker is None:
            return None
        self._reserved.add(id(worker))
        new.start = StartNow(worker.types, queues)
        return worker

    def _run_started(self, worker: Worker, lease: Lease) -> None:
        """Run a job started at its enqueue on the worker kept for it (on the next idle
        one if that one is gone)."""
        self._reserved.discard(id(worker))
        if self.dispatching and self.pool.is_idle(worker):
            self._start(lease, worker)
        else:
            self._hand.add(lease, self.monotonic(), first=True)
            self.nudge()

    def _window_over(self, lease: Lease) -> bool:
        end = self._hand.window_end(lease)
        return end is not None and self.monotonic() >= end

    def _unclaim(self, lease: Lease) -> None:
        """Hand back a claimed lease whose rate window ended, and claim again once it is
        pending (taking a start from the window now open)."""
        self._hand.remove(lease)
        done = self.outcomes.released(lease)
        done.add_done_callback(lambda _: self.wake())

    def _begin(self, lease: Lease, worker: Worker) -> None:
        """Start a claimed lease's attempt in the store (durably: a job that kills its
        node is charged for it), then run it on `worker`, kept for it meanwhile."""
        renewed = self._hand.renewed_at(lease)
        window_end = self._hand.window_end(lease)
        self._hand.remove(lease)
        self._starting[lease.token] = lease
        self._reserved.add(id(worker))
        self.outcomes.track(self._begin_write(lease, worker, renewed, window_end))

    async def _begin_write(
        self, lease: Lease, worker: Worker, renewed: float, window_end: float | None
    ) -> None:
        held: Lease | None = None
        asked = self.monotonic()
        try:
            held = await self.store.start(lease)
            renewed = asked  # the start extends the lease
        except StoreUnavailable as exc:
            log.warning("start failed: store unavailable", extra={"err": str(exc)})
            held = lease  # still claimed: back in hand, tried again later
            asyncio.get_running_loop().call_later(RETRY_CLAIM, self.wake)
        except Exception:
            log.exception("starting a claimed job failed")
        finally:
            self._starting.pop(lease.token, None)
            self._reserved.discard(id(worker))
        if held is None:
            log.warning("lease lost before the job started", extra={"job_id": lease.job.id})
        elif not self.dispatching or self.monotonic() - renewed >= self._fresh_for:
            self.outcomes.released(held)  # it may lapse while running
        elif held.job.status == Status.RUNNING and self.pool.is_idle(worker):
            self._start(held, worker)
        else:  # the worker is gone: the next idle one takes it
            self._hand.add(held, renewed, window_end, first=True)
        self.nudge()

    def _fresh(self, lease: Lease) -> bool:
        """True while at least a heartbeat's interval (a third of the lease) is left of
        the lease as this node last extended it."""
        return self.monotonic() - self._hand.renewed_at(lease) < self._fresh_for

    @property
    def _fresh_for(self) -> float:
        return self.policy.lease_seconds * 2 / 3

    def _give_back(self, lease: Lease) -> None:
        log.warning(
            "handing back a lease claimed ahead that went stale",
            extra={"job_id": lease.job.id, "type": lease.job.type},
        )
        self._hand.remove(lease)
        self.outcomes.released(lease)

    def release_stale(self) -> int:
        """Hand back leases claimed ahead that waited a whole lease for a worker (the
        workers are stuck or busy with long jobs), and claim no more ahead until a worker
        frees up, so that other nodes take these jobs. Returns how many."""
        limit = self.monotonic() - self.policy.lease_seconds
        stale = [x for x in self._hand if self._hand.taken_at(x) <= limit]
        stale += [x for x in self._hand if x not in stale and not self._fresh(x)]
        for lease in stale:
            self._give_back(lease)
        if stale:
            self._prefetch_paused = True
        return len(stale)

    def renewed(self, leases: list[Lease], at: float) -> None:
        """The store extended `leases` by a whole lease as of `at` (monotonic)."""
        self._hand.renew(leases, at)

    def _start(self, lease: Lease, worker: Worker) -> None:
        job = lease.job
        self._running[job.type] += 1
        self._started[lease.token] = lease
        self.outcomes.started(job)
        self.pool.run(worker, lease, self.timeout_of(job))

    def timeout_of(self, job: Job) -> float:
        """The deadline in seconds that applies to one attempt of `job`."""
        return job.timeout_seconds or self.catalog.timeout(job.type, self.policy.default_timeout)

    # -- leases held -----------------------------------------------------------------

    def held_leases(self) -> list[Lease]:
        """Every lease this node holds: attempts on workers, finished attempts whose
        outcome is not yet written (they keep their lease until it is), then those in
        hand."""
        return [
            *self._started.values(),
            *self.outcomes.recording.values(),
            *self._starting.values(),
            *self._hand,
        ]

    def drop(self, token: str) -> bool:
        """Forget a buffered lease that is no longer ours (cancelled, taken over)."""
        lease = self._hand.find(token)
        if lease is None:
            return False
        self._hand.remove(lease)
        return True

    def stop_lease(self, token: str, reason: KillReason) -> bool:
        """End the attempt holding `token`: kill its worker, or drop it from the buffer.
        False if this node holds no such lease."""
        worker = self.pool.holding(token)
        if worker is None:
            return self.drop(token)
        self.pool.kill(worker, reason)
        return True

    def cancel_lease(self, token: str) -> bool:
        """Stop a cancelled job's attempt (the engine's `kill`)."""
        return self.stop_lease(token, KillReason.CANCEL)

    def release_buffer(self) -> None:
        """Hand every buffered lease back to the store, uncounted (shutdown)."""
        for lease in list(self._hand):
            self._hand.remove(lease)
            self.outcomes.released(lease)

    # -- outcomes (the pool's JobEvents) ---------------------------------------------

    def job_done(self, lease: Lease, message: JobDone) -> None:
        """Record a success."""
        self._finish(lease)
        self.outcomes.succeeded(lease, message.result, message.duration)

    def job_failed(self, lease: Lease, message: JobFailed) -> None:
        """Record a failed attempt; retry unless the handler said Fail or retries ran out."""
        self._finish(lease)
        self.outcomes.failed(lease, message)

    def job_lost(self, lease: Lease, worker: Worker) -> None:
        """A worker died holding `lease`: timeout, crash, cancellation or shutdown."""
        self._finish(lease)
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

    def _finish(self, lease: Lease) -> None:
        job_type = lease.job.type
        self._started.pop(lease.token, None)
        self._running[job_type] -= 1
        if self._running[job_type] <= 0:
            del self._running[job_type]
        self._prefetch_paused = False  # a worker freed up: claiming ahead pays again
        # Hand out on the next turn (once the pool has retired the worker if it must):
        # a claimed job's start then shares the group commit of this attempt's outcome.
        if self._hand.leases:  # else a lease claimed meanwhile is handed out by its claim
            asyncio.get_running_loop().call_soon(self._hand_out)
        if self.catalog.limit(job_type) is not None:
            self.wake()  # a limited slot opened: jobs of that type may now be claimable
        else:
            self.nudge()

    def retry_delay(self, attempt: int) -> float:
        """Seconds before retry number `attempt` of a job, with the policy's backoff."""
        return self.outcomes.retry_delay(attempt)

    async def flush(self, timeout: float) -> None:
        """Wait for outstanding writes (shutdown)."""
        await self.outcomes.flush(timeout)


def _taker(lease: Lease, workers: list[Worker]) -> Worker | None:
    """The first of `workers` that runs `lease`'s type, if it is started already."""
    if lease.job.status != Status.RUNNING:
        return None
    return next((w for w in workers if lease.job.type in w.types), None)


def _types_of(workers: list[Worker]) -> frozenset[str]:
    return frozenset().union(*(w.types for w in workers)) if workers else frozenset()
