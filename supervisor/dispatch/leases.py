"""The lease chores of a node, one verb per duty; the arbiter's tick says when.

A lease is this node's claim on one attempt. Held leases (running on a worker, queued
on one, or claimed and waiting in the dispatcher) are extended before they run out; leases
some holder let expire are reaped; a lease this node lost (cancelled, or taken over after
it expired) means its worker is killed; finished jobs past their retention are pruned.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import datetime, timedelta

from goqueue.supervisor.common.catalog import Catalog
from goqueue.supervisor.common.enums import KillReason
from goqueue.supervisor.common.errors import StoreUnavailable
from goqueue.supervisor.common.jobs import utcnow
from goqueue.supervisor.dispatch.dispatcher import Dispatcher
from goqueue.supervisor.settings.config import Settings
from goqueue.supervisor.store.base import Store
from goqueue.supervisor.workers.pool import Pool

log = logging.getLogger("goqueue.leases")

PRUNE_BATCH = 10_000
SWEEP = 5.0  # seconds between claims that no notification asked for
PRUNE_EVERY = 60.0  # seconds between deletions of expired finished jobs, at most
PRUNE_EVERY_MIN = 1.0  # ... and at least
PRUNE_SHARE = 0.1  # ... else this share of the retention: a short one is kept closely


def prune_every(retention_seconds: float) -> float:
    """Seconds between prunes for a retention: a tenth of it, between a second and a
    minute, so a finished job outlives its retention by at most about a tenth of it."""
    return min(PRUNE_EVERY, max(PRUNE_EVERY_MIN, retention_seconds * PRUNE_SHARE))


class Leases:
    """Heartbeat, reap, kill the lost, prune."""

    def __init__(
        self,
        store: Store,
        dispatcher: Dispatcher,
        pool: Pool,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.dispatcher = dispatcher
        self.pool = pool
        self.monotonic = monotonic
        self._failing = False  # the last heartbeat found the store unreachable
        self._back_at: float | None = None  # when it answered again (reaping waits)
        self._last_heartbeat = 0.0
        self._last_sweep = 0.0
        self._last_prune = 0.0

    async def tick(self, now: float, settings: Settings, catalog: Catalog) -> None:
        """The arbiter's tick: a claim sweep, pruning and the heartbeat when each is due
        (the heartbeat a third of a lease apart; the catalog's limits registered with it)."""
        if now - self._last_sweep >= SWEEP:
            self._last_sweep = now
            self.dispatcher.wake()  # a safety net under notifications, never for latency
        retention = settings.retention_seconds
        # a full batch means more are due: the next tick prunes again, so retention keeps
        # up with any rate of finished jobs
        if (
            retention
            and now - self._last_prune >= prune_every(retention)
            and await self.prune(retention) < PRUNE_BATCH
        ):
            self._last_prune = now
        if now - self._last_heartbeat >= settings.lease_seconds / 3:
            self._last_heartbeat = now
            await self.beat(settings.lease_seconds, catalog)

    async def beat(self, lease_seconds: float, catalog: Catalog) -> None:
        """Extend held leases, reap expired ones, say this node is alive; then stop the
        attempts whose lease was lost."""
        try:
            lost = await self.heartbeat(lease_seconds)
            await self.reap(lease_seconds)
            await self.store.register_node(
                catalog.limits(), key_limits=catalog.key_limits, key_rates=catalog.key_rates
            )
        except StoreUnavailable as exc:
            self.unreachable()
            log.warning("heartbeat failed: store unavailable", extra={"err": str(exc)})
            return
        self.reachable()
        self.kill_lost(lost)

    async def heartbeat(self, lease_seconds: float) -> list[str]:
        """Hand back leases claimed ahead that waited too long for a worker, then extend
        every other lease this node holds by `lease_seconds`; return the tokens it no
        longer holds. Raises StoreUnavailable."""
        self.dispatcher.release_stale()
        held = self.dispatcher.held_leases()
        asked = self.monotonic()
        lost = await self.store.heartbeat(held, lease_seconds)
        gone = set(lost)
        self.dispatcher.renewed([x for x in held if x.token not in gone], asked)
        return lost

    def unreachable(self) -> None:
        """A lease chore found the store unreachable."""
        self._failing = True

    def reachable(self) -> None:
        """The lease chores all went through: the store answers (again)."""
        if self._failing:
            self._failing, self._back_at = False, self.monotonic()
            self.dispatcher.store_back()

    def may_reap(self, lease_seconds: float) -> bool:
        """False for a lease after the store came back from being unreachable: every node
        that held leases through the outage extends them first (their holders are alive,
        and may hold outcomes to write), so only leases of dead nodes are reaped."""
        if self._failing:
            return False
        if self._back_at is not None and self.monotonic() - self._back_at < lease_seconds:
            return False
        self._back_at = None
        return True

    async def reap(self, lease_seconds: float | None = None) -> None:
        """Hand back (or dead-letter) jobs whose holder let the lease expire, and wake the
        dispatcher if any came back; not within a lease of the store's return (see
        `may_reap`). Raises StoreUnavailable."""
        if lease_seconds is not None and not self.may_reap(lease_seconds):
            return
        if await self.store.reap_expired(self.dispatcher.retry_delay):
            self.dispatcher.wake()

    def kill_lost(self, tokens: list[str]) -> None:
        """Stop the attempts of leases this node lost: kill the worker running one, take
        one queued on a worker back, forget one still in hand. Whatever the worker
        reports afterwards is fenced off."""
        for token in tokens:
            worker = self.pool.holding(token)
            if worker is not None:
                log.warning("lease lost; killing its worker", extra={"worker_pid": worker.pid})
            self.dispatcher.stop_lease(token, KillReason.LEASE_LOST)

    async def prune(self, retention_seconds: float, now: datetime | None = None) -> int:
        """Delete finished jobs older than `retention_seconds` (one batch per call);
        returns how many. A store that is down skips this pass."""
        cutoff = (now or utcnow()) - timedelta(seconds=retention_seconds)
        try:
            pruned = await self.store.prune(cutoff, PRUNE_BATCH)
        except StoreUnavailable as exc:
            log.warning("pruning skipped: store unavailable", extra={"err": str(exc)})
            return 0
        if pruned:
            log.info("pruned finished jobs", extra={"count": pruned, "before": cutoff.isoformat()})
        return pruned
