"""One record per attempt this node holds, the phases it moves through, and how long
each type's attempts usually take here (`Durations`, for `policy.py`'s choice of what a
worker's own queue may hold).

An attempt is born when a lease comes back from the store (a claim, or an enqueue that
started its job) and ends when its outcome is handed to `outcomes.py` or its lease is
handed back. In between it is in exactly one `Phase`, and every move names the phases it
may leave from (`MOVES`): a move from any other phase is a bug, refused with `WrongPhase`
before it changes anything.

    NEW ─┬─> IN_HAND ─> STARTING ─> RUNNING ─> GONE
         │      │  └──> QUEUED ─> GOING ─> GRANTED
         │      │         └──────┴────┬──> MOVING ─> IN_HAND (for an idle worker)
         │      │                     └──> WITHDRAWN
         └──────┴──────────────────────────> RUNNING

Queued attempts (`QUEUED`, `GOING`, `GRANTED`, `MOVING`, `WITHDRAWN`) are on a worker's
own queue, in the child's pipe: each leaves it when the worker says it started
(`RUNNING`) or dropped it (`GONE`, or `IN_HAND` when it was moving). Those in hand are kept
in order, best first.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING

from goqueue.supervisor.common.catalog import Catalog
from goqueue.supervisor.common.enums import KillReason, Status
from goqueue.supervisor.common.jobs import Lease

if TYPE_CHECKING:
    from goqueue.supervisor.workers.handle import Worker

SHORT = 0.05  # seconds: types whose attempts usually take less may wait in a worker's queue
GO_AHEAD = 0.05  # seconds of work ahead within which queued starts are written early
# seconds: the most usual work a worker holds (its running job included), so a job queued
# behind others waits no longer than behind 7 of the longest that may be queued (SHORT)
HELD_WORK = 8 * SHORT
SMOOTHING = 0.2  # weight of the newest attempt in a type's usual run time


class Phase(StrEnum):
    """Where an attempt is, and what is under way for it."""

    NEW = "new"  # not in the table yet
    IN_HAND = "in hand"  # claimed (or started), on no worker yet
    STARTING = "starting"  # its start being written, for an idle worker kept for it
    QUEUED = "queued"  # on a worker's queue; its start not written
    GOING = "going"  # on a worker's queue; its start being written, to let it go
    GRANTED = "granted"  # on a worker's queue; its start written, the worker told to go
    MOVING = "moving"  # being taken back from a worker's queue, for an idle worker
    WITHDRAWN = "withdrawn"  # taken back from a worker's queue: no longer ours, never to run
    RUNNING = "running"  # running on its worker
    GONE = "gone"  # out of the table: ran, or handed back


ON_A_QUEUE = frozenset({Phase.QUEUED, Phase.GOING, Phase.GRANTED, Phase.MOVING, Phase.WITHDRAWN})

# to -> the phases it may be reached from
MOVES: dict[Phase, frozenset[Phase]] = {
    Phase.NEW: frozenset(),
    Phase.IN_HAND: frozenset({Phase.NEW, Phase.STARTING, Phase.MOVING}),
    Phase.STARTING: frozenset({Phase.IN_HAND}),
    Phase.QUEUED: frozenset({Phase.IN_HAND, Phase.GOING}),
    Phase.GOING: frozenset({Phase.QUEUED}),
    Phase.GRANTED: frozenset({Phase.GOING, Phase.IN_HAND}),  # (started by its claim)
    Phase.MOVING: frozenset({Phase.QUEUED, Phase.GRANTED}),
    Phase.WITHDRAWN: frozenset({Phase.QUEUED, Phase.GOING, Phase.GRANTED, Phase.MOVING}),
    Phase.RUNNING: frozenset(
        {Phase.NEW, Phase.IN_HAND, Phase.STARTING}
        | {Phase.QUEUED, Phase.GRANTED, Phase.MOVING, Phase.WITHDRAWN}  # its worker started it
    ),
    Phase.GONE: frozenset(set(Phase) - {Phase.NEW, Phase.GONE}),
}

# the phases whose lease this node holds: extended by heartbeats, reported as held
HELD = frozenset(set(Phase) - {Phase.NEW, Phase.WITHDRAWN, Phase.GONE})


class WrongPhase(RuntimeError):
    """A move asked of an attempt from a phase it may not leave that way (a bug)."""


@dataclass(slots=True, eq=False)
class Attempt:
    """One attempt: its lease (the started one once its start is written), its worker
    while it has one, and its times (monotonic seconds)."""

    lease: Lease
    phase: Phase
    renewed: float  # when the lease was last known extended
    token: str  # its lease's token: the attempt's key (the started lease keeps it)
    type: str  # its job's type
    taken: float = 0.0  # when it was taken in hand
    window_end: float | None = None  # the end of its start's rate window, while claimed
    worker: Worker | None = None  # the worker it is queued on, runs on, or is kept for
    written: bool = False  # its start is written (its job is running in the store)
    reason: KillReason | None = None  # why it was withdrawn: no longer ours


class Attempts:
    """Every attempt this node holds, keyed by lease token, with the ones in hand in
    order and counts by phase and type kept as they move."""

    def __init__(self) -> None:
        self._by_token: dict[str, Attempt] = {}
        self.hand: deque[Attempt] = deque()  # IN_HAND, best first: `if hand` costs no call
        self._counts: dict[Phase, Counter[str]] = {phase: Counter() for phase in Phase}
        # the attempt of a token, if this node holds it (the dict's own `get`: the
        # dispatcher looks attempts up several times a job, and a method costs a frame)
        self.get: Callable[[str], Attempt | None] = self._by_token.get

    def __len__(self) -> int:
        return len(self._by_token)

    def by_type(self, phase: Phase) -> Counter[str]:
        """How many attempts of each type are in `phase` (read-only)."""
        return self._counts[phase]

    def count(self, phase: Phase) -> int:
        """How many attempts are in `phase`."""
        return sum(self._counts[phase].values())

    def held(self, recording: list[Lease]) -> list[Lease]:
        """Every lease this node holds: attempts on workers, then `recording` (finished,
        their outcome being written), attempts being started, queued on workers, then
        those in hand, in order."""
        groups: dict[Phase, list[Lease]] = {phase: [] for phase in HELD}
        for attempt in self._by_token.values():
            if attempt.phase in HELD:
                groups[attempt.phase].append(attempt.lease)
        queued = (Phase.QUEUED, Phase.GOING, Phase.GRANTED, Phase.MOVING)
        return [
            *groups[Phase.RUNNING],
            *recording,
            *groups[Phase.STARTING],
            *(lease for phase in queued for lease in groups[phase]),
            *(attempt.lease for attempt in self.hand),
        ]

    def oldest_due(self) -> datetime | None:
        """When the job of the longest-waiting attempt claimed and not started (in hand,
        or queued on a worker) was due; None with none."""
        waiting = (Phase.IN_HAND, Phase.QUEUED, Phase.GOING, Phase.GRANTED, Phase.MOVING)
        dues = [a.lease.job.run_at for a in self._by_token.values() if a.phase in waiting]
        return min(dues) if dues else None

    # -- moves -----------------------------------------------------------------------

    def add(
        self,
        lease: Lease,
        phase: Phase,
        renewed: float,
        *,
        window_end: float | None = None,
        worker: Worker | None = None,
        first: bool = False,
    ) -> Attempt:
        """A lease that came back from the store, in hand (`first`: ahead of the others)
        or running on `worker` (its start written by the claim or the enqueue)."""
        if Phase.NEW not in MOVES[phase]:  # (into hand, or running)
            raise WrongPhase(f"attempt of job {lease.job.id}: {Phase.NEW} -> {phase}")
        token, job_type = lease.token, lease.job.type
        attempt = Attempt(lease, phase, renewed, token, job_type, renewed)
        attempt.written = lease.job.status == Status.RUNNING
        self._by_token[token] = attempt
        counts = self._counts[phase]
        counts[job_type] = counts.get(job_type, 0) + 1  # (a Counter's `+=` costs a call)
        if phase is Phase.IN_HAND:
            attempt.window_end = None if attempt.written else window_end
            if first:
                self.hand.appendleft(attempt)
            else:
                self.hand.append(attempt)
        else:
            attempt.worker = worker
        return attempt

    def move(
        self,
        attempt: Attempt,
        to: Phase,
        *,
        worker: Worker | None = None,
        window_end: float | None = None,
        first: bool = False,
    ) -> None:
        """Move `attempt` to `to`, from a phase `MOVES` allows. Into hand it goes last
        (`first`: ahead of the others, a lease put back), with `window_end` kept while it
        is merely claimed; onto a worker it takes `worker`."""
        came = attempt.phase
        if came not in MOVES[to]:
            raise WrongPhase(f"attempt of job {attempt.lease.job.id}: {came} -> {to}")
        job_type, token = attempt.type, attempt.token
        counts = self._counts[came]
        left = counts[job_type] - 1
        if left > 0:
            counts[job_type] = left
        else:
            del counts[job_type]
        if came is Phase.IN_HAND:
            self.hand.remove(attempt)
        attempt.phase = to
        by_token = self._by_token
        del by_token[token]  # re-added last: each phase in order of entry
        if to is Phase.GONE:
            return
        by_token[token] = attempt
        counts = self._counts[to]
        counts[job_type] = counts.get(job_type, 0) + 1
        if to is Phase.IN_HAND:
            attempt.worker = None
            attempt.window_end = None if attempt.written else window_end
            if came is not Phase.NEW:
                attempt.taken = attempt.renewed
            if first:
                self.hand.appendleft(attempt)
            else:
                self.hand.append(attempt)
        elif worker is not None:
            attempt.worker = worker
        if to is Phase.GRANTED:
            attempt.written = True

    def withdraw(self, attempt: Attempt, reason: KillReason) -> None:
        """Take `attempt` back from its worker's queue: no longer ours, for `reason`."""
        self.move(attempt, Phase.WITHDRAWN)
        attempt.reason = reason

    def started(self, attempt: Attempt, lease: Lease) -> None:
        """The store started `attempt`'s job: `lease` is the started lease."""
        attempt.lease = lease
        attempt.written = True

    def renew(self, leases: list[Lease], at: float) -> None:
        """The store extended `leases` as of `at`."""
        for lease in leases:
            attempt = self._by_token.get(lease.token)
            if attempt is not None:
                attempt.renewed = max(at, attempt.renewed)

    def next_for(self, types: frozenset[str]) -> Attempt | None:
        """The attempt in hand a worker that runs `types` should take: the best already
        started first, else the best."""
        first = None
        for attempt in self.hand:
            if attempt.type in types:
                if attempt.written:
                    return attempt
                if first is None:
                    first = attempt
        return first


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

    def held_at_most(self, job_type: str) -> int:
        """How many attempts a worker whose jobs are of `job_type` should hold, its
        running one included: as many as usually take `HELD_WORK` seconds (one for a type
        not seen run yet). Quick jobs go deep, and each claim takes more of them."""
        return max(1, int(HELD_WORK / max(self.expected(job_type), 1e-6)))

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
