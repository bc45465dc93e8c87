"""How many workers a node with `--workers MIN:MAX` should run, decided once a tick.

A pure class, given the pool's counts, how long due work has waited and the time, so it
is driven in unit tests with a fake clock. The arbiter applies its answer as the pool's
target: spawning up to it, and retiring only idle workers down to it (a busy worker is
never killed to shrink).

Damped both ways, so a steady load holds a steady count:
- it grows by one at a time, only while a due job has waited `grow_after` seconds with
  no worker idle and none still booting (a booting worker is capacity on its way);
- it shrinks by the workers that stayed spare for the whole of `scale_down_after`: the
  lowest count of idle workers over that window (whichever workers took turns being
  idle), and the window restarts after every change.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from goqueue.supervisor.common.enums import WorkerState
from goqueue.supervisor.common.errors import StoreUnavailable
from goqueue.supervisor.common.reads import OTHER_QUEUES

if TYPE_CHECKING:
    from goqueue.supervisor.store.base import Store
    from goqueue.supervisor.workers.handle import Worker

GROW_AFTER = 0.5  # seconds a due job waits, with every worker busy, before one more starts
SCALE_QUEUES = 100  # queues whose waits are looked at one by one (the rest are summed)


@dataclass(frozen=True, slots=True)
class Bounds:
    """The fewest and the most workers a node may run."""

    minimum: int
    maximum: int

    @property
    def fixed(self) -> bool:
        return self.minimum == self.maximum

    def raised(self) -> Bounds:
        """One more at both ends (SIGTTIN)."""
        return Bounds(self.minimum + 1, self.maximum + 1)

    def lowered(self) -> Bounds:
        """One fewer at both ends (SIGTTOU), never below one; a range keeps MIN at one
        and narrows from the top when MIN is already one."""
        return Bounds(max(1, self.minimum - 1), max(1, self.minimum - 1, self.maximum - 1))

    def clamp(self, count: int) -> int:
        return max(self.minimum, min(self.maximum, count))

    def __str__(self) -> str:
        return str(self.minimum) if self.fixed else f"{self.minimum}:{self.maximum}"


class Scaler:
    """The worker count to aim for, between `bounds`, from the load seen tick by tick."""

    def __init__(
        self, bounds: Bounds, scale_down_after: float, *, grow_after: float = GROW_AFTER
    ) -> None:
        self.bounds = bounds
        self.scale_down_after = scale_down_after
        self.grow_after = grow_after
        self.target = bounds.minimum
        self._spare_since: list[float] = []  # [k]: since when at least k+1 were idle

    def rebound(self, bounds: Bounds) -> int:
        """New bounds (signals, reload): the target moved inside them."""
        self.bounds = bounds
        return self._set(bounds.clamp(self.target))

    async def look(
        self, workers: Iterable[Worker], waited: Callable[[], Awaitable[float]], now: float
    ) -> int:
        """The target after a look at `workers` (those of the current code), asking how
        long due work has `waited` only when every one of them is busy and more may run."""
        n = Counts.of(workers)
        saturated = not n.idle and not n.booting and n.workers < self.bounds.maximum
        wait = await waited() if saturated else 0.0
        return self.decide(now, workers=n.workers, idle=n.idle, booting=n.booting, waited=wait)

    def decide(self, now: float, *, workers: int, idle: int, booting: int, waited: float) -> int:
        """The target after a look at the pool: `workers` running or booting, `idle` of
        them free, `booting` not ready yet, and `waited` the seconds the longest-waiting
        due job this node could run has waited (0 with none)."""
        if self.bounds.fixed:
            return self._set(self.bounds.minimum)
        del self._spare_since[idle:]
        while len(self._spare_since) < idle:
            self._spare_since.append(now)
        if waited >= self.grow_after and idle == 0 and booting == 0:
            return self._set(self.bounds.clamp(max(self.target, workers) + 1))
        spare = sum(1 for since in self._spare_since if now - since >= self.scale_down_after)
        if spare:
            return self._set(self.bounds.clamp(min(self.target, workers) - spare))
        return self.target

    def _set(self, target: int) -> int:
        if target != self.target:
            self._spare_since.clear()  # the next shrink waits a whole window again
            self.target = target
        return target


@dataclass(frozen=True, slots=True)
class Counts:
    """The workers that count for scaling (serving or booting, of the current code)."""

    workers: int
    idle: int
    booting: int

    @classmethod
    def of(cls, workers: Iterable[Worker]) -> Counts:
        counted = [w for w in workers if w.state != WorkerState.STOPPING and not w.retire]
        idle = sum(1 for w in counted if w.state == WorkerState.IDLE)
        booting = sum(1 for w in counted if w.state == WorkerState.BOOTING)
        return cls(len(counted), idle, booting)


async def longest_wait(store: Store, served: frozenset[str] | None) -> float:
    """Seconds the longest-waiting due job of a queue in `served` (None: any) has
    waited; 0 when the store does not answer (no growth on a guess)."""
    try:
        depths = await store.queue_depths(SCALE_QUEUES)
    except StoreUnavailable:
        return 0.0
    waits = depths.waiting
    if served is not None:
        waits = {q: w for q, w in waits.items() if q in served or q == OTHER_QUEUES}
    return max(waits.values(), default=0.0)
