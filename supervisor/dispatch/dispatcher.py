"""Dispatch: keep each worker fed with attempts, within per-type slots, and hand what
becomes of them to their outcomes.

A worker holds a small queue of its own (`queues.py` says how deep and what may wait in
it): the attempt it runs, and up to `Depth` more that it starts back to back without
waiting for the supervisor. An idle worker gets the best due job, started by the claim
itself (or by its enqueue, when a worker waits for it); a busy one whose queue ran low
gets a batch of short jobs claimed together, handed over in one frame, announced by the
worker as each starts (its deadline is armed then). A queued attempt waits for its
start to be durable before it runs (`Go`) when the store outlives the node: a job that
kills its node is charged for it. The dispatcher sleeps until woken (a job enqueued, a
worker freed, a delayed job due) and never polls. What becomes of each attempt (hooks,
retry, the fenced write, held while the store is unavailable) is its `Outcomes`'
business (`outcomes.py`).
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
from goqueue.supervisor.common import eager
from goqueue.supervisor.common.catalog import Catalog
from goqueue.supervisor.common.enums import AttemptOutcome, KillReason, Status, WorkerState
from goqueue.supervisor.common.errors import StoreUnavailable
from goqueue.supervisor.common.hooks import Hook
from goqueue.supervisor.common.jobs import Enqueued, Job, Lease, utcnow
from goqueue.supervisor.dispatch.in_hand import Hand
from goqueue.supervisor.dispatch.outcomes import Outcomes
from goqueue.supervisor.dispatch.policy import DEFAULT_POLICY, Policy
from goqueue.supervisor.dispatch.queues import Depth, Durations
from goqueue.supervisor.dispatch.throttle import Held, Throttle
from goqueue.supervisor.store.base import NewJob, StartNow, Store, StoreTraits
from goqueue.supervisor.workers.handle import Queued, Worker, death_notice
from goqueue.supervisor.workers.pool import EXTEND_EVERY, Handoff, Pool

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
    """Feeds the workers and turns their reports into store writes, then hook calls.

    `traits` say what the store is like (`StoreTraits`); they are read here, once.
    `prefetch` is how many attempts a worker may hold queued behind the one it runs."""

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
        on_pass: Callable[[float], None] = lambda seconds: None,  # a pass's time (a metric)
        clock: Callable[[], datetime] = utcnow,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.pool = pool
        self.catalog = catalog
        self.policy = policy
        self.durable = traits.durable  # a queued attempt runs once its start is written
        self._sees_ahead = traits.sees_ahead
        self.clock = clock
        self.monotonic = monotonic
        self.depth = Depth(1 + prefetch)  # attempts a worker may hold, adapting to the queue
        self.durations = Durations()  # how long each type's attempts take here
        self._running: Counter[str] = Counter()
        self._started: dict[str, Lease] = {}  # token -> lease of each attempt on a worker
        self._queued: dict[str, Lease] = {}  # token -> lease queued on a worker, not started
        self._renewed: dict[str, float] = {}  # token -> when a queued lease was last extended
        self._going: set[str] = set()  # queued leases whose start is being written
        self._granted: set[str] = set()  # queued leases whose start is written
        self._withdrawn: dict[str, KillReason] = {}  # taken back: no longer ours, and why
        self._moving: set[str] = set()  # taken back to hand to an idle worker instead
        self._hand = Hand()  # claimed, on no worker yet
        self._starting: dict[str, Lease] = {}  # claimed leases whose start is being written
        self._reserved: set[int] = set()  # (ids of) idle workers waiting for such a start
        self.dispatching = True
        self.rng = random.Random()
        self.wakeup = wakeup or Wakeup()
        self.wake = self.wakeup.wake
        self._seen = 0  # the `wakeup.news` value as of the last claim that came back short
        self._seen_short = 0  # likewise for the last claim for the workers' queues
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

    def reconfigure(self, catalog: Catalog, policy: Policy) -> None:
        """Apply new actors and limits (boot, reload) and a new policy (reload)."""
        self.catalog = catalog
        self.policy = policy
        self.outcomes.policy = policy
        self.wake()

    def nudge(self) -> None:
        """A worker freed up: hand it a held lease, but only go to the store if the last
        claim (for idle workers, or for the queues while they are deep) did not already
        come back short (an empty queue costs no round trips, and with nothing in hand
        either, not even a pass: it would do nothing)."""
        news = self.wakeup.news
        queues = self.depth.current > 1 and self._seen_short != news
        if self._hand.leases or self._seen != news or queues:
            self.wakeup.event.set()

    async def run(self) -> None:
        """The dispatch loop; cancel the task to stop it."""
        while True:
            await self.wakeup.event.wait()
            self.wakeup.event.clear()
            if not self.dispatching:
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
        """Hand leases in hand out; give idle workers attempts queued on busy ones, or
        else claim the best due job for each (started by the claim); then claim the next
        due jobs for workers whose queue ran low; until the workers are fed or the store
        has nothing more for them."""
        while self.dispatching:
            self._hand_out()
            idle = self._idle()
            if idle:
                idle = idle[self._move_to(idle) :]
            if self._hand.leases:
                return  # they wait for an idle worker: claim nothing behind them
            if idle:
                got = await self._claim_heads(idle)
                if got:
                    continue  # the workers fed: their queues next
            low = self._low()
            if not low or self._seen_short == self.wakeup.news:
                return
            if not await self._claim_queues(low):
                return

    def _idle(self) -> list[Worker]:
        """Idle workers no start is being written for, that may take work."""
        return [w for w in self.pool.idle() if id(w) not in self._reserved and not w.retire]

    def _low(self) -> dict[Worker, int]:
        """Busy workers whose queue ran low, and how many attempts each may take: not one
        running a job that usually takes long here, or of a type not seen run yet."""
        if self.depth.limit <= 1:
            return {}
        rooms = {}
        recycle = self.pool.recycle
        short = self.durations.short
        for worker in self.pool:
            if worker.state == WorkerState.BUSY and not worker.retire:
                running = worker.lease
                if running is not None and self.durations.expected(running.job.type) >= short:
                    continue  # behind a long job (or one of unknown length) nothing waits
                room = self.depth.room(worker.held)
                left = recycle.left(worker)
                if left is not None:
                    room = min(room, left)  # a worker due for recycling takes no more
                if room and worker.verdict is None:
                    rooms[worker] = room
        return rooms

    def longest_wait(self) -> float:
        """Seconds the longest-waiting job this node claimed and has not started has
        waited since it was due (0 with none): those in hand, and those queued on
        workers (the store counts them as taken; a worker count scaled on the queue
        must not)."""
        waiting = [*self._hand, *self._queued.values()]
        if not waiting:
            return 0.0
        due: datetime = min(lease.job.run_at for lease in waiting)
        waited: float = (self.clock() - due).total_seconds()
        return max(0.0, waited)

    async def _claim_heads(self, idle: list[Worker]) -> int | None:
        """Claim the best due job for each idle worker, started by the claim (the workers
        are kept for them meanwhile: a job charged is a job that runs), and run it there;
        how many, or None when nothing could be asked (every type throttled, the store
        unavailable, drained since the last look)."""
        if self._seen == self.wakeup.news:
            return None
        want = len(idle)
        news = self.wakeup.news
        kept = {id(w) for w in idle} - self._reserved
        self._reserved |= kept
        try:
            asked = self.monotonic()
            leases = await self._take(want, _types_of(idle), want)
        finally:
            self._reserved -= kept
        if leases is None:
            return None
        # a lease the claim started runs at once on a worker kept for it (the rest, and
        # any the claim took too long to run safely, go through the hand)
        fresh = self.dispatching and self.monotonic() - asked < self._fresh_for
        ready = [w for w in self.pool.idle() if id(w) in kept] if fresh else []
        for lease in leases:
            worker = _taker(lease, ready) if ready else None
            if worker is None:
                self._hand.add(lease, asked, self._ends.get(lease.job.type))
            else:
                ready.remove(worker)
                self._start(lease, worker)
        if len(leases) < want:
            self._seen = news  # drained as of then; a wake since means look again
            self.depth.shallow()
            return None
        self.depth.deep()  # every idle worker found a job waiting: there may be more
        return len(leases)

    async def _claim_queues(self, low: dict[Worker, int]) -> int | None:
        """Claim the next due jobs for the workers whose queue ran low, claimed (not
        started: each starts on its worker), and queue those that may wait in a queue;
        the rest wait in hand for an idle worker (and so do all behind them: no job
        overtakes one ahead of it). How many, or None when nothing could be asked."""
        want = sum(low.values())
        news = self.wakeup.news
        asked = self.monotonic()
        leases = await self._take(want, _types_of(list(low)), 0)
        if leases is None:
            return None
        for lease in leases:
            self._hand.add(lease, asked, self._ends.get(lease.job.type))
        self._hand_out()
        if len(leases) < want:
            self._seen_short = news  # nothing more for the queues as of then
            self.depth.shallow()
        else:
            self.depth.deep()
        return len(leases)

    async def _take(self, want: int, types: frozenset[str], start: int) -> list[Lease] | None:
        """Claim up to `want` due jobs of `types` within the free per-type slots, the best
        `start` of them started, after taking their starts from the rate limits (the
        window each taken start must begin in is kept in `_ends`); None when nothing
        could be asked (every type throttled, the store unavailable)."""
        starting = Counter(lease.job.type for lease in self._starting.values())
        slots = self.catalog.free_slots(want, self._running, self._hand.by_type, starting)
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
        """Hand leases in hand to idle workers (one each) and to workers with room in
        their queue (those a queue may hold), best first. A lease that may lapse before
        the next heartbeat could extend it is not run: it is handed back (fenced by its
        token, so one already taken over costs nothing). Nor is one of a rate-limited type
        whose window ended: its start would count in the next window, where other nodes
        may have used every start already."""
        if not self.dispatching or not self._hand.leases:  # nothing in hand: the usual case
            return
        for worker in self._idle():
            lease = self._next_in_hand(worker)
            if lease is None:
                continue
            if lease.job.status == Status.CLAIMED:
                self._begin(lease, worker)
            else:
                self._hand.remove(lease)
                self._start(lease, worker)
        if self._hand.leases:
            self._queue_from_hand()

    def _next_in_hand(self, worker: Worker) -> Lease | None:
        """The lease in hand `worker` should run next, stale ones handed back on the way."""
        while True:
            lease = self._hand.next_for(worker.types)
            if lease is None:
                return None
            if not self._fresh(lease):
                self._give_back(lease)
            elif self._window_over(lease):
                self._unclaim(lease)
            else:
                return lease

    def _queue_from_hand(self) -> None:
        """Queue the claimed leases in hand, in their order, on busy workers with room
        (each to the one holding fewest), one frame per worker; stop at the first that
        may not wait in a queue (a long or limited type: it waits for an idle worker, and
        the rest with it), and never queue one behind another worker's queued attempt
        of a higher priority (it would overtake it)."""
        short = self.durations.short_types(self.catalog)
        rooms = self._low()
        if not rooms:
            return
        batches: dict[Worker, list[Handoff]] = {}
        for lease in list(self._hand):
            job = lease.job
            if job.status != Status.CLAIMED or job.type not in short:
                break
            if self._hand.window_end(lease) is not None or not self._fresh(lease):
                break
            takers = [w for w in rooms if job.type in w.types]
            if not takers:
                break
            worker = min(takers, key=lambda w: w.held + len(batches.get(w, ())))
            if self._overtakes(job, worker, batches):
                break
            renewed = self._hand.renewed_at(lease)
            self._hand.remove(lease)
            self._queued[lease.token] = lease
            self._renewed[lease.token] = renewed
            start_by = renewed + self._fresh_for
            handoff = Handoff(lease, self.timeout_of(job), not self.durable, start_by)
            batches.setdefault(worker, []).append(handoff)
            rooms[worker] -= 1
            if not rooms[worker]:
                del rooms[worker]
                if not rooms:
                    break
        for worker, handoffs in batches.items():
            self.pool.hand(worker, handoffs)
            self._grant(worker)

    def _overtakes(self, job: Job, worker: Worker, batches: dict[Worker, list[Handoff]]) -> bool:
        """True if `job`, queued last on `worker`, would be there in an earlier place than
        an attempt of a higher priority queued on another worker (it would likely start
        first)."""
        place = worker.held + len(batches.get(worker, ()))
        for other in self.pool:
            if other is worker:
                continue
            ahead = [e.lease.job for e in other.queued]
            ahead += [h.lease.job for h in batches.get(other, ())]
            start = other.lease is not None
            for i, queued in enumerate(ahead):
                if queued.priority > job.priority and start + i > place:
                    return True
        return False

    def _move_to(self, idle: list[Worker]) -> int:
        """Idle workers while others hold attempts queued: take some of those back (they
        are handed to the idle ones once their worker says it has not started them), so
        that no worker waits while work waits behind another's job, and an idle worker
        never starts a job of a lower priority than one queued elsewhere. How many of
        `idle` (the first ones) will be served so, counting moves already under way."""
        served = len(self._moving)
        if served >= len(idle) or not self._queued:
            return min(served, len(idle))
        now = self.monotonic()
        wanted = len(idle) - served
        types = _types_of(idle)
        for worker in self.pool:
            movable = [
                e
                for e in worker.queued
                if e.lease.token not in self._withdrawn
                and e.lease.token not in self._moving
                and e.lease.token not in self._going
                and e.lease.job.type in types
            ]
            running = worker.lease
            expected = self.durations.expected(running.job.type) if running else 0.0
            overdue = running is not None and (
                expected >= self.durations.short or now - worker.attempt_started > 2 * expected
            )
            if not movable or (len(movable) < 2 and not overdue):
                continue
            take = movable if overdue else movable[len(movable) // 2 :]
            take = take[:wanted]
            self._moving.update(e.lease.token for e in take)
            self.pool.withdraw(worker, [e.lease.job.id for e in take])
            wanted -= len(take)
            if not wanted:
                break
        return min(len(self._moving), len(idle))

    # -- start at enqueue --------------------------------------------------------------

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
        if worker is None or worker.retire:
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

    # -- leases in hand ----------------------------------------------------------------

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
        """Hand back leases in hand that waited a whole lease for a worker, and the
        attempts queued on a worker that waited as long (the job ahead of them runs far
        longer than its type's usual, or the worker is stuck), so that other workers and
        nodes take these jobs. Returns how many."""
        limit = self.monotonic() - self.policy.lease_seconds
        stale = [x for x in self._hand if self._hand.taken_at(x) <= limit]
        stale += [x for x in self._hand if x not in stale and not self._fresh(x)]
        for lease in stale:
            self._give_back(lease)
        for worker in self.pool:  # (a queued lease's start_by is its handoff + _fresh_for)
            late = [e for e in worker.queued if e.start_by - self._fresh_for <= limit]
            if late:
                self._take_back(worker, late)
        return len(stale)

    def _take_back(self, worker: Worker, entries: list[Queued]) -> None:
        """Take back attempts queued on `worker` to give them to the store: those it
        drops come back through `job_dropped`. One its worker cannot start goes back at
        once, a stuck worker notwithstanding: its start not written and none on its way
        (it waits for a `Go`), or, with a lease allowance, past its `start_by` by more
        than the allowance (a worker that reached it in time and was stopped before it
        began is killed by its lease alarm as it resumes)."""
        ids = []
        now = self.monotonic()
        allowance = self.pool.lease_allowance
        for entry in entries:
            lease = entry.lease
            token = lease.token
            if token in self._withdrawn or token not in self._queued or token in self._going:
                continue
            ids.append(lease.job.id)
            unstarted = self.durable and token not in self._granted
            lapsed = allowance is not None and now > entry.start_by + allowance + EXTEND_EVERY
            if unstarted or lapsed:
                self._withdrawn[token] = KillReason.LEASE_LOST  # ours no more: never to run
                self._queued.pop(token, None)
                self._renewed.pop(token, None)
                self._granted.discard(token)
                self.outcomes.released(lease)
        if ids:
            self.pool.withdraw(worker, ids)

    def renewed(self, leases: list[Lease], at: float) -> None:
        """The store extended `leases` by a whole lease as of `at` (monotonic)."""
        self._hand.renew(leases, at)
        for lease in leases:
            if lease.token in self._renewed:
                self._renewed[lease.token] = max(at, self._renewed[lease.token])

    # -- attempts on workers -------------------------------------------------------------

    def _start(self, lease: Lease, worker: Worker) -> None:
        """Run a started lease on an idle worker now."""
        job = lease.job
        self._running[job.type] += 1
        self._started[lease.token] = lease
        self.outcomes.started(job)
        self.pool.run(worker, lease, self.timeout_of(job))

    def timeout_of(self, job: Job) -> float:
        """The deadline in seconds that applies to one attempt of `job`."""
        return self.catalog.deadline(job, self.policy.default_timeout)[0]

    def job_started(self, lease: Lease, worker: Worker) -> None:
        """A queued attempt started on its worker: charge it (unless its start was
        written before it ran), and let the next ones on that worker go."""
        token = lease.token
        self._queued.pop(token, None)
        self._renewed.pop(token, None)
        self._moving.discard(token)
        granted = token in self._granted
        self._granted.discard(token)
        self._running[lease.job.type] += 1
        self._started[token] = lease
        reason = self._withdrawn.pop(token, None)
        if reason is not None:  # cancelled or lost while its frame was on its way
            self.pool.kill(worker, reason)
            return
        if not granted:
            self._charge(lease, worker)
        self.outcomes.started(lease.job)
        self._grant(worker)

    def _charge(self, lease: Lease, worker: Worker) -> None:
        """Start a queued attempt in a store whose starts need not be durable first (in
        memory: at once, in this step)."""
        started = eager.step(self.store.start(lease))
        if isinstance(started, eager.Done):
            self._charged(lease, worker, started.value)
        else:
            self.outcomes.track(self._charge_later(lease, worker, started))

    async def _charge_later(
        self, lease: Lease, worker: Worker, write: eager.Waiting[Lease | None]
    ) -> None:
        try:
            held = await write
        except StoreUnavailable as exc:
            log.warning("start failed: store unavailable", extra={"err": str(exc)})
            held = lease
        self._charged(lease, worker, held)

    def _charged(self, lease: Lease, worker: Worker, held: Lease | None) -> None:
        if held is None:  # cancelled meanwhile: its job must not run on
            log.warning("lease lost before the job started", extra={"job_id": lease.job.id})
            if worker.holds(lease.token):
                self.pool.kill(worker, KillReason.LEASE_LOST)
            return
        if worker.holds(lease.token):
            worker.lease = held
            self._started[lease.token] = held

    def job_dropped(self, lease: Lease, worker: Worker) -> None:
        """A queued attempt will not run on `worker`: hand it to an idle worker when it
        was taken back for one, else back to the store at no cost (unless it is no
        longer ours)."""
        token = lease.token
        self._queued.pop(token, None)
        renewed = self._renewed.pop(token, self.monotonic())
        going = token in self._going
        self._going.discard(token)  # its start, being written, is handed back when done
        self._granted.discard(token)
        moving = token in self._moving
        self._moving.discard(token)
        if self._withdrawn.pop(token, None) is not None or going:
            pass  # cancelled or lost (the store has moved on), or handed back by the write
        elif moving and self.dispatching:
            self._hand.add(lease, renewed, first=True)
        else:
            self.outcomes.released(lease)
        self.nudge()

    def _grant(self, worker: Worker) -> None:
        """With a store that outlives the node: write the starts of the attempts queued
        on `worker` that should start within `go_ahead` seconds (by the usual run time of
        those ahead of them), and let each go once written. A job that kills its node is
        then charged for it, and a node that dies charges at most that much work that
        never ran. Attempts behind a job of unknown or long run time wait for its end."""
        if not self.durable or not self.dispatching:
            return
        durations = self.durations
        ahead = 0.0 if worker.lease is None else durations.expected(worker.lease.job.type)
        for entry in worker.queued:
            lease = entry.lease
            token = lease.token
            if token not in self._granted and token not in self._going:
                if ahead > durations.go_ahead or token in self._withdrawn:
                    return
                if token in self._moving:
                    return
                self._going.add(token)
                self.outcomes.track(self._go_write(lease, worker))
            ahead += durations.expected(lease.job.type)

    async def _go_write(self, lease: Lease, worker: Worker) -> None:
        token = lease.token
        try:
            held = await self.store.start(lease)
        except StoreUnavailable as exc:
            log.warning("start failed: store unavailable", extra={"err": str(exc)})
            self._going.discard(token)
            asyncio.get_running_loop().call_later(RETRY_CLAIM, self._grant, worker)
            return
        except Exception:
            log.exception("starting a queued job failed")
            held = None
        if token not in self._going:  # dropped meanwhile (withdrawn, its worker gone)
            if held is not None and token not in self._withdrawn:
                self.outcomes.released(held)
            return
        self._going.discard(token)
        if held is None:
            log.warning("lease lost before the job started", extra={"job_id": lease.job.id})
            self._withdraw(worker, token, KillReason.LEASE_LOST)
            return
        self._granted.add(token)
        self._queued[token] = held
        worker.restarted(held)
        self.pool.go(worker, [lease.job.id])

    def _withdraw(self, worker: Worker, token: str, reason: KillReason) -> None:
        """Take back a lease queued on `worker` that is no longer ours (`reason`)."""
        lease = self._queued.get(token)
        if lease is None or token in self._withdrawn:
            return
        self._withdrawn[token] = reason
        self.pool.withdraw(worker, [lease.job.id])

    # -- leases held -----------------------------------------------------------------

    def held_leases(self) -> list[Lease]:
        """Every lease this node holds: attempts on workers, finished attempts whose
        outcome is not yet written (they keep their lease until it is), attempts queued
        on workers, then those in hand."""
        return [
            *self._started.values(),
            *self.outcomes.recording.values(),
            *self._starting.values(),
            *self._queued.values(),
            *self._hand,
        ]

    def drop(self, token: str) -> bool:
        """Forget a lease in hand that is no longer ours (cancelled, taken over)."""
        lease = self._hand.find(token)
        if lease is None:
            return False
        self._hand.remove(lease)
        return True

    def stop_lease(self, token: str, reason: KillReason) -> bool:
        """End the attempt holding `token`: kill its worker, take it back from the worker
        it is queued on, or drop it from the hand. False if this node holds no such
        lease."""
        worker = self.pool.holding(token)
        if worker is not None:
            self.pool.kill(worker, reason)
            return True
        if token in self._queued:
            for candidate in self.pool:
                if candidate.queues(token):
                    self._withdraw(candidate, token, reason)
                    return True
        return self.drop(token)

    def cancel_lease(self, token: str) -> bool:
        """Stop a cancelled job's attempt (the engine's `kill`)."""
        return self.stop_lease(token, KillReason.CANCEL)

    def release_buffer(self) -> None:
        """Hand every lease in hand back to the store, uncounted, and take back every
        attempt queued on a worker (shutdown)."""
        for lease in list(self._hand):
            self._hand.remove(lease)
            self.outcomes.released(lease)
        for worker in self.pool:
            if worker.queued:
                self._take_back(worker, list(worker.queued))

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
        self._started.pop(lease.token, None)
        self._running[job_type] -= 1
        if self._running[job_type] <= 0:
            del self._running[job_type]
        if duration is not None:
            self.durations.add(job_type, duration)
        if worker.queued:
            self._grant(worker)
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
