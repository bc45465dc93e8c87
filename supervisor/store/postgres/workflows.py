"""Workflows in PostgreSQL: creation in one transaction (every step in one statement),
the release, cancellation and resumption of steps inside the transactions of their
parents' outcomes, reads and cancel. The statements are `sql/workflows.py`'."""

from __future__ import annotations

from typing import Any
from uuid import UUID

import msgspec
from goqueue.supervisor.common.enums import Status, WorkflowStatus
from goqueue.supervisor.common.errors import (
    IdempotencyMismatch,
    InvalidState,
    NotFound,
    StoreUnavailable,
)
from goqueue.supervisor.common.jobs import Job, new_id
from goqueue.supervisor.common.reads import Page
from goqueue.supervisor.common.steps import (
    WORKFLOW_CANCELLED,
    StepState,
    Workflow,
    WorkflowCounts,
    dependent_error,
    workflow_status,
)
from goqueue.supervisor.store.new_workflow import NewWorkflow, WorkflowCreated
from goqueue.supervisor.store.postgres import rows as pg_rows
from goqueue.supervisor.store.postgres.connection import Conn, Connections
from goqueue.supervisor.store.postgres.notify import Wakeups
from goqueue.supervisor.store.postgres.sql.statements import (
    N_JOB_FIELDS,
    WORKFLOW_KEY_PREFIX,
    Sql,
    Statements,
)


class PgWorkflows:
    """Workflows over the store's connections (see the module)."""

    def __init__(
        self,
        db: Connections,
        sql: Statements,
        node_id: str,
        wakeups: Wakeups,
        *,
        idempotency_ttl: float,
    ) -> None:
        self._db = db
        self._sql = sql
        self.node_id = node_id
        self._wakeups = wakeups
        self.idempotency_ttl = idempotency_ttl

    async def create(self, new: NewWorkflow) -> WorkflowCreated:
        """The workflow row, its idempotency key, every step and edge: one transaction."""
        async with self._db.connection() as conn, self._db.transaction(conn):
            if new.idempotency_key is not None:
                seen = await self._claim_key(conn, new)
                if seen is not None:
                    return WorkflowCreated(seen, created=False)
            params = {"id": new.id, "name": new.name}
            head = await self._db.fetchone(conn, self._sql[Sql.WORKFLOW_INSERT], params)
            assert head is not None
            ids, columns = self._steps(new)
            cur = await conn.execute(self._sql[Sql.WORKFLOW_STEPS], columns)
            roots = [pg_rows.job(row) for row in await cur.fetchall()]
        self._wakeups.pending(roots)
        # as just stored (no read back: a large workflow is answered sooner)
        steps = [
            StepState(s.key, ids[s.key], Status.WAITING if s.after else Status.PENDING, s.after)
            for s in new.steps
        ]
        status = workflow_status(False, (s.status for s in steps))
        made = Workflow(id=new.id, name=new.name, status=status, created_at=head[0], steps=steps)
        return WorkflowCreated(made, created=True)

    async def _claim_key(self, conn: Conn, new: NewWorkflow) -> Workflow | None:
        """Take the workflow's Idempotency-Key; the first workflow when it was taken with
        the same request. Raises IdempotencyMismatch for another request."""
        params = {
            "key": pg_rows.text(WORKFLOW_KEY_PREFIX + (new.idempotency_key or "")),
            "hash": new.request_hash or "",
            "id": new.id,
            "ttl": self.idempotency_ttl,
        }
        if await self._db.fetchone(conn, self._sql[Sql.CLAIM_IDEMPOTENCY], params) is not None:
            return None
        held = await self._db.fetchone(conn, self._sql[Sql.IDEMPOTENCY_HOLDER], params)
        if held is None:
            raise StoreUnavailable("idempotency key changed concurrently; retry")
        if held[0] != (new.request_hash or ""):
            raise IdempotencyMismatch(str(held[1]))
        found = await self._read(conn, str(held[1]))
        if found is None:
            raise StoreUnavailable(f"idempotency key names a missing workflow {held[1]}")
        return found

    def _steps(self, new: NewWorkflow) -> tuple[dict[str, str], dict[str, Any]]:
        """The steps' job ids by key, and the parameters of `WORKFLOW_STEPS`: one array
        per column, and the edges."""
        ids: dict[str, str] = {}
        rows = []
        for step in new.steps:
            job_id = new_id()
            ids[step.key] = job_id
            rows.append(pg_rows.insert_params(step.new.spec, step.new.max_retries, job_id=job_id))
        columns = pg_rows.columns(rows)
        del columns["dedupe_key"], columns["unique_key"], columns["parent_id"]
        del columns["debounce_key"]
        parents = [ids[k] for step in new.steps for k in step.after]
        children = [ids[step.key] for step in new.steps for _ in step.after]
        return ids, columns | {
            "workflow": new.id,
            "key": [step.key for step in new.steps],
            "pids": [" ".join(ids[k] for k in step.after) for step in new.steps],
            "waiting": [len(step.after) for step in new.steps],
            "parents": parents,
            "children": children,
            "node": self.node_id,
        }

    # -- inside the transactions of outcomes -------------------------------------------

    async def release_in(self, conn: Conn, done: list[Job]) -> list[Job]:
        """The steps whose parents these done jobs were: their results handed over, one
        decrement each; the steps whose last parent finished, now pending."""
        ids = [job.id for job in done if job.workflow_id is not None]
        if not ids:
            return []
        cur = await conn.execute(self._sql[Sql.STEPS_RELEASE], {"ids": ids})
        return [pg_rows.job(row) for row in await cur.fetchall()]

    async def cancel_below_in(self, conn: Conn, job: Job) -> None:
        """Cancel every waiting step depending on `job` (failed for good, or cancelled)."""
        if job.workflow_id is None or job.step_key is None:
            return
        params = {"id": job.id, "error": dependent_error(job.step_key), "node": self.node_id}
        await conn.execute(self._sql[Sql.STEPS_CANCEL_BELOW], params)

    async def resume_in(self, conn: Conn, old: Job, fresh: Job) -> Job:
        """A dead step's replay `fresh` takes its place; the steps its failure cancelled
        wait again. Returns `fresh` as it now is (in the workflow, or not when the
        workflow was cancelled)."""
        if old.workflow_id is None or old.step_key is None:
            return fresh
        params = {
            "workflow": old.workflow_id,
            "key": old.step_key,
            "pids": old.parent_ids,
            "parents": old.parents,
            "old": old.id,
            "new": fresh.id,
            "node": self.node_id,
        }
        row = await self._db.fetchone(conn, self._sql[Sql.STEP_REPLACE], params)
        if row is None or not row[0]:
            return fresh
        await conn.execute(self._sql[Sql.STEPS_RESUME], params)
        return msgspec.structs.replace(
            fresh,
            workflow_id=old.workflow_id,
            step_key=old.step_key,
            parent_ids=old.parent_ids,
            parents=old.parents,
        )

    async def resume_below_in(self, conn: Conn, job: Job) -> None:
        """A dead step's late outcome was salvaged: the steps its dead letter cancelled
        wait again (for it, among their parents not done)."""
        if job.workflow_id is not None:
            params = {"new": job.id, "node": self.node_id}
            await conn.execute(self._sql[Sql.STEPS_RESUME], params)

    # -- reads and cancel ----------------------------------------------------------------

    async def _read(self, conn: Conn, workflow_id: str) -> Workflow | None:
        if not pg_rows.is_uuid(workflow_id):
            return None
        canonical = str(UUID(workflow_id))  # as the rows' ids read back
        return (await self._read_many(conn, [canonical])).get(canonical)

    async def _read_many(self, conn: Conn, ids: list[str]) -> dict[str, Workflow]:
        """The workflows of `ids` that exist, with their steps: two statements for all."""
        cur = await conn.execute(self._sql[Sql.WORKFLOW_GET], {"ids": ids})
        heads = await cur.fetchall()
        cur = await conn.execute(self._sql[Sql.WORKFLOW_CURRENT], {"ids": ids})
        rows_of: dict[str, list[tuple[Any, ...]]] = {}  # (key, job id, status, parents)
        for wf_id, *row in await cur.fetchall():
            rows_of.setdefault(str(wf_id), []).append(tuple(row))
        found = {}
        for wf_id, name, created_at, cancelled in heads:
            rows = rows_of.get(str(wf_id), [])
            keys = {job_id: key for key, job_id, _, _ in rows}
            steps = [
                StepState(
                    key, job_id, Status(status), [keys[p] for p in parents or () if p in keys]
                )
                for key, job_id, status, parents in rows
            ]
            found[str(wf_id)] = Workflow(
                id=wf_id,
                name=name,
                status=workflow_status(cancelled, (s.status for s in steps)),
                created_at=created_at,
                steps=steps,
            )
        return found

    async def get(self, workflow_id: str) -> Workflow | None:
        """One workflow with its steps' live statuses."""
        async with self._db.connection() as conn:
            return await self._read(conn, workflow_id)

    async def page(self, status: WorkflowStatus | None, limit: int, offset: int) -> Page:
        """Workflows newest first, of `status` when given; the total from the counts."""
        params = {"status": status, "limit": limit, "offset": offset}
        listing = Sql.WORKFLOW_LIST_ALL if status is None else Sql.WORKFLOW_LIST
        async with self._db.connection() as conn:
            cur = await conn.execute(self._sql[listing], params)
            ids = [str(row[0]) for row in await cur.fetchall()]
            workflows = await self._read_many(conn, ids)
            found = [workflows.get(wf_id) for wf_id in ids]
        counts = (await self.counts()).by_status
        total = sum(counts.values()) if status is None else counts[status]
        return Page([w for w in found if w is not None], total)

    async def counts(self) -> WorkflowCounts:
        """Workflows by status, and steps waiting: from the counts kept, with the
        workflows moved since they were last settled (`sql/flow_counts.py`)."""
        rows = await self._db.execute(self._sql[Sql.WORKFLOW_COUNTS], {})
        by_status = {str(s): 0 for s in WorkflowStatus}
        waiting = 0
        for status, count in rows:
            if status is None:
                waiting = int(count)
            else:
                by_status[status] = int(count)
        return WorkflowCounts(by_status, waiting)

    async def cancel(self, workflow_id: str) -> tuple[Workflow, list[tuple[Job, str | None]]]:
        """Cancel every unfinished step, in one transaction; the jobs and their tokens."""
        if not pg_rows.is_uuid(workflow_id):
            raise NotFound(f"workflow {workflow_id} not found")
        params = {"id": workflow_id, "error": WORKFLOW_CANCELLED, "node": self.node_id}
        async with self._db.connection() as conn, self._db.transaction(conn):
            if await self._db.fetchone(conn, self._sql[Sql.WORKFLOW_CANCEL], params) is None:
                if await self._read(conn, workflow_id) is None:
                    raise NotFound(f"workflow {workflow_id} not found")
                raise InvalidState(f"workflow {workflow_id} is already cancelled", "cancelled")
            cur = await conn.execute(self._sql[Sql.WORKFLOW_CANCEL_STEPS], params)
            cancelled = [(pg_rows.job(r), r[N_JOB_FIELDS]) for r in await cur.fetchall()]
            found = await self._read(conn, workflow_id)
        assert found is not None
        for job, token in cancelled:
            if token is not None:
                self._wakeups.freed(job)
        return found, cancelled
