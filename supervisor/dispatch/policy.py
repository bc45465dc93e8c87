"""How dispatch decides: what the operator decides (`Policy`, replaced whole on a reload),
and what the node learns as it runs about what a worker's own queue may hold: how many
attempts (`Depth`), and of which types (`Durations`): short ones, with no limit of their
own.

A worker runs the attempts it holds back to back, so the round trip through the
supervisor between two of them is off its path. That pays for short jobs only: behind
a long one, queued attempts would wait while another worker may be free. So only types
whose attempts usually take under `SHORT` seconds here, with no concurrency or rate limit,
are queued; any other job goes to an idle worker alone, as its first attempt.

How deep: `Depth` starts at one attempt per worker and doubles (up to `1 + --prefetch`)
each time a batch claimed for the queues comes back full, and falls back to one when a
claim finds the queue shallow. A worker's queue is refilled once it is down to half.
Its depth bounds what a newly enqueued job of a higher priority may wait behind (the
attempts already queued: `depth * SHORT` seconds at worst) and how many leases a node
holds that other nodes cannot take.

With a store that outlives the node, a queued attempt waits for its start to be written
before it runs (a job that kills its node is then charged for it), and the dispatcher
writes those starts ahead only for the attempts due to start within `GO_AHEAD` seconds
of work: a node that dies charges at most about that much work that never ran. The
claim itself starts the jobs at its head whose type's whole queue starts within that
(`Durations.soon`): one write a job fewer.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from goqueue.supervisor.common.catalog import Catalog
from goqueue.supervisor.settings.config import DEFAULTS, Settings


@dataclass(frozen=True, slots=True)
class Policy:
    """What the operator decides about dispatch; replaced whole on a reload."""

    queues: frozenset[str] | None = None  # None: every queue
    default_timeout: float = DEFAULTS.default_timeout
    retry_base: float = DEFAULTS.retry_base
    retry_cap: float = DEFAULTS.retry_cap
    lease_seconds: float = DEFAULTS.lease_seconds

    @classmethod
    def of(cls, settings: Settings) -> Policy:
        """The policy `settings` ask for."""
        queues = frozenset(settings.queues) if settings.queues else None
        return cls(
            queues,
            settings.default_timeout,
            settings.retry_base,
            settings.retry_cap,
            settings.lease_seconds,
        )


DEFAULT_POLICY = Policy.of(DEFAULTS)  # what a node configured with nothing decides


SHORT = 0.05  # seconds: types whose attempts usually take less may wait in a worker's queue
GO_AHEAD = 0.05  # seconds of work ahead within which queued starts are written early
SMOOTHING = 0.2  # weight of the newest attempt in a type's usual run time


class Depth:
    """How many attempts each worker may hold (the one it runs included), between one
    and `limit`, adapting to how deep the queue is."""

    def __init__(self, limit: int) -> None:
        self.limit = max(1, limit)
        self.current = 1

    def room(self, held: int) -> int:
        """How many more a worker holding `held` should take now: none until its queue is
        down to half, then enough to fill it."""
        if held > self.current // 2:
            return 0
        return self.current - held

    def deep(self) -> None:
        """A batch came back full: more is waiting."""
        self.current = min(self.limit, self.current * 2)

    def shallow(self) -> None:
        """A claim found fewer jobs than asked for."""
        self.current = 1


class Durations:
    """How long each type's attempts usually take on this node (a moving average of the
    handlers' own run times), and so which types may be queued."""

    def __init__(self, short: float = SHORT, go_ahead: float = GO_AHEAD) -> None:
        self.short = short
        self.go_ahead = go_ahead
        self._usual: dict[str, float] = {}
        self._short: set[str] = set()
        self._cache: tuple[Catalog, frozenset[str]] | None = None

    def add(self, job_type: str, seconds: float) -> None:
        """One attempt of `job_type` ran for `seconds`."""
        usual = self._usual.get(job_type)
        usual = seconds if usual is None else usual + SMOOTHING * (seconds - usual)
        self._usual[job_type] = usual
        if (usual < self.short) != (job_type in self._short):
            if usual < self.short:
                self._short.add(job_type)
            else:
                self._short.discard(job_type)
            self._cache = None

    def expected(self, job_type: str) -> float:
        """The usual run time of `job_type` (infinite until one ran here)."""
        return self._usual.get(job_type, math.inf)

    def soon(self, types: Iterable[str], catalog: Catalog, depth: int) -> frozenset[str]:
        """Those of `types` that may wait in a worker's queue and of which `depth`
        attempts usually take at most `go_ahead` seconds: a queue of them starts within
        that, so their starts may be written as they are claimed."""
        short = self.short_types(catalog)
        usual = self._usual
        return frozenset(t for t in types if t in short and usual[t] * depth <= self.go_ahead)

    def short_types(self, catalog: Catalog) -> frozenset[str]:
        """The types of `catalog` that may wait in a worker's queue: short, unlimited."""
        cached = self._cache
        if cached is not None and cached[0] is catalog:
            return cached[1]
        short = frozenset(
            t for t in self._short if catalog.limit(t) is None and t not in catalog.rates
        )
        self._cache = (catalog, short)
        return short
