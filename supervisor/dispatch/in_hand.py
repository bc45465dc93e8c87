"""The leases a node holds in hand: claimed, not yet on a worker (claimed ahead of a
worker that frees up, or put back when the worker a start was written for went away),
best first.

For each it keeps when the lease was last known extended and when it was taken in hand
(monotonic seconds), and, for a lease only claimed of a rate-limited type, the end of the
rate window its start was taken from: past it the lease goes back rather than start.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterator
from dataclasses import dataclass

from goqueue.supervisor.common.enums import Status
from goqueue.supervisor.common.jobs import Lease


@dataclass(slots=True)
class _Times:
    renewed: float  # when the lease was last known extended
    taken: float  # when it was taken in hand
    window_end: float | None  # the end of its start's rate window, less its guard


class Hand:
    """Leases in hand, in the order they are to be run, and their times."""

    def __init__(self) -> None:
        self.leases: deque[Lease] = deque()  # read-only outside: `if hand.leases` costs no call
        self._times: dict[str, _Times] = {}
        self.by_type: Counter[str] = Counter()  # how many of each type are in hand

    def __len__(self) -> int:
        return len(self.leases)

    def __iter__(self) -> Iterator[Lease]:
        return iter(self.leases)

    def add(
        self, lease: Lease, renewed: float, window_end: float | None = None, *, first: bool = False
    ) -> None:
        """Keep `lease`, last extended at `renewed`; `window_end` counts only while it is
        merely claimed. `first`: ahead of the others (a lease put back)."""
        if first:
            self.leases.appendleft(lease)
        else:
            self.leases.append(lease)
        self.by_type[lease.job.type] += 1
        end = window_end if lease.job.status == Status.CLAIMED else None
        self._times[lease.token] = _Times(renewed, renewed, end)

    def remove(self, lease: Lease) -> None:
        """Take `lease` out of hand (to run it, or to give it back)."""
        self.leases.remove(lease)
        del self._times[lease.token]
        job_type = lease.job.type
        self.by_type[job_type] -= 1
        if self.by_type[job_type] <= 0:
            del self.by_type[job_type]

    def find(self, token: str) -> Lease | None:
        """The lease in hand with `token`."""
        return next((x for x in self.leases if x.token == token), None)

    def next_for(self, types: frozenset[str]) -> Lease | None:
        """The lease a worker that runs `types` should take: the best already started
        (charged) first, else the best."""
        first = None
        for lease in self.leases:
            if lease.job.type in types:
                if lease.job.status == Status.RUNNING:
                    return lease
                if first is None:
                    first = lease
        return first

    def renewed_at(self, lease: Lease) -> float:
        """When `lease` was last known extended (-inf if it is not in hand)."""
        times = self._times.get(lease.token)
        return times.renewed if times is not None else float("-inf")

    def taken_at(self, lease: Lease) -> float:
        """When `lease` was taken in hand."""
        return self._times[lease.token].taken

    def window_end(self, lease: Lease) -> float | None:
        """The end of the rate window `lease`'s start was taken from, if any."""
        times = self._times.get(lease.token)
        return times.window_end if times is not None else None

    def renew(self, leases: list[Lease], at: float) -> None:
        """The store extended those of `leases` in hand as of `at`."""
        for lease in leases:
            times = self._times.get(lease.token)
            if times is not None:
                times.renewed = max(at, times.renewed)
