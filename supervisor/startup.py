"""How a node starts: the steps the arbiter takes before its loop, as `shutdown.py` holds
those after it. Each boot step is retried with backoff through an outage (`boot_step`);
the first worker is awaited for the actors it reports (`FirstWorker`); those actors become
the node's catalog (`catalog_of`, `adopt`) and are declared to the store (`register`), at
start and after a reload alike; the dead nodes' jobs are reaped before the first claim
(`reap_first`); the start is announced (`announce`).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from functools import partial

from goqueue.actors.protocol import Ready
from goqueue.supervisor.common.backoff import Backoff, retrying
from goqueue.supervisor.common.catalog import Catalog
from goqueue.supervisor.common.errors import BootError, StoreUnavailable
from goqueue.supervisor.dispatch.leases import Leases
from goqueue.supervisor.dispatch.policy import Policy
from goqueue.supervisor.node import Node
from goqueue.supervisor.queue_budget import reserved_queues
from goqueue.supervisor.settings.config import Settings
from goqueue.supervisor.store.base import Store
from goqueue.supervisor.workers.pool import Pool

log = logging.getLogger("goqueue.arbiter")  # the arbiter's steps, logged as its own

BOOT_RETRY_BASE = 0.25  # seconds before the first retry of a boot step (store, worker)
# near a second (jittered): a node booting through an outage is ready within about a
# second of the database's return, as a running node is
BOOT_RETRY_CAP = 1.0


async def boot_step(
    what: str, attempt: Callable[[], Awaitable[None]], errors: type[Exception], rng: random.Random
) -> None:
    """A boot step, retried with backoff after each of `errors` (`retrying`)."""
    await retrying(what, attempt, errors, Backoff(BOOT_RETRY_BASE, BOOT_RETRY_CAP, rng))


class FirstWorker:
    """The first worker's boot, which the node's start awaits: its Ready message names the
    actors; a boot failure, or its exit before it is ready, fails the start (BootError)."""

    def __init__(self) -> None:
        self._ready: asyncio.Future[Ready] | None = None

    @property
    def awaited(self) -> bool:
        """True while the start awaits the first worker's Ready."""
        return self._ready is not None and not self._ready.done()

    async def spawn(self, pool: Pool, generation: int, rng: random.Random) -> Ready:
        """Spawn the first worker (retried while the system refuses: EMFILE, ...) and
        await its Ready."""
        self._ready = asyncio.get_running_loop().create_future()
        spawn = partial(_spawn, pool, generation)
        await boot_step("starting the first worker", spawn, OSError, rng)
        return await self._ready

    def ready(self, message: Ready) -> None:
        """The first worker booted: the start goes on with its actors."""
        if self._ready is not None and not self._ready.done():
            self._ready.set_result(message)

    def failed(self, error: str) -> None:
        """The first worker cannot boot, or exited before it was ready: the start fails."""
        if self._ready is not None and not self._ready.done():
            self._ready.set_exception(BootError(error))


async def _spawn(pool: Pool, generation: int) -> None:
    """Spawn one worker (a coroutine function, as `retrying` takes)."""
    pool.spawn(generation)


def catalog_of(ready: Ready, settings: Settings) -> Catalog:
    """The catalog of the actors a worker reported, under the limits and rates of
    `settings` (the first worker's at start, the probe's after a reload)."""
    return Catalog(
        ready.actors,
        settings.limits,
        settings.rate_limits,
        key_limits=settings.key_limits,
        key_rates=settings.key_rate_limits,
    )


def adopt(node: Node, catalog: Catalog, settings: Settings) -> list[str]:
    """Make `catalog` the node's everywhere it counts, with the dispatch policy and the
    schedules of `settings` and the actors; returns the actors' schedules that are invalid
    (left out)."""
    node.dispatcher.reconfigure(catalog, Policy.of(settings))
    node.engine.set_catalog(
        catalog, reserved_queues(settings.queues, catalog.actors.values(), settings.schedules)
    )
    node.metrics.declare_types(catalog.types)
    problems = node.scheduler.configure(settings.schedules, catalog)
    for problem in problems:
        log.error(f"schedule left out: {problem}")
    return problems


async def register(store: Store, catalog: Catalog) -> None:
    """Declare the node to the store with its types' limits and the key limits and rates
    of `catalog`."""
    await store.register_node(
        catalog.limits(), key_limits=catalog.key_limits, key_rates=catalog.key_rates
    )


async def reap_first(leases: Leases) -> None:
    """Reap before the first claim: the first node up after a total outage gives the dead
    nodes' jobs back in their place (and their lost attempts their backoff) before it
    takes any job."""
    try:
        await leases.reap()
    except StoreUnavailable as exc:
        log.warning("reaping at start failed: store unavailable", extra={"err": str(exc)})


def announce(settings: Settings, node_id: str, catalog: Catalog, workers: int) -> None:
    """Log the node's start; warn that an in-memory node keeps nothing across a restart."""
    store = settings.store_kind
    extra = {"workers": workers, "node": node_id, "types": sorted(catalog.types)}
    log.info("node started", extra={**extra, "store": store})
    if not settings.keeps_jobs:
        log.warning(
            "the in-memory store keeps nothing across a restart: jobs, dead letters and "
            "schedules' last fires are lost when this node stops (leave out --database-url "
            "to keep them in the SQLite file goqueue.db, or give a PostgreSQL one)",
            extra={"store": store},
        )
