"""Pruning the SQLite store: finished jobs older than the retention go, a chunk per
transaction, with their trails and the workflows left with no step; expired keys go too,
and free pages go back to the filesystem a few at a time."""

from __future__ import annotations

import sqlite3
from datetime import datetime
from functools import partial

from goqueue.supervisor.store.sqlite import steps
from goqueue.supervisor.store.sqlite.calls import Write
from goqueue.supervisor.store.sqlite.outbox import SqliteOutboxRows
from goqueue.supervisor.store.sqlite.rows import add_count
from goqueue.supervisor.store.sqlite.rules import Tx

PRUNE_CHUNK = 500  # rows deleted per transaction: a prune never holds the loop long
VACUUM_PAGES = 1000  # at most ~4 MB given back per prune chunk


async def prune(
    write: Write, outbox: SqliteOutboxRows, finished_before: datetime, limit: int
) -> int:
    """Delete up to `limit` finished jobs that finished before `finished_before`, with
    their trails (and workflows none of whose steps is left), oldest first, a chunk
    per transaction; expired keys go too, and free pages go back to the disk."""
    cutoff = finished_before.timestamp()
    pruned = 0
    while pruned < limit:
        chunk = min(PRUNE_CHUNK, limit - pruned)
        deleted = await write(partial(_prune_chunk, cutoff=cutoff, limit=chunk))
        pruned += deleted
        if deleted < chunk:
            break
    await write(_forget_expired)
    await outbox.prune(finished_before)
    if pruned:
        await write(lambda tx: _vacuum_a_little(tx.conn))
    return pruned


def _prune_chunk(tx: Tx, *, cutoff: float, limit: int) -> int:
    """Delete up to `limit` jobs finished before `cutoff`; drop the workflows left with
    no step."""
    rows = tx.conn.execute(
        "SELECT seq, workflow_id, queue, type, priority, status FROM jobs"
        " WHERE finished_at < ? ORDER BY finished_at LIMIT ?",
        (cutoff, limit),
    ).fetchall()
    if not rows:
        return 0
    tx.conn.executemany("DELETE FROM jobs WHERE seq = ?", [(row[0],) for row in rows])
    for _, _, *group in rows:
        add_count(tx.counts, tuple(group), -1)
    for workflow_id in {row[1] for row in rows if row[1] is not None}:
        left = tx.conn.execute(
            "SELECT 1 FROM jobs WHERE workflow_id = ? LIMIT 1", (workflow_id,)
        ).fetchone()
        if left is not None:
            tx.flows.add(workflow_id)  # a step pruned was done: its status may move
            continue
        flow = steps.flow(tx, workflow_id)
        if flow is not None:
            ids = [(job_id, job_id) for job_id in flow.steps.values()]
            tx.conn.executemany(
                "DELETE FROM workflow_edges WHERE parent_id = ? OR child_id = ?", ids
            )
            tx.conn.execute("DELETE FROM workflows WHERE id = ?", (workflow_id,))
    return len(rows)


def _forget_expired(tx: Tx) -> None:
    """Expired dedupe and idempotency keys, and emptied count groups, go."""
    tx.conn.execute(
        "DELETE FROM job_keys WHERE rowid IN"
        " (SELECT rowid FROM job_keys WHERE expires < ? LIMIT 10000)",
        (tx.ts,),
    )
    tx.conn.execute("DELETE FROM job_counts WHERE n = 0")


def _vacuum_a_little(conn: sqlite3.Connection) -> None:
    """Give free pages back to the filesystem, a bounded number at a time, so the file
    does not keep the size of its busiest hour. One page per statement: the pragma frees
    a page per step, and Python's sqlite3 steps a statement that returns no row once."""
    (free,) = conn.execute("PRAGMA freelist_count").fetchone()
    for _ in range(min(free, VACUUM_PAGES)):
        conn.execute("PRAGMA incremental_vacuum(1)")
