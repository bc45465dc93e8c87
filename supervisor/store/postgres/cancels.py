"""Cancels on PostgreSQL: one job (a running one with `force`), or every job matching a
filter in one statement. A cleared lease fences its holder out; the tokens come back so
the engine can kill the workers."""

from __future__ import annotations

from goqueue.supervisor.common.bulk import BULK_CANCEL, CancelFilter, Cancelled
from goqueue.supervisor.common.enums import TERMINAL, Status
from goqueue.supervisor.common.errors import InvalidState, NotFound
from goqueue.supervisor.common.jobs import Job
from goqueue.supervisor.store.postgres import rows as pg_rows
from goqueue.supervisor.store.postgres.connection import Connections
from goqueue.supervisor.store.postgres.notify import Wakeups
from goqueue.supervisor.store.postgres.sql.statements import Sql, Statements
from goqueue.supervisor.store.postgres.workflows import PgWorkflows


class Cancels:
    """The cancel calls of a `PostgresStore`."""

    def __init__(
        self,
        db: Connections,
        sql: Statements,
        node_id: str,
        wakeups: Wakeups,
        workflows: PgWorkflows,
    ) -> None:
        self._db = db
        self._sql = sql
        self.node_id = node_id
        self._wakeups = wakeups
        self._workflows = workflows  # a cancelled step's dependents are cancelled with it

    async def cancel(self, job_id: str, force: bool) -> tuple[Job, str | None]:
        """Cancel a pending job, or a running one with `force` (its lease is cleared, so
        the holder is fenced out; its token is returned to kill the worker)."""
        if not pg_rows.is_uuid(job_id):
            raise NotFound(f"job {job_id} not found")
        async with self._db.connection() as conn, self._db.transaction(conn):
            found = await self._db.fetchone(conn, self._sql[Sql.LOCK_JOB], {"id": job_id})
            if found is None:
                raise NotFound(f"job {job_id} not found")
            status, token = found
            if status in TERMINAL:
                raise InvalidState(f"job {job_id} is already {status}", status)
            if status == Status.RUNNING and not force:
                raise InvalidState(f"job {job_id} is running; use force=true to kill it", "running")
            params = {"id": job_id, "node": self.node_id}
            row = await self._db.fetchone(conn, self._sql[Sql.CANCEL], params)
            assert row is not None
            job = pg_rows.job(row)
            await self._workflows.cancel_below_in(conn, job)
        if status not in (Status.RUNNING, Status.CLAIMED):
            return job, None
        self._wakeups.freed(job)
        return job, token

    async def cancel_many(self, filters: CancelFilter, limit: int) -> Cancelled:
        """Cancel up to `limit` matching jobs, oldest first, in one statement; a lease
        cleared fences its holder out (the tokens are returned to kill the workers)."""
        params = {
            "statuses": [str(s) for s in filters.statuses],
            "queue": filters.queue,
            "type": filters.type,
            "before": filters.created_before,
            "limit": limit,
            "node": self.node_id,
            "detail": BULK_CANCEL,
        }
        rows = await self._db.write(self._sql[Sql.CANCEL_MANY], params)
        matching, running = rows[0][0], rows[0][1]
        taken = [row for row in rows if row[3] is not None]
        jobs = [pg_rows.job(row[4:]) for row in taken]
        for job in jobs:
            self._wakeups.freed(job)
        tokens = [row[2] for row in taken if row[2] is not None]
        killed = sum(1 for row in taken if row[3] == Status.RUNNING)
        left_alone = 0 if Status.RUNNING in filters.statuses else running
        return Cancelled(jobs, tokens, matching - len(jobs), left_alone, killed)
