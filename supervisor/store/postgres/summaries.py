"""What the PostgreSQL store tells operators (the dashboard's summary routes): queues with
their depth and longest wait, the nodes sharing the store, and jobs and dead letters as
list rows whose payloads, results and errors are cut to a preview in the database, so a
page never carries whole payloads."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
from goqueue.supervisor.common.reads import JobFilter, Page
from goqueue.supervisor.common.summaries import (
    DeadBrief,
    DeadFilter,
    JobBrief,
    NodeReport,
    NodeSummary,
    Preview,
    QueueSummary,
    TypeStats,
    dead_brief,
    type_stats,
)
from goqueue.supervisor.store.postgres import rows as pg_rows
from goqueue.supervisor.store.postgres.connection import Connections
from goqueue.supervisor.store.postgres.rows import Row
from goqueue.supervisor.store.postgres.sql.statements import Sql, Statements

_NO_PAYLOAD = Preview("null", 4, False)
# The leading columns of JOB_BRIEFS and DEAD_BRIEFS rows, in order; previews follow them.
_JOB_BRIEF_COLUMNS = JobBrief.__struct_fields__[:13]
_DEAD_BRIEF_COLUMNS = DeadBrief.__struct_fields__[:8]


class Summaries:
    """The summary reads (see the module); every page and its count in one round trip."""

    def __init__(self, db: Connections, sql: Statements, live_window: float) -> None:
        self._db = db
        self._sql = sql
        self._live = live_window

    async def queue_summaries(self) -> list[QueueSummary]:
        """Every queue with pending or running jobs, and every paused one: one pass over
        the pending jobs (the same cost as `stats`), one over the running ones."""
        async with self._db.connection() as conn:
            async with conn.pipeline():
                pending = await conn.execute(self._sql[Sql.QUEUE_PENDING])
                running = await conn.execute(self._sql[Sql.QUEUE_RUNNING])
                paused = await conn.execute(self._sql[Sql.PAUSED])
            pending_rows = await pending.fetchall()
            running_rows = dict(await running.fetchall())
            paused_set = {r[0] for r in await paused.fetchall()}
        return _queue_summaries(pending_rows, running_rows, paused_set)

    async def nodes(self) -> list[NodeSummary]:
        """Nodes that heartbeated within the hour; `live` within the liveness window."""
        rows = await self._db.execute(self._sql[Sql.NODES], {"live": self._live})
        return [
            NodeSummary(node, started, beat, live, sorted(msgspec.json.decode(limits)), _report(r))
            for node, started, beat, live, limits, r in rows
        ]

    async def type_stats(self) -> list[TypeStats]:
        """Counts by status, run-time percentiles and failure rate of every job type, in
        one round trip (two grouped passes over the jobs kept)."""
        async with self._db.connection() as conn:
            async with conn.pipeline():
                counted = await conn.execute(self._sql[Sql.TYPE_COUNTS])
                timed = await conn.execute(self._sql[Sql.TYPE_RUN_TIMES])
            count_rows = await counted.fetchall()
            time_rows = await timed.fetchall()
        counts: dict[str, dict[str, int]] = {}
        for name, status, n in count_rows:
            counts.setdefault(name, {})[status] = int(n)
        runs = {name: (p50, p95) for name, p50, p95 in time_rows}
        return type_stats(counts, runs)

    async def job_briefs(self, filters: JobFilter, limit: int, offset: int, preview: int) -> Page:
        """`list_jobs` as list rows, with payload, result and error cut in the database."""
        params = pg_rows.job_filter(filters) | {"limit": limit, "offset": offset, "n": preview}
        page_sql = self._sql.filtered(Sql.JOB_BRIEFS, filters)
        count_sql = self._sql.filtered(Sql.COUNT_JOBS, filters)
        rows, total = await self._db.page(page_sql, count_sql, params)
        return Page([_job_brief(r) for r in rows], total)

    async def dead_briefs(self, filters: DeadFilter, limit: int, offset: int, preview: int) -> Page:
        """Dead letters newest first, filtered on their job snapshot, cut in the database."""
        if filters.job_id is not None and not pg_rows.is_uuid(filters.job_id):
            return Page([], 0)
        params = pg_rows.dead_filter(filters) | {"limit": limit, "offset": offset, "n": preview}
        count, counted = pg_rows.dead_count(filters, params, Sql.COUNT_DEAD_BRIEFS)
        sql, prepare = self._sql, pg_rows.dead_prepare(filters)
        rows, total = await self._db.page(
            sql[Sql.DEAD_BRIEFS], sql[count], params, counted, prepare=prepare
        )
        return Page([_dead_brief(r, preview) for r in rows], total)


_REPORT = msgspec.json.Decoder(NodeReport)


def _report(raw: msgspec.Raw | None) -> NodeReport | None:
    """A node's published report; None if it published none or one this version cannot
    read (a newer node's), rather than failing the whole list."""
    if raw is None:
        return None
    try:
        return _REPORT.decode(raw)
    except msgspec.ValidationError:
        return None


def _preview(cols: Sequence[Any]) -> Preview | None:
    text, size, cut = cols
    return None if text is None else Preview(text, int(size), bool(cut))


def _job_brief(row: Row) -> JobBrief:
    fields = dict(zip(_JOB_BRIEF_COLUMNS, row, strict=False))
    return JobBrief(
        **fields,
        payload=_preview(row[13:16]) or _NO_PAYLOAD,
        result=_preview(row[16:19]),
        last_error=_preview(row[19:22]),
    )


def _dead_brief(row: Row, preview: int) -> DeadBrief:
    whole = row[17]
    if whole is not None:  # its JSON holds \u0000, which the database cannot cut: cut here
        return dead_brief(pg_rows.dead((row[0], row[1], whole, b"[]", row[7])), preview)
    fields = dict(zip(_DEAD_BRIEF_COLUMNS, row, strict=False))
    return DeadBrief(
        **fields, payload=_preview(row[8:11]) or _NO_PAYLOAD, last_error=_preview(row[14:17])
    )


def _queue_summaries(
    pending: Sequence[Row], running: Mapping[str, int], paused: set[str]
) -> list[QueueSummary]:
    """Fold (queue, priority) rows into one summary per queue."""
    by_queue: dict[str, list[Row]] = {}
    for row in pending:
        by_queue.setdefault(row[0], []).append(row)
    out = []
    for name in sorted(set(by_queue) | set(running) | paused):
        rows = sorted(by_queue.get(name, []), key=lambda r: -r[1])
        due = [r for r in rows if r[4] is not None]
        oldest = min(due, key=lambda r: r[4]) if due else None
        out.append(
            QueueSummary(
                name=name,
                pending=sum(r[2] for r in rows),
                scheduled=sum(r[3] for r in rows),
                running=int(running.get(name, 0)),
                depth_by_priority={str(r[1]): int(r[2]) for r in rows},
                oldest_due_at=oldest[4] if oldest else None,
                waiting_seconds=max(0.0, oldest[5]) if oldest else None,
                paused=name in paused,
            )
        )
    return out
