"""The SQLite store's reads: each runs one read of `reads.py` at once, on the
connection (no await: a read never waits for a commit)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime

from goqueue.supervisor.common.jobs import Event, Job
from goqueue.supervisor.common.reads import JobFilter, Page, QueueDepths, QueueStats, Stats
from goqueue.supervisor.common.summaries import (
    DeadFilter,
    QueueSummary,
    TypeStats,
    dead_brief,
    job_brief,
)
from goqueue.supervisor.store.sqlite import reads
from goqueue.supervisor.store.sqlite.calls import Read
from goqueue.supervisor.store.sqlite.rows import Group, events_of


class SqliteReads:
    """The read calls of a `SqliteStore`, made through its `read`."""

    def __init__(
        self,
        read: Read,
        clock: Callable[[], datetime],
        open_moves: Callable[[], Mapping[Group, int]],
    ) -> None:
        self._read = read
        self._clock = clock
        self._open_moves = open_moves  # the open turn's moves, not counted yet

    async def get(self, job_id: str) -> Job | None:
        """One job by id."""
        return self._read(lambda c: reads.job(c, job_id))

    async def list_jobs(self, filters: JobFilter, limit: int, offset: int) -> Page:
        """Jobs newest first."""
        return self._read(lambda c: reads.jobs(c, filters, limit, offset))

    async def events(self, job_id: str) -> list[Event]:
        """A job's audit trail, oldest first."""
        found = self._read(
            lambda c: c.execute("SELECT events FROM jobs WHERE id = ?", (job_id,)).fetchone()
        )
        return [] if found is None else events_of(job_id, found[0])

    async def stats(self) -> Stats:
        """Counts by status and pending depth by queue and priority (kept as they change)."""
        return self._read(reads.stats)

    async def queue_stats(self, queue: str) -> QueueStats:
        """One queue's counts by status and depth by priority."""
        return self._read(lambda c: reads.queue_stats(c, queue))

    async def queue_depths(self, top: int) -> QueueDepths:
        """The `top` deepest queues by priority, the rest summed by priority."""
        now = self._clock().timestamp()
        return self._read(lambda c: reads.queue_depths(c, top, now))

    async def queue_names(self, limit: int) -> frozenset[str]:
        """Queues holding pending jobs, and paused queues (at most `limit`)."""
        return self._read(lambda c: reads.queue_names(c, limit))

    async def list_dead(self, limit: int, offset: int, filters: DeadFilter | None = None) -> Page:
        """Dead letters newest first (those passing `filters`)."""
        return self._read(lambda c: reads.letters(c, filters, limit, offset))

    async def queue_summaries(self) -> list[QueueSummary]:
        """Every queue with pending, claimed or running jobs, and every paused one."""
        now = self._clock().timestamp()
        return self._read(lambda c: reads.queue_summaries(c, now, self._open_moves()))

    async def type_stats(self) -> list[TypeStats]:
        """Counts by status, run-time percentiles (of the latest finished jobs) and
        failure rate of every job type."""
        return self._read(reads.type_stats)

    async def job_briefs(self, filters: JobFilter, limit: int, offset: int, preview: int) -> Page:
        """A page of `list_jobs` as brief rows."""
        page = await self.list_jobs(filters, limit, offset)
        return Page([job_brief(job, preview) for job in page.items], page.total)

    async def dead_briefs(self, filters: DeadFilter, limit: int, offset: int, preview: int) -> Page:
        """Dead letters newest first, filtered, as brief rows."""
        page = await self.list_dead(limit, offset, filters)
        return Page([dead_brief(dead, preview) for dead in page.items], page.total)
