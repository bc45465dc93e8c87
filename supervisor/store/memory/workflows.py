"""The in-memory store's workflows: creation, release of waiting steps, cancellation of
a failed step's dependents, resumption on replay, reads and cancel.

Each method runs in one synchronous step of the event loop (it never awaits), so a
parent's outcome and its children's release are one atomic change, as a PostgreSQL
transaction makes them."""

from __future__ import annotations

from datetime import datetime

import msgspec
from goqueue.supervisor.common.enums import TERMINAL, EventKind, Status, WorkflowStatus
from goqueue.supervisor.common.errors import IdempotencyMismatch, InvalidState, NotFound
from goqueue.supervisor.common.jobs import Job
from goqueue.supervisor.common.reads import Page
from goqueue.supervisor.common.steps import (
    WORKFLOW_CANCELLED,
    Workflow,
    WorkflowCounts,
    dependent_error,
)
from goqueue.supervisor.store.memory.flows import FlowRecord, workflow_of
from goqueue.supervisor.store.memory.reads import MemoryReads
from goqueue.supervisor.store.new_workflow import NewWorkflow, WorkflowCreated


class MemoryWorkflows(MemoryReads):
    """Workflows over the in-memory store's state (see the module)."""

    async def create_workflow(self, new: NewWorkflow) -> WorkflowCreated:
        """Store every step at once: roots pending, the others waiting."""
        flows = self._flows
        if new.idempotency_key is not None:
            seen = flows.idempotency.get(new.idempotency_key)
            if seen is not None:
                if seen[0] != (new.request_hash or ""):
                    raise IdempotencyMismatch(seen[1])
                found = self._workflow(seen[1])
                if found is not None:
                    return WorkflowCreated(found, created=False)
        roots = sum(1 for step in new.steps if not step.after)
        self._check_room(roots)
        now = self.clock()
        ids: dict[str, str] = {}
        for step in new.steps:
            job = Job.from_spec(step.new.spec, now=now, max_retries=step.new.max_retries)
            job.seq = next(self._seq)
            job.workflow_id, job.step_key = new.id, step.key
            job.parent_ids = [ids[key] for key in step.after]
            ids[step.key] = job.id
            self._jobs[job.id] = job
            for parent in job.parent_ids:
                flows.children.setdefault(parent, []).append(job.id)
            if job.parent_ids:
                job.status = Status.WAITING
                job.parents = flows.parents_json(job.id)
                flows.unfinished[job.id] = len(job.parent_ids)
            self._counts[job.status] += 1
            self._event(job, EventKind.ENQUEUED, now, f"workflow {new.id}")
            if not job.parent_ids:
                self._make_pending(job, now)
        flows.flows[new.id] = FlowRecord(
            id=new.id,
            name=new.name,
            created_at=now,
            steps=ids,
            seq=next(self._seq),
            idempotency_key=new.idempotency_key,
            request_hash=new.request_hash or "",
        )
        if new.idempotency_key is not None:
            flows.idempotency[new.idempotency_key] = (new.request_hash or "", new.id)
        found = self._workflow(new.id)
        assert found is not None
        return WorkflowCreated(found, created=True)

    def _release_children(self, parent: Job, now: datetime) -> list[Job]:
        """A step is done: hand its result to its waiting children, and make pending
        those whose last parent it was (exactly once: this runs once per success)."""
        if parent.workflow_id is None or parent.step_key is None:
            return []
        flows = self._flows
        released: list[Job] = []
        result = parent.result if parent.result is not None else msgspec.Raw(b"null")
        for child_id in flows.children.get(parent.id, ()):
            child = self._jobs.get(child_id)
            if child is None or child.status != Status.WAITING:
                continue
            flows.results.setdefault(child_id, {})[parent.step_key] = result
            child.parents = flows.parents_json(child_id)
            flows.unfinished[child_id] -= 1
            if flows.unfinished[child_id] == 0:
                del flows.unfinished[child_id]
                self._set_status(child, Status.PENDING, now)
                child.run_at = max(child.run_at, now)
                self._make_pending(child, now)
                released.append(child)
        return released

    def _cancel_dependents(self, failed: Job, now: datetime) -> list[Job]:
        """A step failed for good: cancel every step depending on it, naming it."""
        if failed.workflow_id is None or failed.step_key is None:
            return []
        error = dependent_error(failed.step_key)
        cancelled: list[Job] = []
        for job_id in self._flows.descendants(failed.id):
            job = self._jobs.get(job_id)
            if job is None or job.status != Status.WAITING:
                continue
            self._flows.unfinished.pop(job_id, None)
            job.last_error = error
            job.finished_at = now
            self._set_status(job, Status.CANCELLED, now)
            self._event(job, EventKind.CANCELLED, now, error)
            self._retire(job)
            cancelled.append(job)
        return cancelled

    def _resume(self, old: Job, fresh: Job, now: datetime) -> None:
        """A dead-lettered step was replayed as `fresh`: it takes the old job's place,
        and the steps its failure cancelled wait again (for their parents not done)."""
        flow = None if old.workflow_id is None else self._flows.flows.get(old.workflow_id)
        if flow is None or old.step_key is None or flow.cancelled:
            return
        flows = self._flows
        fresh.workflow_id, fresh.step_key = old.workflow_id, old.step_key
        fresh.parent_ids, fresh.parents = old.parent_ids, old.parents
        flow.steps[old.step_key] = fresh.id
        children = flows.children.pop(old.id, [])
        flows.children[fresh.id] = children
        for parent in fresh.parent_ids or ():
            siblings = flows.children.get(parent, [])
            flows.children[parent] = [fresh.id if c == old.id else c for c in siblings]
        for child_id in children:
            child = self._jobs.get(child_id)
            if child is not None and child.parent_ids is not None:
                child.parent_ids = [fresh.id if p == old.id else p for p in child.parent_ids]
        for job_id in flows.descendants(fresh.id):
            job = self._jobs.get(job_id)
            if job is None or job.status != Status.CANCELLED or job.parent_ids is None:
                continue
            done = [p for p in map(self._jobs.get, job.parent_ids) if p and p.status == "done"]
            if len(done) == len(job.parent_ids):  # cannot be while a parent is replayed
                continue
            flows.unfinished[job_id] = len(job.parent_ids) - len(done)
            null = msgspec.Raw(b"null")
            flows.results[job_id] = {p.step_key or "": p.result or null for p in done}
            job.parents = flows.parents_json(job_id)
            job.finished_at, job.last_error = None, None
            self._set_status(job, Status.WAITING, now)
            self._event(job, EventKind.REPLAYED, now, f"waits again for {fresh.id}")

    def _forget(self, job_id: str) -> None:
        """A pruned step takes its workflow with it once no step of it is kept (the
        workflow is as old as its newest step; its edges and results go too)."""
        job = self._jobs.get(job_id)
        super()._forget(job_id)
        if job is None or job.workflow_id is None or job_id in self._jobs:
            return
        flow = self._flows.flows.get(job.workflow_id)
        if flow is None or any(step in self._jobs for step in reversed(flow.steps.values())):
            return  # the newest steps, the likeliest kept, are looked at first
        self._drop_flow(flow)

    def _drop_flow(self, flow: FlowRecord) -> None:
        """Forget a workflow none of whose steps is kept any more."""
        flows = self._flows
        for step in flow.steps.values():
            flows.children.pop(step, None)
            flows.results.pop(step, None)
            flows.unfinished.pop(step, None)
        del flows.flows[flow.id]
        if flow.idempotency_key is not None:
            flows.idempotency.pop(flow.idempotency_key, None)

    # -- reads and cancel ------------------------------------------------------------

    def _workflow(self, workflow_id: str) -> Workflow | None:
        flow = self._flows.flows.get(workflow_id)
        if flow is None:
            return None
        kept = {
            job_id: (job.status, job.parent_ids)
            for job_id in flow.steps.values()
            if (job := self._jobs.get(job_id)) is not None
        }
        return workflow_of(flow, kept)

    async def get_workflow(self, workflow_id: str) -> Workflow | None:
        """One workflow with its steps' live statuses."""
        return self._workflow(workflow_id)

    async def list_workflows(self, status: WorkflowStatus | None, limit: int, offset: int) -> Page:
        """Workflows newest first, of `status` if given."""
        newest = sorted(self._flows.flows.values(), key=lambda f: f.seq, reverse=True)
        found = [w for f in newest if (w := self._workflow(f.id)) is not None]
        if status is not None:
            found = [w for w in found if w.status == status]
        return Page(found[offset : offset + limit], len(found))

    async def workflow_counts(self) -> WorkflowCounts:
        """Workflows by status, and steps waiting."""
        by_status = dict.fromkeys(WorkflowStatus, 0)
        for flow_id in self._flows.flows:
            found = self._workflow(flow_id)
            if found is not None:
                by_status[found.status] += 1
        waiting = self._counts[Status.WAITING]
        return WorkflowCounts({str(k): n for k, n in by_status.items()}, waiting)

    async def cancel_workflow(
        self, workflow_id: str
    ) -> tuple[Workflow, list[tuple[Job, str | None]]]:
        """Cancel every unfinished step; the running ones' lease tokens come back so the
        engine can kill their workers."""
        flow = self._flows.flows.get(workflow_id)
        if flow is None:
            raise NotFound(f"workflow {workflow_id} not found")
        if flow.cancelled:
            raise InvalidState(f"workflow {workflow_id} is already cancelled", "cancelled")
        now = self.clock()
        flow.cancelled = True
        cancelled: list[tuple[Job, str | None]] = []
        for job_id in flow.steps.values():
            job = self._jobs.get(job_id)
            if job is None or job.status in TERMINAL:
                continue
            token = self._tokens.get(job_id)
            if token is not None:
                self._drop_lease(token)
            if job.status == Status.PENDING:
                self._pending.discard(job, now.timestamp())
            self._flows.unfinished.pop(job_id, None)
            job.finished_at, job.last_error = now, WORKFLOW_CANCELLED
            self._set_status(job, Status.CANCELLED, now)
            self._event(job, EventKind.CANCELLED, now, WORKFLOW_CANCELLED)
            self._retire(job)
            cancelled.append((job, token))
        found = self._workflow(workflow_id)
        assert found is not None
        return found, cancelled
