"""The SQLite claim's walk of a type's jobs (`common/flow.py`): its jobs without a key in
claim order, and its keys in turn. Its keys' claimed and running jobs are counted in
memory as rows are written (`KeysBusy`), its pending keys found by skipping along
`jobs_key_due` from the type's cursor (the last key a claim took) round to it, and each
key with room (its limit, its pace, if the type has them) read from its head in claim
order, up to a window of keys with room and a job due: a key that may start nothing
never holds up another key, and a claim costs a window of keys, not every key. The keys
are read ahead over many claims (`KeysAhead`), and the window's jobs come in one
statement, most of the time."""

from __future__ import annotations

import heapq
import sqlite3
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from goqueue.supervisor.common.enums import Status
from goqueue.supervisor.common.flow import KeyTurns, key_window
from goqueue.supervisor.common.jobs import Job
from goqueue.supervisor.store.base import MAX_KEY_HOLDS
from goqueue.supervisor.store.sqlite.rows import COLUMNS

_PLAIN = "status = 'pending' AND type = :type AND (concurrency_key IS NOT NULL) = 0"
_KEYED = "status = 'pending' AND concurrency_key IS NOT NULL AND type = :type"


def _queues_cte(index: str, rows: str) -> str:
    """`q(queue)`: the queues of the `rows` of a type, in order, skipping along `index`
    (each step an index probe for the next queue)."""
    return (
        f"q(queue) AS (SELECT (SELECT min(queue) FROM jobs INDEXED BY {index} WHERE {rows})"
        f" UNION ALL SELECT (SELECT min(queue) FROM jobs INDEXED BY {index}"
        f" WHERE {rows} AND queue > q.queue) FROM q WHERE q.queue IS NOT NULL)"
    )


# The (queue, priority) pairs of a type's pending jobs without a key, in index order: one
# statement that skips along `jobs_due` to each queue, then down its priorities.
_HEADS_OF = (
    f"WITH RECURSIVE {_queues_cte('jobs_due', _PLAIN)},"
    " p(queue, priority) AS ("
    f" SELECT q.queue, (SELECT max(priority) FROM jobs INDEXED BY jobs_due WHERE {_PLAIN}"
    "  AND queue = q.queue) FROM q WHERE q.queue IS NOT NULL"
    f" UNION ALL SELECT p.queue, (SELECT max(priority) FROM jobs INDEXED BY jobs_due"
    f"  WHERE {_PLAIN} AND queue = p.queue AND priority < p.priority)"
    "  FROM p WHERE p.priority IS NOT NULL)"
    " SELECT queue, priority FROM p WHERE priority IS NOT NULL"
)

# One queue's best due jobs of a type without a key at one priority, in claim order, on
# `jobs_due`: one arm of `plain_due`'s statement. With the priority fixed, `run_at` is a
# range of the index: the jobs scheduled later are never walked.
_PLAIN_DUE = (
    f"SELECT * FROM (SELECT priority, run_at, seq, {COLUMNS} FROM jobs INDEXED BY jobs_due"
    " WHERE status = 'pending' AND type = ? AND (concurrency_key IS NOT NULL) = 0"
    " AND queue = ? AND priority = ? AND run_at <= ? ORDER BY run_at, seq LIMIT ?)"
)

# A key's first due jobs (its room of them) in claim order, with the key's place in the
# window: one arm of `_heads`' statement.
_HEAD = (
    "SELECT * FROM (SELECT ? AS place, priority, run_at, seq"
    " FROM jobs INDEXED BY jobs_key_due"
    " WHERE status = 'pending' AND concurrency_key IS NOT NULL AND type = ?"
    " AND concurrency_key = ? AND run_at <= ?{where}"
    " ORDER BY priority DESC, run_at, seq LIMIT ?)"
)

Hit = tuple[int, int, int, float, int, tuple[Any, ...]]
# (-priority, turn, place in the window of keys, run_at, seq, columns)

# Every key's claimed and running jobs, from the leased rows (few rows, the attempts in
# flight, found by their status)
_BUSY = (
    "SELECT type, concurrency_key, count(*) FROM jobs INDEXED BY jobs_status"
    " WHERE status IN ('claimed', 'running') AND concurrency_key IS NOT NULL"
    " GROUP BY type, concurrency_key"
)
_BUSY_STATUSES = frozenset({Status.CLAIMED, Status.RUNNING})


def _keys_after(index: str, rows: str) -> str:
    """The type's pending keys (of the `rows`) after `:after`, in key order, `:most` at
    most: one statement that skips along `index`, each step an index probe for the next
    key."""
    step = f"SELECT min(concurrency_key) FROM jobs INDEXED BY {index} WHERE {rows}"
    return (
        f"WITH RECURSIVE k(key, n) AS (SELECT ({step} AND concurrency_key > :after), 1"
        f" UNION ALL SELECT ({step} AND concurrency_key > k.key), k.n + 1"
        " FROM k WHERE k.key IS NOT NULL AND k.n < :most)"
        " SELECT key FROM k WHERE key IS NOT NULL"
    )


_KEYS_AFTER = _keys_after("jobs_key_due", _KEYED)
# ... of one queue, on `jobs_key_queue`
_KEYS_AFTER_IN = _keys_after("jobs_key_queue", _KEYED + " AND queue = :queue")
# The queues holding a type's pending keyed jobs, in order, on `jobs_key_queue`.
_KEY_QUEUES = (
    f"WITH RECURSIVE {_queues_cte('jobs_key_queue', _KEYED)}"
    " SELECT queue FROM q WHERE queue IS NOT NULL"
)
Walked = tuple[str, ...] | None  # the queues a claim's key walk reads (None: all)


class KeysBusy:
    """Each key's claimed and running jobs, by type, as the file holds them: read from its
    leased rows when first asked, then kept as keyed rows are written (the store is the
    file's only writer), so a claim reads no index for them and no write keeps one.
    Read again after any call or commit was undone (`undone`, the file's count of
    them): what such a call changed was undone in the file, not here."""

    def __init__(self, undone: Callable[[], int]) -> None:
        self.undone = undone
        self._by_type: dict[str, dict[str, int]] | None = None
        self._as_of = -1  # `undone` when read

    def of(self, conn: sqlite3.Connection, job_type: str) -> Mapping[str, int]:
        """The claimed and running jobs of each key of `job_type` (keys with none left out)."""
        return self._known(conn).get(job_type, {})

    def _known(self, conn: sqlite3.Connection) -> dict[str, dict[str, int]]:
        known, undone = self._by_type, self.undone()
        if known is None or self._as_of != undone:
            known = self._by_type = {}
            for job_type, key, count in conn.execute(_BUSY):
                known.setdefault(job_type, {})[key] = count
            self._as_of = undone
        return known

    def moved(self, job: Job, was: Status | None) -> None:
        """A keyed row was written, its status `was` in the file before (None: new)."""
        known = self._by_type
        if known is None:
            return  # read from the file when first asked
        before, after = was in _BUSY_STATUSES, job.status in _BUSY_STATUSES
        if before == after:
            return
        assert job.concurrency_key is not None
        keys = known.setdefault(job.type, {})
        count = keys.get(job.concurrency_key, 0) + (1 if after else -1)
        if count > 0:
            keys[job.concurrency_key] = count
        else:
            keys.pop(job.concurrency_key, None)


class Keys:
    """What the claim keeps of keyed jobs between calls: each type's keys read ahead
    (`ahead`) and each key's claimed and running jobs (`busy`); told of every keyed
    row written."""

    def __init__(self, undone: Callable[[], int]) -> None:
        self.ahead = KeysAhead()
        self.busy = KeysBusy(undone)

    def wrote(self, job: Job, was: Status | None) -> None:
        """A row of `job` (with a key) was written, its status `was` in the file before."""
        self.ahead.stir(job.type)
        self.busy.moved(job, was)


class KeysAhead:
    """Each keyed type's pending keys in turn, read ahead `step` at a time and used over
    several claims (the store is the file's only writer: nothing else takes keys). A lap
    runs from the key after the cursor it began at, round to that cursor; each claim
    passes the keys up to the type's cursor (the last key the claim before took). A key
    first enqueued between keys already read waits for the next lap; a key whose jobs
    went has none due and is passed over."""

    def __init__(self, step: int = 128) -> None:
        self.step = step
        self._laps: dict[str, _Lap] = {}
        self._quiet: set[str] = set()  # types a whole lap found no pending key of

    def quiet(self, job_type: str) -> bool:
        """True when no job of `job_type` with a key is pending, as far as is known: no
        lap needs reading."""
        return job_type in self._quiet

    def stir(self, job_type: str) -> None:
        """A job of `job_type` with a key was written: its keys need reading again."""
        self._quiet.discard(job_type)

    def keys(
        self, conn: sqlite3.Connection, job_type: str, cursor: str, walked: Walked = None
    ) -> Iterator[str]:
        """The type's keys in turn after `cursor`, each once, for one claim: those with a
        job pending in the `walked` queues (None: in any)."""
        lap = self._laps.get(job_type)
        fresh = lap is None or lap.walked != walked or not lap.move_to(cursor)
        if lap is None or fresh:
            lap = self._laps[job_type] = _Lap(cursor, walked)
        seen: set[str] = set()
        i = 0
        while True:
            if i == len(lap.ahead) and not lap.read(conn, job_type, self.step):
                if fresh:
                    if not seen and walked is None:
                        self._quiet.add(job_type)  # no key at all, in any queue
                    return  # a whole lap read in this claim: every key was offered
                lap = self._laps[job_type] = _Lap(cursor, walked)  # the next lap
                fresh, i = True, 0
                continue
            key = lap.ahead[i]
            i += 1
            if key not in seen:
                seen.add(key)
                yield key


class _Lap:
    """One lap of a type's keys: the keys read and not yet passed, in turn."""

    def __init__(self, start: str, walked: Walked = None) -> None:
        self.start = start  # the cursor the lap began at: it ends there
        self.walked = walked  # the queues whose keys it reads (None: every queue)
        self.at = start  # the cursor the keys ahead follow
        self.ahead: list[str] = []
        self.last = start  # the last key read
        self.wrapped = False  # every key after `start` read: reading from the first
        self.over = False

    def move_to(self, cursor: str) -> bool:
        """Pass the keys up to `cursor` (the claims took keys up to it); False when it
        is not one of the keys ahead."""
        if cursor == self.at:
            return True
        if cursor not in self.ahead:
            return False
        del self.ahead[: self.ahead.index(cursor) + 1]
        self.at = cursor
        return True

    def read(self, conn: sqlite3.Connection, job_type: str, step: int) -> bool:
        """Read the lap's next `step` keys at most; False when it is over."""
        if self.over:
            return False
        keys = self._after(conn, job_type, self.last, step)
        if not keys and not self.wrapped:
            self.wrapped, self.last = True, ""
            keys = self._after(conn, job_type, "", step)
        if self.wrapped and keys and keys[-1] > self.start:
            keys = [k for k in keys if k <= self.start]
            self.over = True
        if not keys:
            self.over = True
            return False
        self.ahead += keys
        self.last = keys[-1]
        return True

    def _after(self, conn: sqlite3.Connection, job_type: str, after: str, most: int) -> list[str]:
        """The first `most` keys after `after` with a job pending in the walked queues:
        each queue's first `most`, merged."""
        args = {"type": job_type, "after": after, "most": most}
        if self.walked is None:
            return [k for (k,) in conn.execute(_KEYS_AFTER, args)]
        found: set[str] = set()
        for queue in self.walked:
            found.update(k for (k,) in conn.execute(_KEYS_AFTER_IN, args | {"queue": queue}))
        return sorted(found)[:most]


def keyed_due(
    conn: sqlite3.Connection,
    job_type: str,
    take: int,
    turns: KeyTurns,
    keys: Keys,
    now: float,
    takes: Callable[[str], bool] | None,
    where: str,
    params: list[Any],
) -> list[Hit]:
    """The best `take` due jobs of `job_type` in the queues the claim `takes` from (None:
    every queue), no key beyond its room in this claim (`turns`: its limit less its
    claimed and running jobs, its paced starts), in claim order: priority, then the
    key's turn, then run_at, then enqueue order. (`where` and `params` say the same of
    the queues in SQL.) Only the keys with a job pending in those queues are walked."""
    hits = plain_due(conn, job_type, take, now, takes)
    ahead = keys.ahead
    if ahead.quiet(job_type):
        return hits  # no key pending: no key to walk
    for key, count in keys.busy.of(conn, job_type).items():
        turns.busy[(job_type, key)] = count
    window = key_window(take)
    cursor = turns.cursors.get(job_type, "")
    heads: list[tuple[int, int, int, float, int]] = []  # (-priority, turn, place, run_at, seq)
    batch: list[tuple[int, str, int]] = []  # keys with room: (place, key, room)
    found = 0  # keys of the window: keys with room and a job due in the queues served
    place = 0
    # keys read ahead over claims, then one statement of jobs for most windows; keys
    # with nothing due (later jobs, paused queues) do not count
    walked = None
    if takes is not None:
        walked = tuple(q for (q,) in conn.execute(_KEY_QUEUES, {"type": job_type}) if takes(q))
    for key in ahead.keys(conn, job_type, cursor, walked):
        room = min(turns.room_of(job_type, key), take)
        if room <= 0:
            continue
        place += 1
        turns.places[(job_type, key)] = place
        batch.append((place, key, room))
        if len(batch) >= window - found:
            found += _heads(conn, job_type, batch, turns, now, where, params, heads)
            batch = []
            if found >= window:
                break
    if batch:
        _heads(conn, job_type, batch, turns, now, where, params, heads)
    # the keyed jobs that may be taken, whole rows now: at most `take`, by seq (the rowid)
    taken = heapq.nsmallest(take, [*heads, *(hit[:5] for hit in hits)])
    wanted = {order[4]: order for order in taken if order[2]}  # keyed ones have a place
    if wanted:
        rows = conn.execute(
            f"SELECT seq, {COLUMNS} FROM jobs WHERE seq IN ({', '.join('?' * len(wanted))})",
            list(wanted),
        )
        hits.extend((*wanted[row[0]], row[1:]) for row in rows)
    hits.sort(key=lambda hit: hit[:5])
    return hits[:take]


def plain_due(
    conn: sqlite3.Connection,
    job_type: str,
    take: int,
    now: float,
    takes: Callable[[str], bool] | None,
) -> list[Hit]:
    """The best `take` due jobs of `job_type` without a key, in claim order, in one
    statement: each queue the claim `takes` from (None: every queue) read from the head
    of each of its priorities, so neither the backlog of a queue it does not take from
    (a paused one) nor jobs scheduled for later are walked."""
    heads = [
        (queue, priority)
        for queue, priority in conn.execute(_HEADS_OF, {"type": job_type})
        if takes is None or takes(queue)
    ]
    if not heads:
        return []
    args: list[Any] = []
    for queue, priority in heads:
        args += [job_type, queue, priority, now, take]
    sql = " UNION ALL ".join([_PLAIN_DUE] * len(heads))
    if len(heads) > 1:
        sql += " ORDER BY 1 DESC, 2, 3 LIMIT ?"
        args.append(take)
    return [(-hit[0], 0, 0, hit[1], hit[2], hit[3:]) for hit in conn.execute(sql, args)]


def _heads(
    conn: sqlite3.Connection,
    job_type: str,
    batch: list[tuple[int, str, int]],
    turns: KeyTurns,
    now: float,
    where: str,
    params: list[Any],
    heads: list[tuple[int, int, int, float, int]],
) -> int:
    """Each key's room of due jobs from its head into `heads`, with its claim order (one
    statement for the batch; the rows of those taken are read after); how many keys had
    one."""
    head = _HEAD.format(where=where)
    args: list[Any] = []
    keys: dict[int, str] = {}
    for place, key, room in batch:
        args += [place, job_type, key, now, *params, room]
        keys[place] = key
    found = conn.execute(" UNION ALL ".join([head] * len(batch)), args).fetchall()
    found.sort(key=lambda hit: (hit[0], -hit[1], hit[2], hit[3]))  # by key, in order
    turn: dict[int, int] = {}  # the next turn of each key, by place
    for place, priority, run_at, seq in found:
        n = turn.get(place, turns.busy.get((job_type, keys[place]), 0))
        turn[place] = n + 1
        heads.append((-priority, n, place, run_at, seq))
    return len(turn)


def holds(
    conn: sqlite3.Connection, busy: KeysBusy, limits: Mapping[str, int], now: float
) -> list[tuple[str, str, int, int]]:
    """The keys at their limit, with their due pending jobs (`Store.key_holds`)."""
    out: list[tuple[str, str, int, int]] = []
    for job_type, limit in sorted(limits.items()):
        for key, running in sorted(busy.of(conn, job_type).items()):
            if running < limit:
                continue
            (waiting,) = conn.execute(
                "SELECT count(*) FROM jobs INDEXED BY jobs_key_due"
                " WHERE status = 'pending' AND concurrency_key IS NOT NULL AND type = ?"
                " AND concurrency_key = ? AND run_at <= ?",
                (job_type, key, now),
            ).fetchone()
            out.append((job_type, key, running, int(waiting)))
            if len(out) >= MAX_KEY_HOLDS:
                return out
    return out
