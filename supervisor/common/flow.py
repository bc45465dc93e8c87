"""Flow control by key, the rules every store's claim applies (`docs/guide/flow-control.md`).

A job may carry a `concurrency_key`. For a type with a per-key limit (`key_concurrency`),
at most that many of its jobs sharing a key are claimed or running at once; with a
per-key rate (`key_rate_limit`), each key's starts are paced by GCRA as a type's are by
`rate_limit` (`rates.py`). A type with either rule has its keys take turns: among due
jobs of one priority, the job whose key has the fewest claimed or running jobs goes first
(then the oldest `run_at`, then enqueue order), so a key with a long backlog never holds
up a key with a short one, and one key's jobs start in enqueue order. A job without a key
is a key of its own, with nothing running and no pace. Types with neither rule ignore
keys when claiming.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from typing import NamedTuple

import msgspec
from goqueue.supervisor.common.rates import Rate, grant

KeyOf = tuple[str, str]  # (type, concurrency_key)
MAX_ROOM = 1 << 30  # a key's room with no limit


class PaceWas(NamedTuple):
    """A paced key's TAT before a claim moved it (None: the key was not kept)."""

    key: KeyOf
    tat: float | None
    spent: float | None


class KeyPace:
    """Each paced key's TAT (GCRA, `rates.py`), in one process (the embedded stores';
    PostgreSQL keeps them in a table). A key whose TAT is a whole period past may start
    its whole burst again, as a key never seen: such entries are forgotten."""

    def __init__(self) -> None:
        self._tat: dict[KeyOf, float] = {}
        self._spent: dict[KeyOf, float] = {}  # when each entry may be forgotten
        self.blocked_until: float | None = None  # the earliest TAT a claim waited for

    def starts(self, key: KeyOf, rate: Rate, now: float) -> int:
        """How many starts `key` may make at `now` (0 while its TAT is ahead)."""
        taken = grant(self._tat.get(key, 0.0), rate, rate.limit, now)
        if not taken.granted:
            self._look_out(now + taken.seconds_left, now)
        return taken.granted

    def took(self, key: KeyOf, rate: Rate, count: int, now: float) -> PaceWas:
        """`count` jobs of `key` started at `now` (it had that many starts); its next
        start is looked out for (it may have more jobs waiting). Returns what `put_back`
        needs to undo it."""
        was = PaceWas(key, self._tat.get(key), self._spent.get(key))
        tat = self._tat[key] = grant(self._tat.get(key, 0.0), rate, count, now).tat
        self._spent[key] = tat + rate.period
        self._look_out(tat, now)
        if len(self._tat) > 1024:
            self._forget(now)
        return was

    def put_back(self, was: PaceWas) -> None:
        """Undo a `took` whose claim was not made (its transaction failed)."""
        if was.tat is None or was.spent is None:
            self._tat.pop(was.key, None)
            self._spent.pop(was.key, None)
        else:
            self._tat[was.key], self._spent[was.key] = was.tat, was.spent

    def _look_out(self, at: float, now: float) -> None:
        """A key may start again `at`: the earliest such time still ahead is kept."""
        held = self.blocked_until
        if at > now and (held is None or held <= now or at < held):
            self.blocked_until = at

    def due(self, now: float) -> float | None:
        """When a key a claim held back may start again. A time already past is answered
        once (the claim since may have been quicker than it), then forgotten: the claim
        it wakes looks out for the keys still held back."""
        due = self.blocked_until
        if due is not None and due <= now:
            self.blocked_until = None
        return due

    def _forget(self, now: float) -> None:
        for key in [key for key, at in self._spent.items() if at <= now]:
            del self._tat[key], self._spent[key]


def key_window(take: int) -> int:
    """How many keys with room a claim of `take` jobs of a type looks at, at most, in the
    embedded stores: each key costs a look, so a claim walks a window of keys, not all
    of them, and the few beyond `take` let a higher priority among them go first. (On
    PostgreSQL, `KEY_WINDOW` is wider: other nodes may be taking some of its keys.)"""
    return take + 4


class KeyTurns:
    """The turns of keys in one claim at `now`: `busy` holds the claimed and running jobs
    of each (type, key) before it, `limits` the per-key limit of each type that has one,
    `rates` the per-key rate; each job the claim takes is `take`n, and `settle` moves
    the paced keys' TATs on once the claim is made."""

    __slots__ = (
        "busy",
        "cursors",
        "cursors_were",
        "held",
        "limits",
        "now",
        "pace",
        "paced",
        "places",
        "rates",
        "room",
        "taken",
    )

    def __init__(
        self,
        limits: Mapping[str, int],
        busy: dict[KeyOf, int],
        rates: Mapping[str, Rate] | None = None,
        pace: KeyPace | None = None,
        now: float = 0.0,
        cursors: dict[str, str] | None = None,
    ) -> None:
        self.limits = limits
        self.busy = busy
        self.rates = rates or {}
        self.pace = pace or KeyPace()
        self.now = now
        self.taken: Counter[KeyOf] = Counter()
        self.room: dict[KeyOf, int] = {}  # the starts each paced key has in this claim
        self.held: set[str] = set()  # the types with a key held back (limit or pace)
        # where each type takes keys up again (after the last key a claim took), and each
        # key's place in this claim's window (`settle` moves the cursors on)
        self.cursors = {} if cursors is None else cursors
        self.places: dict[KeyOf, int] = {}
        self.paced: list[PaceWas] = []  # the TATs `settle` moved, as they were
        self.cursors_were: dict[str, str | None] = {}  # the cursors it moved, as they were

    def turn(self, job_type: str, key: str | None) -> int | None:
        """How many jobs of `key` are claimed or running (its place in the turns: fewer
        goes first), or None when the key may start no more now (at its limit, or its
        pace not due). 0 for a job without a key."""
        if key is None:
            return 0
        if self.room_of(job_type, key) <= 0:
            return None
        of = (job_type, key)
        return self.busy.get(of, 0) + self.taken[of]

    def room_of(self, job_type: str, key: str) -> int:
        """How many more jobs of `key` this claim may take (its type's per-key limit
        and pace, if it has them)."""
        of = (job_type, key)
        taken = self.taken[of]
        room = MAX_ROOM
        limit = self.limits.get(job_type)
        if limit is not None:
            room = limit - self.busy.get(of, 0) - taken
        rate = self.rates.get(job_type)
        if rate is not None and room > 0:
            starts = self.room.get(of)
            if starts is None:
                starts = self.room[of] = self.pace.starts(of, rate, self.now)
            room = min(room, starts - taken)
        if room <= 0:
            self.held.add(job_type)
            return 0
        return room

    def take(self, job_type: str, key: str | None) -> None:
        """The claim took a job of `key`."""
        if key is not None:
            self.taken[(job_type, key)] += 1

    def settle(self) -> None:
        """The claim is made: the paced keys it took jobs of move their TAT on, and each
        type's cursor moves to the last key of its window it took jobs of."""
        last: dict[str, tuple[int, str]] = {}
        for (job_type, key), count in self.taken.items():
            rate = self.rates.get(job_type)
            if rate is not None and count:
                self.paced.append(self.pace.took((job_type, key), rate, count, self.now))
            place = self.places.get((job_type, key))
            if count and place is not None and place > last.get(job_type, (0, ""))[0]:
                last[job_type] = (place, key)
        for job_type, (_, key) in last.items():
            self.cursors_were.setdefault(job_type, self.cursors.get(job_type))
            self.cursors[job_type] = key

    def undo(self) -> None:
        """The claim was not made after all (its transaction failed): the paced keys'
        TATs and the cursors go back to where they were before `settle`."""
        for was in reversed(self.paced):
            self.pace.put_back(was)
        for job_type, key in self.cursors_were.items():
            if key is None:
                self.cursors.pop(job_type, None)
            else:
                self.cursors[job_type] = key
        self.paced, self.cursors_were = [], {}


class KeyHold(msgspec.Struct):
    """A key at its type's `key_concurrency`: its claimed and running jobs, and its
    pending jobs waiting behind them."""

    key: str
    running: int
    waiting: int


class TypeKeys(msgspec.Struct):
    """A type with a per-key limit: its limit, how many keys are at it, the jobs waiting
    on those keys, and the keys with the most waiting (at most `KEYS_SHOWN`)."""

    type: str
    key_concurrency: int
    keys_at_limit: int
    waiting: int
    keys: list[KeyHold]


KEYS_SHOWN = 20  # the keys at their limit a type's summary names


def type_keys(
    limits: Mapping[str, int], held: Iterable[tuple[str, str, int, int]]
) -> list[TypeKeys]:
    """Per type with a per-key limit (by name), from its keys' (type, key, running,
    waiting), those at their limit summed up, the ones with the most waiting named."""
    at_limit: dict[str, list[KeyHold]] = defaultdict(list)
    for job_type, key, running, waiting in held:
        limit = limits.get(job_type)
        if limit is not None and running >= limit:
            at_limit[job_type].append(KeyHold(key, running, waiting))
    out = []
    for job_type in sorted(limits):
        keys = sorted(at_limit.get(job_type, ()), key=lambda k: (-k.waiting, k.key))
        waiting = sum(k.waiting for k in keys)
        out.append(TypeKeys(job_type, limits[job_type], len(keys), waiting, keys[:KEYS_SHOWN]))
    return out
