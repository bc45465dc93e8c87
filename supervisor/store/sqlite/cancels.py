"""The SQLite store's cancels, one job or by filter; each on disk before the answer."""

from __future__ import annotations

from goqueue.supervisor.common.bulk import BULK_CANCEL, CancelFilter, Cancelled
from goqueue.supervisor.common.enums import TERMINAL, Status
from goqueue.supervisor.common.errors import InvalidState, NotFound
from goqueue.supervisor.common.jobs import Job
from goqueue.supervisor.store.sqlite import reads
from goqueue.supervisor.store.sqlite.calls import Write
from goqueue.supervisor.store.sqlite.rules import Tx


class SqliteCancels:
    """The cancel calls of a `SqliteStore`, made through its `write`."""

    def __init__(self, write: Write) -> None:
        self._write = write

    async def one(self, job_id: str, force: bool) -> tuple[Job, str | None]:
        """Cancel a pending or claimed job, or a running one with `force`; the job and the
        token of the lease it had, if any."""

        def work(tx: Tx) -> tuple[Job, str | None]:
            row = tx.load(job_id)
            if row is None:
                raise NotFound(f"job {job_id} not found")
            status = row.job.status
            if status in TERMINAL:
                raise InvalidState(f"job {job_id} is already {status}", status)
            if status == Status.RUNNING and not force:
                raise InvalidState(f"job {job_id} is running; use force=true to kill it", status)
            return row.job, tx.cancel(row)

        return await self._write(work, durable=True)

    async def many(self, filters: CancelFilter, limit: int) -> Cancelled:
        """Cancel up to `limit` unfinished jobs passing `filters`, oldest first."""

        def work(tx: Tx) -> Cancelled:
            where, params = reads.cancel_filter(filters)
            left_alone = () if Status.RUNNING in filters.statuses else (Status.RUNNING,)
            running = reads.count_jobs(tx.conn, where, params, left_alone)
            total = reads.count_jobs(tx.conn, where, params, filters.statuses)
            marks = ",".join("?" * len(filters.statuses))
            taken = tx.load_where(
                f"{where} AND status IN ({marks}) ORDER BY created_at, seq LIMIT ?",
                (*params, *filters.statuses, limit),
            )
            killed = sum(1 for row in taken if row.job.status == Status.RUNNING)
            tokens = [t for row in taken if (t := tx.cancel(row, BULK_CANCEL)) is not None]
            jobs = [row.job for row in taken]
            return Cancelled(jobs, tokens, max(0, total - limit), running, killed)

        return await self._write(work, durable=True)
