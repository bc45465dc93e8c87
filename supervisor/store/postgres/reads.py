"""What the PostgreSQL store answers about its jobs, and the deletions that tidy them.

Jobs by id and by page, counts by status and queue, a job's audit trail, dead letters;
purging a letter, and pruning finished jobs with their audit trails. The statements
of a page (or of the stats) go together in one pipeline: one round trip.
"""

from __future__ import annotations

from datetime import datetime

from goqueue.supervisor.common.bulk import Purged
from goqueue.supervisor.common.jobs import STATUSES, DeadLetter, Event, Job
from goqueue.supervisor.common.reads import (
    OTHER_QUEUES,
    JobFilter,
    Page,
    QueueDepths,
    QueueStats,
    Stats,
)
from goqueue.supervisor.common.summaries import DeadFilter
from goqueue.supervisor.store.postgres import rows as pg_rows
from goqueue.supervisor.store.postgres.connection import Connections
from goqueue.supervisor.store.postgres.rows import Row
from goqueue.supervisor.store.postgres.sql.statements import Sql, Statements


def _count(row: Row | None) -> int:
    return int(row[0]) if row is not None else 0


def _by_status(rows: list[Row]) -> dict[str, int]:
    """Counts by status, every status present (those without jobs as 0)."""
    counts: dict[str, int] = {status: 0 for status in STATUSES}
    counts.update((status, n) for status, n in rows)
    return counts


class Reads:
    """Reads, and the deletions of old records (see the module)."""

    def __init__(self, db: Connections, sql: Statements) -> None:
        self._db = db
        self._sql = sql

    async def get(self, job_id: str) -> Job | None:
        """One job by id (None for an unknown or malformed id)."""
        if not pg_rows.is_uuid(job_id):
            return None
        rows = await self._db.execute(self._sql[Sql.GET], {"id": job_id})
        return pg_rows.job(rows[0]) if rows else None

    async def list_jobs(self, filters: JobFilter, limit: int, offset: int) -> Page:
        """Jobs newest first, and how many match."""
        page_sql, count_sql = self._sql.list_jobs(filters)
        params = pg_rows.job_filter(filters) | {"limit": limit, "offset": offset}
        rows, total = await self._db.page(page_sql, count_sql, params)
        return Page([pg_rows.job(r) for r in rows], total)

    async def stats(self) -> Stats:
        """Counts by status (all present), pending depth by queue and priority, dead letters."""
        async with self._db.connection() as conn:
            async with conn.pipeline():
                by_status = await conn.execute(self._sql[Sql.COUNTS])
                depth = await conn.execute(self._sql[Sql.DEPTH])
                dead = await conn.execute(self._sql[Sql.DEAD_COUNT])
            counts = _by_status(await by_status.fetchall())
            queues: dict[str, dict[str, int]] = {}
            for queue, priority, n in sorted(await depth.fetchall(), key=lambda r: (r[0], -r[1])):
                queues.setdefault(queue, {})[str(priority)] = n
            dead_row = await dead.fetchone()
        return Stats(counts, queues, _count(dead_row))

    async def queue_stats(self, queue: str) -> QueueStats:
        """One queue's counts by status, pending depth by priority, and whether paused."""
        params = {"queue": queue}
        async with self._db.connection() as conn:
            async with conn.pipeline():
                by_status = await conn.execute(self._sql[Sql.QUEUE_COUNTS], params)
                depth = await conn.execute(self._sql[Sql.QUEUE_DEPTH], params)
                paused = await conn.execute(self._sql[Sql.IS_PAUSED], params)
            counts = _by_status(await by_status.fetchall())
            by_priority = {str(p): n for p, n in sorted(await depth.fetchall(), reverse=True)}
            paused_row = await paused.fetchone()
        return QueueStats(queue, counts, by_priority, bool(paused_row and paused_row[0]))

    async def queue_depths(self, top: int) -> QueueDepths:
        """The `top` deepest queues by priority, the rest summed by priority."""
        rows = await self._db.execute(self._sql[Sql.QUEUE_DEPTHS], {"top": top})
        chosen: dict[str, dict[str, int]] = {}
        everything: dict[str, int] = {}
        waiting: dict[str, float] = {}
        queues = dead = 0
        for kind, queue, priority, n, seconds in rows:
            match kind:
                case "depth":
                    chosen.setdefault(queue, {})[str(priority)] = n
                case "all":
                    everything[str(priority)] = n
                case "queues":
                    queues = n
                case "wait":
                    waiting[queue] = seconds
                case "other" if n:
                    waiting[OTHER_QUEUES] = seconds
                case "dead":
                    dead = n
        other = dict(everything)
        for depth in chosen.values():
            for priority, n in depth.items():
                other[priority] = other.get(priority, 0) - n
        other = {priority: n for priority, n in other.items() if n > 0}
        pending = sum(everything.values())
        return QueueDepths(chosen, other, queues, pending, waiting, dead)

    async def queue_names(self, limit: int) -> frozenset[str]:
        """Queues holding pending jobs (at most `limit`), and the paused ones."""
        rows = await self._db.execute(self._sql[Sql.QUEUE_NAMES], {"limit": limit})
        return frozenset(row[0] for row in rows)

    async def events(self, job_id: str) -> list[Event]:
        """A job's audit trail, oldest first (each event committed with its change)."""
        if not pg_rows.is_uuid(job_id):
            return []
        rows = await self._db.execute(self._sql[Sql.EVENTS], {"id": job_id})
        return [
            Event(
                job_id=r[0],
                event=r[1],
                at=r[2],
                node=r[3],
                attempt=r[4],
                detail=r[5],
                traceback=r[6],
            )
            for r in rows
        ]

    async def list_dead(self, limit: int, offset: int, filters: DeadFilter | None = None) -> Page:
        """Dead letters newest first (those passing `filters`)."""
        filters = filters or DeadFilter()
        if filters.job_id is not None and not pg_rows.is_uuid(filters.job_id):
            return Page([], 0)
        params = pg_rows.dead_filter(filters) | {"limit": limit, "offset": offset}
        count, counted = pg_rows.dead_count(filters, params, Sql.COUNT_DEAD_MATCHING)
        page_sql, count_sql = self._sql[Sql.LIST_DEAD], self._sql[count]
        prepare = pg_rows.dead_prepare(filters)
        rows, total = await self._db.page(page_sql, count_sql, params, counted, prepare=prepare)
        return Page([pg_rows.dead(r) for r in rows], total)

    async def get_dead(self, dead_id: str) -> DeadLetter | None:
        """One dead letter by its own id or its job's."""
        if not pg_rows.is_uuid(dead_id):
            return None
        rows = await self._db.execute(self._sql[Sql.GET_DEAD], {"id": dead_id})
        return pg_rows.dead(rows[0]) if rows else None

    async def purge_dead(self, dead_id: str) -> bool:
        """Delete a dead letter; False if there was none."""
        if not pg_rows.is_uuid(dead_id):
            return False
        async with self._db.connection() as conn:
            self._db.committing(conn)
            cur = await conn.execute(self._sql[Sql.PURGE_DEAD], {"id": dead_id})
            return cur.rowcount > 0

    async def purge_dead_many(self, filters: DeadFilter, limit: int) -> Purged:
        """Delete up to `limit` matching letters, oldest first."""
        if filters.job_id is not None and not pg_rows.is_uuid(filters.job_id):
            return Purged(0, 0)
        params = pg_rows.dead_filter(filters) | {"limit": limit}
        # by queue and type alone, or none: the rest left is read from the tallies
        purge = Sql.PURGE_DEAD_MANY_TALLIED if filters.by_group else Sql.PURGE_DEAD_MANY
        prepare = pg_rows.dead_prepare(filters)
        rows = await self._db.write(self._sql[purge], params, prepare=prepare)
        return Purged(int(rows[0][0]), max(0, int(rows[0][1])))

    async def prune(self, finished_before: datetime, limit: int) -> int:
        """Delete old finished jobs and their audit trails, oldest first."""
        params = {"before": finished_before, "limit": limit}
        rows = await self._db.execute(self._sql[Sql.PRUNE], params)
        return _count(rows[0] if rows else None)
