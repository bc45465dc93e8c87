"""The SQLite claim's walk of a type with a per-key rule (`common/flow.py`): its keys'
claimed and running jobs counted on their own small index, its pending keys found by
skipping along `jobs_key_due`, and each key with room (its limit, its pace) read from its
head in claim order, so a key that may start nothing costs one probe and never holds up
another key."""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from typing import Any

from goqueue.supervisor.common.flow import KeyTurns
from goqueue.supervisor.store.base import MAX_KEY_HOLDS
from goqueue.supervisor.store.sqlite.rows import COLUMNS

# The first pending jobs of a keyed type looked at for jobs without a key: a type under a
# per-key limit is walked key by key, and its jobs without one are the exception.
PLAIN_WINDOW = 512

Hit = tuple[int, int, float, int, tuple[Any, ...]]  # (-priority, turn, run_at, seq, columns)

_BUSY = (
    "SELECT concurrency_key, count(*) FROM jobs INDEXED BY jobs_key_busy"
    " WHERE status IN ('claimed', 'running') AND concurrency_key IS NOT NULL AND type = ?"
    " GROUP BY concurrency_key"
)
_KEYS = """WITH RECURSIVE k(key) AS (
    SELECT min(concurrency_key) FROM jobs INDEXED BY jobs_key_due
    WHERE status = 'pending' AND concurrency_key IS NOT NULL AND type = ?1
    UNION ALL
    SELECT (SELECT min(j.concurrency_key) FROM jobs AS j INDEXED BY jobs_key_due
            WHERE j.status = 'pending' AND j.concurrency_key IS NOT NULL AND j.type = ?1
              AND j.concurrency_key > k.key)
    FROM k WHERE k.key IS NOT NULL)
SELECT key FROM k WHERE key IS NOT NULL"""


def busy(conn: sqlite3.Connection, job_type: str) -> dict[str, int]:
    """The claimed and running jobs of each key of `job_type`."""
    return dict(conn.execute(_BUSY, (job_type,)).fetchall())


def keyed_due(
    conn: sqlite3.Connection,
    job_type: str,
    take: int,
    turns: KeyTurns,
    now: float,
    where: str,
    params: list[Any],
) -> list[Hit]:
    """The best `take` due jobs of `job_type`, no key beyond its room in this claim
    (`turns`: its limit less its claimed and running jobs, its paced starts), in claim
    order: priority, then the key's turn, then run_at, then enqueue order."""
    for key, count in busy(conn, job_type).items():
        turns.busy[(job_type, key)] = count
    hits: list[Hit] = []
    for key in [row[0] for row in conn.execute(_KEYS, (job_type,))]:
        room = min(turns.room_of(job_type, key), take)
        if room <= 0:
            continue
        busy_now = turns.busy.get((job_type, key), 0)
        found = conn.execute(
            f"SELECT priority, run_at, seq, {COLUMNS} FROM jobs INDEXED BY jobs_key_due"
            " WHERE status = 'pending' AND concurrency_key IS NOT NULL AND type = ?"
            f" AND concurrency_key = ? AND run_at <= ?{where}"
            " ORDER BY priority DESC, run_at, seq LIMIT ?",
            (job_type, key, now, *params, room),
        )
        hits.extend((-hit[0], busy_now + i, hit[1], hit[2], hit[3:]) for i, hit in enumerate(found))
    plain = conn.execute(
        f"SELECT priority, run_at, seq, {COLUMNS} FROM ("
        f" SELECT * FROM jobs INDEXED BY jobs_due"
        f" WHERE status = 'pending' AND type = ? AND run_at <= ?{where}"
        " ORDER BY priority DESC, run_at, seq LIMIT ?)"
        " WHERE concurrency_key IS NULL ORDER BY priority DESC, run_at, seq LIMIT ?",
        (job_type, now, *params, PLAIN_WINDOW, take),
    )
    hits.extend((-hit[0], 0, hit[1], hit[2], hit[3:]) for hit in plain)
    hits.sort(key=lambda hit: hit[:4])
    return hits[:take]


def holds(
    conn: sqlite3.Connection, limits: Mapping[str, int], now: float
) -> list[tuple[str, str, int, int]]:
    """The keys at their limit, with their due pending jobs (`Store.key_holds`)."""
    out: list[tuple[str, str, int, int]] = []
    for job_type, limit in sorted(limits.items()):
        for key, running in busy(conn, job_type).items():
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
