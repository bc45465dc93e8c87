"""Start at enqueue: a job enqueued while a worker of this node waits for one like it is
started by its own insert (`NewJob.start`: no claim is needed) and runs on that worker on
the next turn of the loop, once the enqueue's answer is written: a client hears of its
job before the job can do anything (even kill its node). Should the node be frozen
between the two (a SIGSTOP, a paused machine) for long enough that the lease may have
lapsed, the job is not run there but goes into hand as a claimed one would, and so back
to the store (fenced by its token: one another node took over costs nothing)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from goqueue.supervisor.common.catalog import Catalog
from goqueue.supervisor.common.jobs import Enqueued, Lease
from goqueue.supervisor.common.lifecycle import Lifecycle
from goqueue.supervisor.dispatch.attempts import Attempts, Phase
from goqueue.supervisor.dispatch.policy import Policy
from goqueue.supervisor.dispatch.wakeup import Wakeup
from goqueue.supervisor.store.base import NewJob, StartNow, Store
from goqueue.supervisor.workers.handle import Worker
from goqueue.supervisor.workers.pool import Pool


class AtEnqueue:
    """Keeps an idle worker for a new job while it is stored, and runs it there.

    `kept` holds the ids of idle workers kept for a start being written (shared with the
    dispatcher's claims); `wakeup` says whether this node's last claim found nothing
    more it could take (and nothing arrived since); `run` runs a started lease on an idle
    worker; `fresh_since(t)` says whether a lease taken at `t` (monotonic) may still run."""

    def __init__(
        self,
        store: Store,
        pool: Pool,
        attempts: Attempts,
        kept: set[int],
        catalog: Catalog,
        policy: Policy,
        *,
        lifecycle: Lifecycle,
        sees_ahead: bool,
        wakeup: Wakeup,
        run: Callable[[Lease, Worker], None],
        fresh_since: Callable[[float], bool],
        nudge: Callable[[], None],
        monotonic: Callable[[], float],
    ) -> None:
        self.store = store
        self.pool = pool
        self.attempts = attempts
        self.kept = kept
        self.lifecycle = lifecycle
        self.sees_ahead = sees_ahead
        self.wakeup = wakeup
        self.run = run
        self.fresh_since = fresh_since
        self.nudge = nudge
        self.monotonic = monotonic
        self.catalog = catalog
        self.queues = policy.queues  # the queues this node serves (None: all)

    def reconfigure(self, catalog: Catalog, policy: Policy) -> None:
        """New actors and limits, a new policy (boot, reload)."""
        self.catalog = catalog
        self.queues = policy.queues

    async def enqueue(self, new: NewJob) -> Enqueued:
        """Store `new`, started at once when a worker of this node waits for it."""
        worker = self._keeper(new)
        if worker is None:
            return await self.store.enqueue(new)
        asked = self.monotonic()  # the lease it may get runs from no earlier than this
        try:
            enqueued = await self.store.enqueue(new)
        except BaseException:
            self.kept.discard(id(worker))
            self.nudge()
            raise
        if enqueued.lease is None:  # stored pending: the store woke us for it
            self.kept.discard(id(worker))
            self.nudge()
        else:
            asyncio.get_running_loop().call_soon(self._run_started, worker, enqueued.lease, asked)
        return enqueued

    def _keeper(self, new: NewJob) -> Worker | None:
        """An idle worker to keep for `new` while it is enqueued, when it may start at
        once (setting `new.start`), or None when it must wait its turn. Only while this
        node holds nothing in hand, for a type without a limit of its own, of a job with
        no flow-control key (`concurrency_key`, `debounce_key`), in a queue
        this node serves; and so that no job the worker could run waits ahead of this
        one, only when the store checks that itself (`StoreTraits.sees_ahead`, across
        nodes) or else this node's last claim found nothing more it could take."""
        if self.lifecycle.winding_down or self.attempts.hand:
            return None
        wakeup = self.wakeup
        if not self.sees_ahead and wakeup.seen != wakeup.news:
            return None
        spec, catalog, queues = new.spec, self.catalog, self.queues
        if spec.run_at is not None or spec.delay_seconds or spec.type in catalog.rates:
            return None
        if spec.concurrency_key is not None or spec.debounce_key is not None:
            return None  # its key's limit or pace (any node's) is the claim's to apply
        if catalog.limit(spec.type) is not None:
            return None
        if queues is not None and spec.queue_name not in queues:
            return None
        worker = self.pool.idle_for(spec.type, self.kept)
        if worker is None or worker.retire:
            return None
        self.kept.add(id(worker))
        new.start = StartNow(worker.types, queues)
        return worker

    def _run_started(self, worker: Worker, lease: Lease, asked: float) -> None:
        """Run a job started at its enqueue (`asked`: when the enqueue was sent) on the
        worker kept for it; else (that one is gone, or the lease is no longer fresh) put
        it in hand, first, to be run on the next idle worker or handed back."""
        self.kept.discard(id(worker))
        fresh = self.fresh_since(asked)
        if fresh and not self.lifecycle.winding_down and self.pool.is_idle(worker):
            self.run(lease, worker)
        else:
            self.attempts.add(lease, Phase.IN_HAND, asked, first=True)
            self.nudge()
