"""Claims: the best due job for each idle worker, started by the claim itself, and the
next due jobs for the workers whose queue ran low, merely claimed; each within the free
per-type slots, after taking its start from the rate limits (`throttle.py`).

The window each taken start must begin in is kept by type: an attempt of a rate-limited
type claimed ahead is handed back, not run, once its window ended. A claim that comes
back short notes the `Wakeup`'s news as of then: until something may have arrived since,
nothing is asked again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from goqueue.supervisor.common.catalog import Catalog
from goqueue.supervisor.common.enums import Status
from goqueue.supervisor.common.errors import StoreUnavailable
from goqueue.supervisor.common.jobs import Lease
from goqueue.supervisor.common.lifecycle import Lifecycle
from goqueue.supervisor.dispatch.attempts import Attempt, Attempts, Durations, Phase
from goqueue.supervisor.dispatch.feeding import types_of
from goqueue.supervisor.dispatch.in_hand import InHand
from goqueue.supervisor.dispatch.policy import Depth, Policy
from goqueue.supervisor.dispatch.throttle import Held, Throttle
from goqueue.supervisor.dispatch.wakeup import Wakeup
from goqueue.supervisor.store.base import Store
from goqueue.supervisor.workers.handle import Worker
from goqueue.supervisor.workers.pool import Pool

log = logging.getLogger("goqueue.dispatch")

RETRY_CLAIM = 1.0  # seconds before claiming again after a failed pass


class Claims:
    """Asks the store for due jobs for idle workers and for the workers' queues.

    `kept` holds the ids of idle workers kept for a start being written (the claim's
    own, meanwhile); `run` runs a started lease on an idle worker; `hand_out` hands the
    attempts in hand out; `in_hand` says how long a lease may wait and still run."""

    def __init__(
        self,
        store: Store,
        pool: Pool,
        attempts: Attempts,
        throttle: Throttle,
        depth: Depth,
        wakeup: Wakeup,
        kept: set[int],
        in_hand: InHand,
        durations: Durations,
        *,
        durable: bool,
        lifecycle: Lifecycle,
        run: Callable[[Lease, Worker, Attempt | None], None],
        hand_out: Callable[[], None],
        monotonic: Callable[[], float],
    ) -> None:
        self.store = store
        self.pool = pool
        self.attempts = attempts
        self.throttle = throttle
        self.depth = depth
        self.wakeup = wakeup
        self.kept = kept
        self.lifecycle = lifecycle
        self.run = run
        self.hand_out = hand_out
        self.in_hand = in_hand
        self.durations = durations
        self.durable = durable  # the store outlives the node: starts are written first
        self.monotonic = monotonic
        self._ends: dict[str, float] = {}  # by type: when starts the last claim took expire

    async def for_idle(
        self, idle: list[Worker], beside: int, catalog: Catalog, policy: Policy
    ) -> int | None:
        """Claim the best due job for each idle worker, started by the claim (the workers
        are kept for them meanwhile: a job charged is a job that runs), and run it there;
        in the same claim, up to `beside` more, merely claimed, for their queues (handed
        out as `for_queues` does). How many started, or None when nothing could be asked
        (every type throttled, the store unavailable, drained since the last look)."""
        wakeup = self.wakeup
        if wakeup.drained():
            return None
        want = len(idle)
        if wakeup.seen_short == wakeup.news:
            beside = 0  # nothing more for the queues as of the last look
        news = wakeup.news
        kept = {id(w) for w in idle} - self.kept
        self.kept |= kept
        try:
            asked = self.monotonic()
            leases = await self._take(
                want + beside, types_of(idle), want, catalog, policy, ahead=bool(beside)
            )
        finally:
            self.kept -= kept
        if leases is None:
            return None
        # a lease the claim started runs at once on a worker kept for it (the rest, and
        # any the claim took too long to run safely, go into hand)
        fresh = not self.lifecycle.winding_down and self.in_hand.fresh_since(asked)
        ready = [w for w in self.pool.idle() if id(w) in kept] if fresh else []
        for lease in leases:
            worker = _taker(lease, ready) if ready else None
            if worker is None:
                self._into_hand(lease, asked)
            else:
                ready.remove(worker)
                self.run(lease, worker, None)
        if beside:
            self.hand_out()  # (before the depth changes: it sized this claim)
        if len(leases) < want:
            wakeup.seen = news  # drained as of then; a wake since means look again
            self.depth.shallow()
            return None
        if beside and len(leases) < want + beside:
            wakeup.seen_short = news  # nothing more for the queues as of then
            self.depth.shallow()
        else:
            self.depth.deep()  # every idle worker found a job waiting: there may be more
        return want

    async def for_queues(
        self, low: dict[Worker, int], catalog: Catalog, policy: Policy
    ) -> int | None:
        """Claim the next due jobs for the workers whose queue ran low, claimed (not
        started: each starts on its worker), into hand, then queue those that may wait in
        a queue; the rest wait in hand for an idle worker (and so do all behind them: no
        job overtakes one ahead of it). How many, or None when nothing could be asked."""
        want = sum(low.values())
        news = self.wakeup.news
        asked = self.monotonic()
        leases = await self._take(want, types_of(list(low)), 0, catalog, policy, ahead=True)
        if leases is None:
            return None
        for lease in leases:
            self._into_hand(lease, asked)
        self.hand_out()  # (before the depth changes: it sized this claim)
        if len(leases) < want:
            self.wakeup.seen_short = news  # nothing more for the queues as of then
            self.depth.shallow()
        else:
            self.depth.deep()
        return len(leases)

    def _into_hand(self, lease: Lease, asked: float) -> None:
        window_end = self._ends.get(lease.job.type)
        self.attempts.add(lease, Phase.IN_HAND, asked, window_end=window_end)

    async def _take(
        self,
        want: int,
        types: frozenset[str],
        start: int,
        catalog: Catalog,
        policy: Policy,
        *,
        ahead: bool = False,
    ) -> list[Lease] | None:
        """Claim up to `want` due jobs of `types` within the free per-type slots, the best
        `start` of them started; None when nothing could be asked (every type throttled,
        the store unavailable). With `ahead` (jobs for workers' queues), those that lead
        the claim with a type whose queue starts soon are started too, when a store that
        outlives the node would have their starts written ahead anyway: nothing claimed
        and not started is ahead of them, so they go into queues at once."""
        attempts = self.attempts
        slots = catalog.free_slots(
            want,
            attempts.by_type(Phase.RUNNING),
            attempts.by_type(Phase.IN_HAND),
            attempts.by_type(Phase.STARTING),
        )
        if not slots.keys() <= types:
            slots = {t: n for t, n in slots.items() if t in types}
        if not slots:
            return None
        soon: frozenset[str] = frozenset()
        if ahead and self.durable:  # jobs of these may be started by the claim
            soon = self.durations.soon(slots, catalog, self.depth.current)
        asked = self.monotonic()
        try:
            taken: list[Held] = []
            if self.throttle.applies(catalog, slots):
                slots, taken = await self.throttle.admit(catalog, slots)
                if not slots:
                    return None  # every type is throttled: the throttle wakes us in time
            try:
                leases = await self.store.claim(want, policy.queues, slots, start, soon)
            except StoreUnavailable:
                await self.throttle.settle(taken, [])  # no claim made: its starts go back
                raise
            if catalog.key_limits or catalog.key_rates:
                self.throttle.count_key_waits()
            if taken:
                await self.throttle.settle(taken, leases)
        except StoreUnavailable as exc:
            log.warning("claim failed: store unavailable", extra={"err": str(exc)})
            asyncio.get_running_loop().call_later(RETRY_CLAIM, self.wakeup.wake)
            return None
        self._ends = {x.job_type: x.last_start(asked) for x in taken}
        return leases


def _taker(lease: Lease, workers: list[Worker]) -> Worker | None:
    """The first of `workers` that runs `lease`'s type, if it is started already."""
    if lease.job.status != Status.RUNNING:
        return None
    return next((w for w in workers if lease.job.type in w.types), None)
