"""The lease chores of a node, one verb per duty; the arbiter's tick says when.

A lease is this node's claim on one attempt. Held leases (running on a worker, or
claimed ahead and waiting in the dispatcher) are extended before they run out; leases
some holder let expire are reaped; a lease this node lost (cancelled, or taken over after
it expired) means its worker is killed; finished jobs past their retention are pruned.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from goqueue.supervisor.dispatch import Dispatcher
from goqueue.supervisor.errors import StoreUnavailable
from goqueue.supervisor.jobs import utcnow
from goqueue.supervisor.pool import Pool
from goqueue.supervisor.store.base import Store
from goqueue.supervisor.vocab import KillReason

log = logging.getLogger("goqueue.leases")

PRUNE_BATCH = 10_000


class Leases:
    """Heartbeat, reap, kill the lost, prune."""

    def __init__(self, store: Store, dispatcher: Dispatcher, pool: Pool) -> None:
        self.store = store
        self.dispatcher = dispatcher
        self.pool = pool

    async def heartbeat(self, lease_seconds: float) -> list[str]:
        """Extend every lease this node holds by `lease_seconds`; return the tokens it no
        longer holds. Raises StoreUnavailable."""
        return await self.store.heartbeat(self.dispatcher.held_leases(), lease_seconds)

    async def reap(self) -> None:
        """Hand back (or dead-letter) jobs whose holder let the lease expire, and wake the
        dispatcher if any came back. Raises StoreUnavailable."""
        if await self.store.reap_expired():
            self.dispatcher.wake()

    def kill_lost(self, tokens: list[str]) -> None:
        """Stop the attempts of leases this node lost: kill the worker running one, forget
        one still in hand. Whatever the worker reports afterwards is fenced off."""
        for token in tokens:
            self.dispatcher.drop(token)
            worker = self.pool.holding(token)
            if worker is not None:
                log.warning("lease lost; killing its worker", extra={"worker_pid": worker.pid})
                self.pool.kill(worker, KillReason.LEASE_LOST)

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
