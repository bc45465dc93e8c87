"""`--max-queues`: a bound on the queues a client can make a node (and its store) track.

A queue exists while it holds pending jobs or is paused. Every queue costs something on
every claim, scrape and summary, and a queue name is free to invent, so without a bound
one client could make a node track 100k of them. The engine admits every queue a job
names as it prepares the job, whoever asks (a client's enqueue, batch, workflow or
replay, and a running job's own `ctx.enqueue`), and a queue before it is paused: one
beyond the bound is refused (`TooManyQueues`, a 429 naming the field). Work in existing
queues is never refused by it, nor work in the queues the node is there for
(`reserved_queues`: those it serves, those its actors and its schedules name), so a
flood of one-off names cannot lock the real queues out.

Counting is cheap: the names are read from the store (`Store.queue_names`) at most every
`ttl` seconds, and only when a request names a queue not seen since; queues admitted in
between are added locally. With PostgreSQL, nodes sharing the store see each other's new
queues at the next read, so several nodes at once may overshoot the bound by what they
admit within `ttl`: it is a guard against runaway growth, not an exact quota.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from goqueue.actors.protocol import ActorInfo
from goqueue.supervisor.common.errors import TooManyQueues
from goqueue.supervisor.common.jobs import DEFAULT_QUEUE, JobSpec
from goqueue.supervisor.common.schedule import ScheduleSpec
from goqueue.supervisor.observe.shared_reads import Coalesced
from goqueue.supervisor.store.base import Store

NAMES_TTL = 2.0


class QueueBudget:
    """Admit queue names up to `limit` queues (see the module)."""

    def __init__(
        self,
        store: Store,
        limit: int,
        ttl: float = NAMES_TTL,
        reserved: frozenset[str] = frozenset(),
    ) -> None:
        self.reserved = reserved  # queues never refused (see `reserve`)
        self.limit = limit
        self._names = Coalesced(lambda: store.queue_names(limit + 1), ttl)
        self._known: frozenset[str] = frozenset()
        self._added: set[str] = set()

    def reserve(self, queues: frozenset[str]) -> None:
        """The queues never refused from now on (the node's, as its actors and
        configuration say: set again when they change)."""
        self.reserved = queues

    async def admit_spec(self, spec: JobSpec, prefix: str = "") -> None:
        """Admit every queue a job names (its templates' too), `spec` with its defaults
        resolved; raise TooManyQueues naming the first refused."""
        if spec.on_success is None and spec.on_failure is None and spec.queue is not None:
            await self.admit(spec.queue, f"{prefix}queue")  # the usual job: no templates
            return
        for field, queue in queues_of(spec, prefix):
            await self.admit(queue, field)

    async def admit(self, queue: str, field: str = "queue") -> None:
        """Admit one queue name, or raise TooManyQueues naming `field`."""
        if queue in self._known or queue in self._added:
            return
        known = await self._names.get()
        if known is not self._known:  # a fresh read already counts what was added before it
            self._known, self._added = known, set()
        if queue in self._known or queue in self._added:
            return
        if len(self._known) + len(self._added) >= self.limit:
            if queue in self.reserved:
                return  # not counted in `_added`: it never takes a one-off name's place
            raise TooManyQueues(self.limit, field)
        self._added.add(queue)


def reserved_queues(
    served: Iterable[str] | None, actors: Iterable[ActorInfo], schedules: Iterable[ScheduleSpec]
) -> frozenset[str]:
    """The queues a node is there for: those it serves (`--queues`; the default queue
    when it serves every queue), those its actors declare, and its schedules' queues."""
    queues = {DEFAULT_QUEUE} if served is None else set(served)
    queues.update(actor.queue for actor in actors if actor.queue is not None)
    queues.update(spec.queue or DEFAULT_QUEUE for spec in schedules)
    return frozenset(queues)


def queues_of(spec: JobSpec, prefix: str = "") -> Iterator[tuple[str, str]]:
    """(field path, queue name) of a job and of its templates, outermost first (`spec` has
    its defaults resolved: a job naming no queue is counted in the one it will go to)."""
    if spec.queue is not None:
        yield f"{prefix}queue", spec.queue
    if spec.on_success is not None:
        yield from queues_of(spec.on_success, f"{prefix}on_success.")
    if spec.on_failure is not None:
        yield from queues_of(spec.on_failure, f"{prefix}on_failure.")
