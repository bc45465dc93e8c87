"""Where each claim starts: per (type, priority), the (run_at, seq) below which this node
knows no job is pending.

A claimed job's pending row version stays in the claim index until VACUUM removes it,
and VACUUM cannot while a snapshot older than the claim is open anywhere on the server
(a report, a backup, a forgotten session); until then every claim walking the index from
its start steps over every job drained since. A floor lets it start past them.

A floor rises with what this node claims (the last job without a key taken in each
(type, priority)) and, after a claim that took everything due of a type, to the
database's `now()` less a little slack (a job whose transaction began before then may
commit after). A floor holds for the claim's walk of jobs without a key; keyed jobs are
taken by key, from their own index, and never walked. So a claim that took a keyed job
of a type at some priority took every unkeyed job of it due at that priority and above
first (they come first in its order): those floors rise to `now()` too. (A keyed job
committed between the claim's look for keyed types and its walk may be walked instead:
the unkeyed jobs after it wait for the next rescan at worst.) A claim that came back
short took every unkeyed job of a type with a per-key rule this node does not limit as
a whole (another node's limit on it could have cut the claim short instead: those jobs
wait for the next rescan at worst). It falls when
this node makes a job pending below it (an enqueue that committed late, a lease reaped,
an explicit past `run_at`), and all floors go on a resume and every `rescan` seconds, so
a job placed below them by another node is claimed within that time at worst. Floors
learnt by claims from some queues hold only for claims from those same queues: a claim
from others (or from all) would skip the jobs of queues it did not walk. A claim from
every queue walks the same way while some are paused, stepping over the paused queues'
jobs: the floors rise past them, and the resume that makes them claimable again drops
the floors (one by another node: within a rescan).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable, Sequence
from datetime import datetime, timedelta

from goqueue.supervisor.common.jobs import Job, Lease

PRIORITIES = 11  # 0 to 10: the claim function's arrays hold 11 floors per type
Floor = tuple[datetime, int]  # (run_at, seq)
Queues = frozenset[str] | None  # the queues a claim takes from (None: all)


class ClaimFloors:
    """This node's claim floors, handed to `claim_floored` as two arrays."""

    def __init__(
        self,
        *,
        rescan: float = 5.0,
        slack: timedelta = timedelta(seconds=0.25),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.rescan = rescan  # seconds between claims that walk from the start
        self.slack = slack
        self._clock = clock
        self._floors: dict[Queues, dict[tuple[str, int], Floor]] = {}
        self._rescan_at = clock() + rescan
        self.key_only: frozenset[str] = frozenset()  # types this node limits by key alone

    def declare(self, key_ruled: Iterable[str], limited: Iterable[str]) -> None:
        """This node's types with a per-key rule, and those it limits as a whole."""
        self.key_only = frozenset(key_ruled) - frozenset(limited)

    def arrays(
        self, queues: Queues, types: Sequence[str]
    ) -> tuple[list[datetime | None], list[int | None]]:
        """The floors of `types` for a claim from `queues`, 11 per type in order (None
        where there is none); all None, once every `rescan` seconds."""
        known = self._known(queues)
        return _columns([known.get((t, p)) for t in types for p in range(PRIORITIES)])

    def at(
        self, queues: Queues, types: Sequence[str], priority: int
    ) -> tuple[list[datetime | None], list[int | None]]:
        """`arrays`, at one priority only: one floor per type (a start at enqueue looks
        for jobs ahead of its own priority from there)."""
        known = self._known(queues)
        return _columns([known.get((t, priority)) for t in types])

    def _known(self, queues: Queues) -> dict[tuple[str, int], Floor]:
        """The floors of claims from `queues`, forgotten first when a rescan is due."""
        if self._clock() >= self._rescan_at:
            self.reset()
        return self._floors.get(queues, {})

    def claimed(
        self,
        queues: Queues,
        leases: Iterable[Lease],
        exhausted: Collection[str],
        db_now: datetime | None,
    ) -> None:
        """Raise the floors of claims from `queues` past the jobs a claim took and, for
        the `exhausted` types (everything due of them was taken), to `db_now` less the
        slack."""
        known = self._floors.setdefault(queues, {})
        by_key: dict[str, int] = {}  # each type's lowest priority taken by key
        for lease in leases:
            job = lease.job
            if job.concurrency_key is None:
                _raise(known, (job.type, job.priority), (job.run_at, job.seq))
            else:
                by_key[job.type] = min(job.priority, by_key.get(job.type, job.priority))
        if db_now is not None:
            floor = (db_now - self.slack, 0)
            for type_ in exhausted:
                for priority in range(PRIORITIES):
                    _raise(known, (type_, priority), floor)
            for type_, lowest in by_key.items():
                for priority in range(lowest, PRIORITIES):
                    _raise(known, (type_, priority), floor)

    def lower(self, jobs: Iterable[Job]) -> None:
        """`jobs` were made pending: no floor stays above one of them."""
        for job in jobs:
            key, at = (job.type, job.priority), (job.run_at, job.seq)
            for known in self._floors.values():
                floor = known.get(key)
                if floor is not None and at < floor:
                    known[key] = at

    def reset(self) -> None:
        """Forget every floor: the next claim walks from the start."""
        self._floors.clear()
        self._rescan_at = self._clock() + self.rescan


def _raise(known: dict[tuple[str, int], Floor], key: tuple[str, int], floor: Floor) -> None:
    held = known.get(key)
    if held is None or floor > held:
        known[key] = floor


def _columns(floors: list[Floor | None]) -> tuple[list[datetime | None], list[int | None]]:
    """`floors` as the two arrays the statements take: run_at, then seq (None for none)."""
    return [f and f[0] for f in floors], [f and f[1] for f in floors]
