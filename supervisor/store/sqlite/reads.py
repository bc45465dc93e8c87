"""The SQLite store's reads, each a few indexed statements: due jobs for a claim, jobs
and dead letters page by page, counts (from `job_counts` and `tallies`, kept by
triggers), and the summaries the dashboard shows. None of them changes anything."""

from __future__ import annotations

import heapq
import sqlite3
from collections.abc import Iterable, Mapping
from typing import Any

import msgspec
from goqueue.supervisor.common.bulk import CancelFilter
from goqueue.supervisor.common.enums import Status, WorkflowStatus
from goqueue.supervisor.common.flow import KeyTurns
from goqueue.supervisor.common.jobs import STATUSES, DeadLetter, Job
from goqueue.supervisor.common.reads import (
    OTHER_QUEUES,
    JobFilter,
    Page,
    QueueDepths,
    QueueStats,
    Stats,
)
from goqueue.supervisor.common.steps import Workflow, WorkflowCounts
from goqueue.supervisor.common.summaries import (
    DeadFilter,
    QueueSummary,
    TypeStats,
    percentile,
)
from goqueue.supervisor.common.summaries import (
    type_stats as stats_by_type,
)
from goqueue.supervisor.store.base import RUN_TIMES_SAMPLE, SCHEDULE_WALK
from goqueue.supervisor.store.memory.flows import workflow_of
from goqueue.supervisor.store.sqlite.keyed import Keys, keyed_due
from goqueue.supervisor.store.sqlite.rows import SELECT_ROW, Group, Row, from_ts, letter_of
from goqueue.supervisor.store.sqlite.schema import LIVE_SQL
from goqueue.supervisor.store.sqlite.steps import FLOW

_IDS = msgspec.json.Decoder(list[str] | None)


def _marks(values: Iterable[Any]) -> str:
    return ",".join("?" for _ in values)


# -- claims ------------------------------------------------------------------------------


def due(
    conn: sqlite3.Connection,
    now: float,
    queues: frozenset[str] | None,
    paused: set[str],
    slots: Mapping[str, int],
    limit: int,
    turns: KeyTurns,
    keys: Keys,
) -> list[Row]:
    """The rows of the best `limit` due jobs, at most `slots[type]` of each type, highest
    priority first, then oldest `run_at`, then enqueue order, keys taking turns: per
    type, its jobs without a key from the head of each queue and priority on the
    `jobs_due` index (a paused queue's backlog, and jobs scheduled for later, are never
    walked), and its keys one by one
    (`keyed.py`, with what it keeps of `keys`), so a type at its limit never holds up
    another. The jobs taken are counted in `turns`."""
    where, params = "", []
    if queues is not None:
        where += f" AND queue IN ({_marks(queues)})"
        params.extend(sorted(queues))
    if paused:
        where += f" AND queue NOT IN ({_marks(paused)})"
        params.extend(sorted(paused))

    def taken(queue: str) -> bool:
        return (queues is None or queue in queues) and queue not in paused

    takes = None if queues is None and not paused else taken
    found: list[tuple[int, int, int, float, int, tuple[Any, ...]]] = []
    for job_type, free in slots.items():
        if free > 0:
            take = min(free, limit)
            found.extend(keyed_due(conn, job_type, take, turns, keys, now, takes, where, params))
    if len(found) > limit:
        found = heapq.nsmallest(limit, found, key=_claim_order)
    else:
        found.sort(key=_claim_order)
    rows = [Row.read(columns) for *_, columns in found]
    for row in rows:
        turns.take(row.job.type, row.job.concurrency_key)
    turns.settle()
    return rows


def _claim_order(
    hit: tuple[int, int, int, float, int, tuple[Any, ...]],
) -> tuple[int, int, int, float, int]:
    return hit[0], hit[1], hit[2], hit[3], hit[4]


def next_due(conn: sqlite3.Connection, after: float) -> float | None:
    """When the earliest pending job due after `after` becomes due: the earliest of each
    queue's (queues are few; an index on `run_at` alone would cost every job a page
    written on enqueue and another on claim)."""
    found = [
        float(at)
        for queue in _depths(conn)
        for (at,) in conn.execute(
            "SELECT min(run_at) FROM jobs INDEXED BY jobs_queue_due"
            " WHERE status = 'pending' AND queue = ? AND run_at > ?",
            (queue, after),
        )
        if at is not None
    ]
    return min(found, default=None)


# -- jobs --------------------------------------------------------------------------------


def job(conn: sqlite3.Connection, job_id: str) -> Job | None:
    """One job by id."""
    found = conn.execute(SELECT_ROW + " WHERE id = ?", (job_id,)).fetchone()
    return None if found is None else Row.read(found).job


def jobs(conn: sqlite3.Connection, filters: JobFilter, limit: int, offset: int) -> Page:
    """Jobs newest first; the total from the kept counts unless a parent or a key is
    named."""
    clauses, params = [], []
    for column in ("type", "status", "queue", "parent_id", "concurrency_key"):
        value = getattr(filters, column)
        if value is not None:
            clauses.append(f"{column} = ?")
            params.append(value)
    where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
    rows = conn.execute(
        f"{SELECT_ROW} {where} ORDER BY seq DESC LIMIT ? OFFSET ?", (*params, limit, offset)
    ).fetchall()
    if filters.parent_id is not None or filters.concurrency_key is not None:
        (total,) = conn.execute(f"SELECT count(*) FROM jobs {where}", params).fetchone()
    else:
        (total,) = conn.execute(
            f"SELECT coalesce(sum(n), 0) FROM job_counts {where}", params
        ).fetchone()
    return Page([Row.read(r).job for r in rows], int(total))


def cancel_filter(filters: CancelFilter) -> tuple[str, tuple[Any, ...]]:
    """A bulk cancel's filters as a WHERE clause over unfinished jobs."""
    clauses = [f"status IN {LIVE_SQL}"]
    params: list[Any] = []
    if filters.queue is not None:
        clauses.append("queue = ?")
        params.append(filters.queue)
    if filters.type is not None:
        clauses.append("type = ?")
        params.append(filters.type)
    if filters.created_before is not None:
        clauses.append("created_at < ?")
        params.append(filters.created_before.timestamp())
    return "WHERE " + " AND ".join(clauses), tuple(params)


def count_jobs(
    conn: sqlite3.Connection, where: str, params: tuple[Any, ...], statuses: Iterable[Status]
) -> int:
    """How many jobs `where` selects among `statuses`."""
    chosen = tuple(statuses)
    if not chosen:
        return 0
    (n,) = conn.execute(
        f"SELECT count(*) FROM jobs {where} AND status IN ({_marks(chosen)})", (*params, *chosen)
    ).fetchone()
    return int(n)


# -- counts ------------------------------------------------------------------------------


def _dead_count(conn: sqlite3.Connection) -> int:
    (n,) = conn.execute("SELECT n FROM tallies WHERE name = 'dead'").fetchone()
    return int(n)


def _depths(conn: sqlite3.Connection, queue: str | None = None) -> dict[str, dict[str, int]]:
    """Pending jobs by queue, then priority (highest first), of queues holding any."""
    where, params = ("AND queue = ?", (queue,)) if queue is not None else ("", ())
    out: dict[str, dict[str, int]] = {}
    for name, priority, n in conn.execute(
        "SELECT queue, priority, sum(n) FROM job_counts WHERE status = 'pending'"
        f" {where} GROUP BY queue, priority HAVING sum(n) > 0 ORDER BY queue, priority DESC",
        params,
    ):
        out.setdefault(name, {})[str(priority)] = int(n)
    return out


def stats(conn: sqlite3.Connection) -> Stats:
    """Counts by status and pending depth by queue and priority."""
    counts = dict.fromkeys(STATUSES, 0)
    for status, n in conn.execute("SELECT status, sum(n) FROM job_counts GROUP BY status"):
        counts[Status(status)] = int(n)
    return Stats({str(k): v for k, v in counts.items()}, _depths(conn), _dead_count(conn))


def queue_stats(conn: sqlite3.Connection, queue: str) -> QueueStats:
    """One queue's counts by status and depth by priority."""
    counts: dict[str, int] = {str(s): 0 for s in STATUSES}
    for status, n in conn.execute(
        "SELECT status, sum(n) FROM job_counts WHERE queue = ? GROUP BY status", (queue,)
    ):
        counts[status] = int(n)
    depth = _depths(conn, queue).get(queue, {})
    paused = conn.execute("SELECT 1 FROM paused_queues WHERE queue = ?", (queue,)).fetchone()
    return QueueStats(queue, counts, depth, paused is not None)


_WALK = (
    "SELECT count(*) FROM (SELECT 1 FROM jobs INDEXED BY jobs_queue_due"
    " WHERE status = 'pending' AND queue = ? AND run_at {} ? LIMIT ?)"
)
_WALK_LATER, _WALK_DUE = _WALK.format(">"), _WALK.format("<=")


def _later(conn: sqlite3.Connection, queue: str, pending: int, now: float) -> int:
    """How many of the `pending` jobs of `queue` are scheduled for later, walking the
    shallower side of `now`: up to SCHEDULE_WALK jobs for later, else up to as many due
    ones (the rest are for later); only a queue deep on both sides is walked whole."""
    (later,) = conn.execute(_WALK_LATER, (queue, now, SCHEDULE_WALK)).fetchone()
    if later < SCHEDULE_WALK:
        return int(later)
    (due,) = conn.execute(_WALK_DUE, (queue, now, SCHEDULE_WALK)).fetchone()
    if due < SCHEDULE_WALK:
        return pending - int(due)
    (later,) = conn.execute(_WALK_LATER, (queue, now, -1)).fetchone()  # no limit
    return int(later)


def _oldest_due(conn: sqlite3.Connection, queue: str, now: float) -> float | None:
    """The `run_at` of the longest-waiting due job of `queue`."""
    (at,) = conn.execute(
        "SELECT min(run_at) FROM jobs INDEXED BY jobs_queue_due"
        " WHERE status = 'pending' AND queue = ? AND run_at <= ?",
        (queue, now),
    ).fetchone()
    return None if at is None else float(at)


def queue_depths(conn: sqlite3.Connection, top: int, now: float) -> QueueDepths:
    """The `top` deepest queues by priority, all the others summed by priority, and the
    longest wait of a due job in each (in all the others together)."""
    depths = _depths(conn)
    totals = {q: sum(d.values()) for q, d in depths.items()}
    deepest = heapq.nsmallest(top, totals.items(), key=lambda item: (-item[1], item[0]))
    chosen = {q: depths[q] for q, _ in deepest}
    other: dict[str, int] = {}
    for queue, depth in depths.items():
        if queue not in chosen:
            for priority, n in depth.items():
                other[priority] = other.get(priority, 0) + n
    waiting = {}
    for queue in chosen:
        at = _oldest_due(conn, queue, now)
        waiting[queue] = 0.0 if at is None else now - at
    if len(totals) > len(chosen):
        found = [_oldest_due(conn, queue, now) for queue in totals if queue not in chosen]
        oldest = min((at for at in found if at is not None), default=None)
        waiting[OTHER_QUEUES] = 0.0 if oldest is None else now - oldest
    rest = {p: n for p, n in sorted(other.items(), key=lambda item: int(item[0])) if n}
    pending = sum(totals.values())
    return QueueDepths(chosen, rest, len(totals), pending, waiting, _dead_count(conn))


def queue_names(conn: sqlite3.Connection, limit: int) -> frozenset[str]:
    """Queues holding pending jobs, and paused queues (at most `limit`)."""
    rows = conn.execute(
        "SELECT queue FROM job_counts WHERE status = 'pending' GROUP BY queue HAVING sum(n) > 0"
        " UNION SELECT queue FROM paused_queues LIMIT ?",
        (limit,),
    )
    return frozenset(q for (q,) in rows)


def queue_summaries(
    conn: sqlite3.Connection, now: float, moves: Mapping[Group, int]
) -> list[QueueSummary]:
    """Every queue with pending, claimed or running jobs, and every paused one (`moves`:
    the open turn's, in the rows but not yet in the counts)."""
    depths = _depths(conn)
    running = {
        q: int(n)
        for q, n in conn.execute(
            "SELECT queue, sum(n) FROM job_counts WHERE status IN ('running', 'claimed')"
            " GROUP BY queue HAVING sum(n) > 0"
        )
    }
    for (queue, _, priority, status), n in moves.items():
        if status == Status.PENDING:
            depth = depths.setdefault(queue, {})
            depth[str(priority)] = depth.get(str(priority), 0) + n
        elif status in (Status.RUNNING, Status.CLAIMED):
            running[queue] = running.get(queue, 0) + n
    depths = {
        q: {p: n for p, n in sorted(d.items(), key=lambda pn: -int(pn[0])) if n}
        for q, d in depths.items()
        if any(d.values())
    }
    running = {q: n for q, n in running.items() if n}
    scheduled = {queue: _later(conn, queue, sum(d.values()), now) for queue, d in depths.items()}
    paused = {q for (q,) in conn.execute("SELECT queue FROM paused_queues")}
    summaries = []
    for name in sorted(set(depths) | set(running) | paused):
        depth = depths.get(name, {})
        oldest = _oldest_due(conn, name, now) if depth else None
        summaries.append(
            QueueSummary(
                name=name,
                pending=sum(depth.values()),
                scheduled=scheduled.get(name, 0),
                running=running.get(name, 0),
                depth_by_priority=depth,
                oldest_due_at=from_ts(oldest),
                waiting_seconds=None if oldest is None else max(0.0, now - oldest),
                paused=name in paused,
            )
        )
    return summaries


def type_stats(conn: sqlite3.Connection) -> list[TypeStats]:
    """Counts by status of every type kept, and the p50/p95 run time of the latest
    `RUN_TIMES_SAMPLE` finished jobs (done or failed), by type."""
    counts: dict[str, dict[str, int]] = {}
    for name, status, n in conn.execute(
        "SELECT type, status, sum(n) FROM job_counts GROUP BY type, status HAVING sum(n) > 0"
    ):
        counts.setdefault(name, {})[status] = int(n)
    runs: dict[str, list[float]] = {}
    for name, seconds in conn.execute(
        "SELECT type, finished_at - started_at FROM jobs INDEXED BY jobs_finished"
        " WHERE finished_at IS NOT NULL AND status IN ('done', 'failed')"
        " AND started_at IS NOT NULL ORDER BY finished_at DESC LIMIT ?",
        (RUN_TIMES_SAMPLE,),
    ):
        runs.setdefault(name, []).append(float(seconds))
    quantiles = {}
    for name, values in runs.items():
        values.sort()
        quantiles[name] = (percentile(values, 0.5), percentile(values, 0.95))
    return stats_by_type(counts, quantiles)


# -- dead letters ------------------------------------------------------------------------


def _dead_filter(filters: DeadFilter | None) -> tuple[str, list[Any]]:
    clauses: list[str] = []
    params: list[Any] = []
    if filters is not None:
        for column in ("type", "queue", "job_id"):
            value = getattr(filters, column)
            if value is not None:
                clauses.append(f"{column} = ?")
                params.append(value)
        if filters.before is not None:
            clauses.append("created_at < ?")
            params.append(filters.before.timestamp())
        if filters.after is not None:
            clauses.append("created_at > ?")
            params.append(filters.after.timestamp())
        if filters.error is not None:
            clauses.append("goqueue_contains(last_error, ?)")
            params.append(filters.error.casefold())
    return ("WHERE " + " AND ".join(clauses)) if clauses else "", params


def contains(text: str | None, needle: str) -> bool:
    """The dead-letter error filter: a case-insensitive substring (as Python folds case)."""
    return needle in (text or "").casefold()


def letters(conn: sqlite3.Connection, filters: DeadFilter | None, limit: int, offset: int) -> Page:
    """Dead letters newest first (those passing `filters`)."""
    where, params = _dead_filter(filters)
    rows = conn.execute(
        f"SELECT letter, parents FROM dead_letters {where} ORDER BY seq DESC LIMIT ? OFFSET ?",
        (*params, limit, offset),
    ).fetchall()
    return Page([letter_of(letter, parents) for letter, parents in rows], _passing(conn, filters))


def oldest_letters(
    conn: sqlite3.Connection, filters: DeadFilter, limit: int
) -> tuple[list[DeadLetter], int]:
    """Up to `limit` letters passing `filters`, oldest first, and how many more pass."""
    where, params = _dead_filter(filters)
    rows = conn.execute(
        f"SELECT letter, parents FROM dead_letters {where} ORDER BY seq LIMIT ?",
        (*params, limit),
    ).fetchall()
    total = _passing(conn, filters)
    return [letter_of(letter, parents) for letter, parents in rows], max(0, total - limit)


def _passing(conn: sqlite3.Connection, filters: DeadFilter | None) -> int:
    """How many letters pass `filters`: from the counts kept when no filter or only the
    queue and type are set, else by reading the letters."""
    if filters is None or filters.empty:
        return _dead_count(conn)
    if filters.by_group:
        (n,) = conn.execute(
            "SELECT coalesce(sum(n), 0) FROM dead_counts"
            " WHERE (?1 IS NULL OR queue = ?1) AND (?2 IS NULL OR type = ?2)",
            (filters.queue, filters.type),
        ).fetchone()
        return int(n)
    where, params = _dead_filter(filters)
    (n,) = conn.execute(f"SELECT count(*) FROM dead_letters {where}", params).fetchone()
    return int(n)


# -- workflows ---------------------------------------------------------------------------


def workflow(conn: sqlite3.Connection, workflow_id: str) -> Workflow | None:
    """One workflow with its steps' live statuses (a pruned step was done)."""
    found = conn.execute("SELECT record FROM workflows WHERE id = ?", (workflow_id,)).fetchone()
    if found is None:
        return None
    kept = {
        job_id: (Status(status), _IDS.decode(parents) if parents else None)
        for job_id, status, parents in conn.execute(
            "SELECT id, status, json_extract(CAST(job AS TEXT), '$.parent_ids') FROM jobs"
            " WHERE workflow_id = ?",
            (workflow_id,),
        )
    }
    return workflow_of(FLOW.decode(found[0]), kept)


def workflows(
    conn: sqlite3.Connection, status: WorkflowStatus | None, limit: int, offset: int
) -> Page:
    """Workflows newest first, of `status` if given (by the status kept in each row, and
    the total from the kept counts: no step is read but the page's own)."""
    if status is None:
        ids = conn.execute(
            "SELECT id FROM workflows ORDER BY seq DESC LIMIT ? OFFSET ?", (limit, offset)
        ).fetchall()
    else:
        ids = conn.execute(
            "SELECT id FROM workflows WHERE status = ? ORDER BY seq DESC LIMIT ? OFFSET ?",
            (status, limit, offset),
        ).fetchall()
    counts = workflow_counts(conn).by_status
    total = sum(counts.values()) if status is None else counts[status]
    return Page([w for (i,) in ids if (w := workflow(conn, i)) is not None], total)


def workflow_counts(conn: sqlite3.Connection) -> WorkflowCounts:
    """Workflows by status, and steps waiting: both from the kept counts."""
    by_status = dict.fromkeys(map(str, WorkflowStatus), 0)
    for status, n in conn.execute("SELECT status, n FROM workflow_counts"):
        by_status[status] = int(n)
    (waiting,) = conn.execute(
        "SELECT coalesce(sum(n), 0) FROM job_counts WHERE status = 'waiting'"
    ).fetchone()
    return WorkflowCounts(by_status, int(waiting))
