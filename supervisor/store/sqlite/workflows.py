"""The SQLite store's workflows: stored whole at once (roots pending, the other steps
waiting on their parents' edges), read with their steps' live statuses, cancelled; each
write on disk before the answer."""

from __future__ import annotations

import sqlite3

import msgspec
from goqueue.supervisor.common.enums import TERMINAL, Status, WorkflowStatus
from goqueue.supervisor.common.errors import IdempotencyMismatch, InvalidState, NotFound
from goqueue.supervisor.common.jobs import Job
from goqueue.supervisor.common.reads import Page
from goqueue.supervisor.common.steps import WORKFLOW_CANCELLED, Workflow, WorkflowCounts
from goqueue.supervisor.store.memory.flows import FlowRecord
from goqueue.supervisor.store.new_workflow import NewWorkflow, WorkflowCreated
from goqueue.supervisor.store.sqlite import reads, steps
from goqueue.supervisor.store.sqlite.calls import Read, Write
from goqueue.supervisor.store.sqlite.rows import Row, encode
from goqueue.supervisor.store.sqlite.rules import Tx
from goqueue.supervisor.store.sqlite.steps import FLOW


class SqliteWorkflows:
    """The workflow calls of a `SqliteStore`, made through its `write` and `read`."""

    def __init__(self, write: Write, read: Read) -> None:
        self._write = write
        self._read = read

    async def create(self, new: NewWorkflow) -> WorkflowCreated:
        """Store every step at once, roots pending and the others waiting; on disk
        before the answer."""

        def work(tx: Tx) -> WorkflowCreated:
            if new.idempotency_key is not None:
                seen = tx.conn.execute(
                    "SELECT id, record FROM workflows WHERE idempotency_key = ?",
                    (new.idempotency_key,),
                ).fetchone()
                if seen is not None:
                    if FLOW.decode(seen[1]).request_hash != (new.request_hash or ""):
                        raise IdempotencyMismatch(seen[0])
                    return WorkflowCreated(_found(tx.conn, seen[0]), created=False)
            tx.check_room(sum(1 for step in new.steps if not step.after))
            _create(tx, new)
            return WorkflowCreated(_found(tx.conn, new.id), created=True)

        return await self._write(work, durable=True)

    async def get(self, workflow_id: str) -> Workflow | None:
        """One workflow with its steps' live statuses."""
        return self._read(lambda c: reads.workflow(c, workflow_id))

    async def page(self, status: WorkflowStatus | None, limit: int, offset: int) -> Page:
        """Workflows newest first, of `status` if given."""
        return self._read(lambda c: reads.workflows(c, status, limit, offset))

    async def counts(self) -> WorkflowCounts:
        """Workflows by status, and steps waiting."""
        return self._read(reads.workflow_counts)

    async def cancel(self, workflow_id: str) -> tuple[Workflow, list[tuple[Job, str | None]]]:
        """Cancel every unfinished step (the running ones' lease tokens come back so the
        engine can kill their workers); on disk before the answer."""

        def work(tx: Tx) -> tuple[Workflow, list[tuple[Job, str | None]]]:
            flow = steps.flow(tx, workflow_id)
            if flow is None:
                raise NotFound(f"workflow {workflow_id} not found")
            if flow.cancelled:
                raise InvalidState(f"workflow {workflow_id} is already cancelled", "cancelled")
            flow.cancelled = True
            steps.save_flow(tx, flow)
            cancelled: list[tuple[Job, str | None]] = []
            for job_id in flow.steps.values():
                row = tx.load(job_id)
                if row is None or row.job.status in TERMINAL:
                    continue
                token = tx.cancel(row, WORKFLOW_CANCELLED, WORKFLOW_CANCELLED)
                cancelled.append((row.job, token))
            return _found(tx.conn, workflow_id), cancelled

        return await self._write(work, durable=True)


def _create(tx: Tx, new: NewWorkflow) -> None:
    """Every step's row, its edges, and the workflow's record."""
    ids: dict[str, str] = {}
    for step in new.steps:
        parents = [ids[key] for key in step.after]

        def prepare(row: Row, parents: list[str] = parents, key: str = step.key) -> None:
            job = row.job
            job.workflow_id, job.step_key, job.parent_ids = new.id, key, parents
            if parents:
                job.status = Status.WAITING
                job.parents = msgspec.Raw(b"{}")
                row.waiting_on = len(parents)

        spec, retries = step.new.spec, step.new.max_retries
        row = tx.insert(spec, retries, None, detail=f"workflow {new.id}", prepare=prepare)
        ids[step.key] = row.job.id
        tx.conn.executemany(
            "INSERT INTO workflow_edges (parent_id, child_id) VALUES (?, ?)",
            [(parent, row.job.id) for parent in parents],
        )
    flow = FlowRecord(
        id=new.id,
        name=new.name,
        created_at=tx.now,
        steps=ids,
        seq=tx.ctx.next_seq(),
        idempotency_key=new.idempotency_key,
        request_hash=new.request_hash or "",
    )
    tx.conn.execute(
        "INSERT INTO workflows (id, seq, record, idempotency_key, status) VALUES (?, ?, ?, ?, ?)",
        (flow.id, flow.seq, encode(flow), flow.idempotency_key, WorkflowStatus.RUNNING),
    )  # running: its steps are all still to run


def _found(conn: sqlite3.Connection, workflow_id: str) -> Workflow:
    """A workflow this call made or found (NotFound if it is gone after all)."""
    found = reads.workflow(conn, workflow_id)
    if found is None:
        raise NotFound(f"workflow {workflow_id} not found")
    return found
