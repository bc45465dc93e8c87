"""A workflow's steps inside one SQLite transaction (`Tx`): the steps waiting on a step,
a step's result handed to them when it is done, the steps its failure cancels, a
replayed step taking its old place, and the workflow's record. The rules are the memory
store's (`memory/workflows.py`), written over rows."""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec
from goqueue.supervisor.common.enums import EventKind, Status
from goqueue.supervisor.common.jobs import Job
from goqueue.supervisor.common.steps import dependent_error, workflow_status
from goqueue.supervisor.store.memory.flows import RESULTS, FlowRecord
from goqueue.supervisor.store.sqlite.rows import Row, encode

if TYPE_CHECKING:  # `rules` cancels a failed step's dependents through this module
    from goqueue.supervisor.store.sqlite.rules import Tx

FLOW = msgspec.json.Decoder(FlowRecord)
NULL = msgspec.Raw(b"null")


def children(tx: Tx, job_id: str) -> list[str]:
    """The steps waiting for `job_id`, in creation order."""
    return [
        c
        for (c,) in tx.conn.execute(
            "SELECT child_id FROM workflow_edges WHERE parent_id = ? ORDER BY rowid", (job_id,)
        )
    ]


def descendants(tx: Tx, job_id: str) -> list[str]:
    """Every step depending on `job_id`, directly or not, parents before children."""
    seen: dict[str, None] = {}
    frontier = children(tx, job_id)
    while frontier:
        child = frontier.pop(0)
        if child not in seen:
            seen[child] = None
            frontier.extend(children(tx, child))
    return list(seen)


def release_children(tx: Tx, parent: Row) -> list[Job]:
    """A step is done: hand its result to its waiting children, and make pending those
    whose last parent it was."""
    job = parent.job
    if job.workflow_id is None or job.step_key is None:
        return []
    result = job.result if job.result is not None else NULL
    released: list[Job] = []
    for child_id in children(tx, job.id):
        row = tx.load(child_id)
        if row is None or row.job.status != Status.WAITING:
            continue
        results = RESULTS.decode(row.job.parents or b"{}")
        results[job.step_key] = result
        row.job.parents = msgspec.Raw(encode(results))
        row.waiting_on = (row.waiting_on or 1) - 1
        if row.waiting_on == 0:
            row.waiting_on = None
            row.job.run_at = max(row.job.run_at, tx.now)
            tx.make_pending(row)
            released.append(row.job)
        tx.save(row)
    return released


def cancel_dependents(tx: Tx, failed: Row) -> None:
    """A step failed for good: cancel every step waiting on it, directly or not, each
    naming it."""
    job = failed.job
    if job.workflow_id is None or job.step_key is None:
        return
    error = dependent_error(job.step_key)
    for job_id in descendants(tx, job.id):
        row = tx.load(job_id)
        if row is not None and row.job.status == Status.WAITING:
            tx.cancel(row, error, error, dependents=False)


def flow(tx: Tx, workflow_id: str) -> FlowRecord | None:
    """A workflow's record."""
    found = tx.conn.execute("SELECT record FROM workflows WHERE id = ?", (workflow_id,)).fetchone()
    return None if found is None else FLOW.decode(found[0])


def save_flow(tx: Tx, record: FlowRecord) -> None:
    """Write a workflow's record back (its status is settled at the call's end)."""
    tx.conn.execute("UPDATE workflows SET record = ? WHERE id = ?", (encode(record), record.id))
    tx.flows.add(record.id)


def settle(tx: Tx, workflow_id: str) -> None:
    """Keep a workflow's status in its row as `workflow_status` rules it now, over its
    current steps (a step pruned was done); the triggers count the move."""
    record = flow(tx, workflow_id)
    if record is None:
        return
    kept = dict(tx.conn.execute("SELECT id, status FROM jobs WHERE workflow_id = ?", (record.id,)))
    now = workflow_status(
        record.cancelled,
        (Status(kept.get(job_id, Status.DONE)) for job_id in record.steps.values()),
    )
    tx.conn.execute(
        "UPDATE workflows SET status = ? WHERE id = ? AND status <> ?", (now, record.id, now)
    )


def resume(tx: Tx, old: Job, fresh: Row) -> None:
    """A dead-lettered step was replayed as `fresh`: it takes the old job's place, and the
    steps its failure cancelled wait again (for their parents not done)."""
    record = None if old.workflow_id is None else flow(tx, old.workflow_id)
    if record is None or old.step_key is None or record.cancelled:
        return
    new = fresh.job
    new.workflow_id, new.step_key = old.workflow_id, old.step_key
    new.parent_ids, new.parents = old.parent_ids, old.parents
    tx.save(fresh)
    if new.id != old.id:
        record.steps[old.step_key] = new.id
        save_flow(tx, record)
        for column in ("parent_id", "child_id"):
            tx.conn.execute(
                f"UPDATE workflow_edges SET {column} = ? WHERE {column} = ?", (new.id, old.id)
            )
        for child_id in children(tx, new.id):
            child = tx.load(child_id)
            if child is not None and child.job.parent_ids is not None:
                ids = child.job.parent_ids
                child.job.parent_ids = [new.id if p == old.id else p for p in ids]
                tx.save(child)
    for job_id in descendants(tx, new.id):
        _wait_again(tx, job_id, new.id)


def _wait_again(tx: Tx, job_id: str, replayed: str) -> None:
    row = tx.load(job_id)
    if row is None or row.job.status != Status.CANCELLED or row.job.parent_ids is None:
        return
    parents = [tx.load(p) for p in row.job.parent_ids]
    done = [p.job for p in parents if p is not None and p.job.status == Status.DONE]
    if len(done) == len(row.job.parent_ids):  # cannot be while a parent is replayed
        return
    row.waiting_on = len(row.job.parent_ids) - len(done)
    results = {p.step_key or "": p.result or NULL for p in done}
    job = row.job
    job.parents = msgspec.Raw(encode(results))
    job.finished_at, job.last_error = None, None
    tx.set_status(row, Status.WAITING)
    tx.event(row, EventKind.REPLAYED, f"waits again for {replayed}")
    tx.save(row)
