"""The dispatcher's rate limits (`supervisor/common/rates.py`): before a claim, take starts
from the store for each rate-limited type it may claim, and cap that type's slots to
them; after it, give back what the claim did not use. A type with no start due is left
out of the claim (its jobs stay pending, holding no worker; other types keep flowing),
and the dispatcher is woken when its next start is."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from goqueue.supervisor.common.catalog import Catalog
from goqueue.supervisor.common.jobs import Lease
from goqueue.supervisor.common.rates import Taken
from goqueue.supervisor.store.base import Store

WAKE_MARGIN = 0.002  # seconds past a type's next start before claiming again (clocks, rounding)


@dataclass(frozen=True, slots=True)
class Held:
    """Starts taken for one type before a claim."""

    job_type: str
    taken: Taken
    guard: float  # the rate's guard: a granted start begins this much before the next is due

    def last_start(self, asked: float) -> float:
        """Until when (monotonic) a job claimed with these starts may start, the claim
        having been asked at `asked`: before the type's next start is due, less the guard."""
        return asked + self.taken.seconds_left - self.guard


class Throttle:
    """Takes and returns the starts of rate-limited types around each claim."""

    def __init__(
        self,
        store: Store,
        wake: Callable[[], None],
        on_wait: Callable[[str], None],
        on_key_wait: Callable[[str], None] = lambda job_type: None,
    ) -> None:
        self.store = store
        self.wake = wake
        self.on_wait = on_wait  # a type was held back by its limit (a metric)
        self.on_key_wait = on_key_wait  # a claim held a type's jobs back by key (a metric)
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0

    def applies(self, catalog: Catalog, slots: Mapping[str, int]) -> bool:
        """True when a claim for `slots` has starts to take (a rate-limited type is in
        it); otherwise `admit` and `settle` would do nothing, and need not be awaited."""
        return bool(catalog.rates) and not catalog.rates.keys().isdisjoint(slots)

    async def admit(
        self, catalog: Catalog, slots: Mapping[str, int]
    ) -> tuple[dict[str, int], list[Held]]:
        """`slots` capped by the starts each rate-limited type may still make in its
        now, and what was taken. Raises StoreUnavailable."""
        capped = dict(slots)
        held: list[Held] = []
        for job_type, want in slots.items():
            rate = catalog.rates.get(job_type)
            if rate is None:
                continue
            taken = await self.store.take_starts(job_type, rate, want)
            held.append(Held(job_type, taken, rate.guard))
            if taken.granted < want:
                self.on_wait(job_type)
                self._wake_in(taken.seconds_left + WAKE_MARGIN)
            if taken.granted > 0:
                capped[job_type] = taken.granted
            else:
                del capped[job_type]
        return capped, held

    def count_key_waits(self) -> None:
        """Count the claims that held jobs back by key (`Store.key_waits`)."""
        for job_type in self.store.key_waits():
            self.on_key_wait(job_type)

    async def settle(self, held: Sequence[Held], leases: Sequence[Lease]) -> None:
        """Give back the starts taken and not used by `leases`."""
        used = Counter(lease.job.type for lease in leases)
        for item in held:
            unused = item.taken.granted - used[item.job_type]
            if unused > 0:
                await self.store.return_starts(item.job_type, item.taken.tat, unused)

    def _wake_in(self, seconds: float) -> None:
        """Wake the dispatcher in `seconds`, unless a wake comes sooner already. (A timer
        that fired is forgotten as it fires: the loop may run it a little before its time,
        and a pass it started must still be able to ask for the next wake.)"""
        at = time.monotonic() + seconds
        if self._timer is not None and self._timer_at <= at:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = at
        self._timer = asyncio.get_running_loop().call_later(seconds, self._fire)

    def _fire(self) -> None:
        self._timer = None
        self.wake()
