"""`--max-queues`: a bound on the queues a client can make a node (and its store) track.

A queue exists while it holds pending jobs or is paused. Every queue costs something on
every claim, scrape and summary, and a queue name is free to invent, so without a bound
one client could make a node track 100k of them. An enqueue (or a pause) that would add
a queue beyond the bound is answered 429, naming the field; work in existing queues
is never refused by it, nor work in the queues the node is there for (`reserved_queues`:
those it serves, those its actors and its schedules name), so a flood of one-off names
cannot lock the real queues out.

Counting is cheap: the names are read from the store (`Store.queue_names`) at most every
`ttl` seconds, and only when a request names a queue not seen since; queues admitted in
between are added locally. With PostgreSQL, nodes sharing the store see each other's new
queues at the next read, so several nodes at once may overshoot the bound by what they
admit within `ttl`: it is a guard against runaway growth, not an exact quota.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Container, Iterable, Iterator

from goqueue.actors.protocol import ActorInfo
from goqueue.api.http.replies import ApiError, within
from goqueue.supervisor.common.jobs import DEFAULT_QUEUE, JobSpec
from goqueue.supervisor.common.schedule import ScheduleSpec
from goqueue.supervisor.observe.shared_reads import Coalesced
from goqueue.supervisor.store.base import Store

NAMES_TTL = 2.0
RETRY_AFTER = "5"


class QueueBudget:
    """Admit queue names up to `limit` queues (see the module)."""

    def __init__(
        self,
        store: Store,
        limit: int,
        with_defaults: Callable[[JobSpec], JobSpec],
        ttl: float = NAMES_TTL,
        booted: Callable[[], Awaitable[None]] | None = None,
        reserved: Callable[[], Container[str]] = frozenset,
    ) -> None:
        self.with_defaults = with_defaults  # the job's queue if it names none (its actor's)
        self.booted = booted  # waits for a booting node: its store and its actors' queues
        self.reserved = reserved  # queues never refused (asked when the budget is full)
        self.limit = limit
        self._names = Coalesced(lambda: store.queue_names(limit + 1), ttl)
        self._known: frozenset[str] = frozenset()
        self._added: set[str] = set()

    async def admit_spec(self, spec: JobSpec, prefix: str = "") -> None:
        """Admit every queue a job names (its templates' too); 429 naming the first refused."""
        if self.booted is not None:
            await self.booted()
        spec = self.with_defaults(spec)
        if spec.on_success is None and spec.on_failure is None and spec.queue is not None:
            await self.admit(spec.queue, f"{prefix}queue")  # the usual job: no templates
            return
        for field, queue in queues_of(spec, prefix):
            await self.admit(queue, field)

    async def admit(self, queue: str, field: str = "queue") -> None:
        """Admit one queue name, or raise a 429 naming `field`."""
        if queue in self._known or queue in self._added:
            return
        if self.booted is not None:
            await self.booted()
        known = await within(self._names.get())
        if known is not self._known:  # a fresh read already counts what was added before it
            self._known, self._added = known, set()
        if queue in self._known or queue in self._added:
            return
        if len(self._known) + len(self._added) >= self.limit:
            if queue in self.reserved():
                return  # not counted in `_added`: it never takes a one-off name's place
            raise ApiError(
                429,
                f"too many queues: {self.limit} queues hold pending jobs or are paused "
                "(--max-queues); use an existing queue, or retry once some have emptied",
                {"field": field, "max_queues": self.limit},
                headers={"Retry-After": RETRY_AFTER},
            )
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
