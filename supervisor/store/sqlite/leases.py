"""An attempt's row under its lease, inside a SQLite store's transaction: still held,
reaped when the lease ran out, or reopened for an outcome that came late (the rules in
`store/base.py`)."""

from __future__ import annotations

from collections.abc import Callable

from goqueue.supervisor.common.enums import EventKind, Status
from goqueue.supervisor.common.jobs import Lease
from goqueue.supervisor.store.base import LATE_OUTCOME
from goqueue.supervisor.store.sqlite import steps
from goqueue.supervisor.store.sqlite.dead_letters import letter
from goqueue.supervisor.store.sqlite.rows import Row
from goqueue.supervisor.store.sqlite.rules import Tx


def held(tx: Tx, lease: Lease, *statuses: Status) -> Row | None:
    """The row, if `lease` still holds it in one of `statuses` (running if none)."""
    row = tx.load(lease.job.id)
    if row is None or row.lease_token != lease.token:
        return None
    return row if row.job.status in (statuses or (Status.RUNNING,)) else None


def outcome_of(tx: Tx, lease: Lease) -> Row | None:
    """The row an attempt's outcome is written to, its lease dropped: held by `lease`,
    or reopened for a late outcome (`_salvage`); None when the outcome is refused."""
    row = held(tx, lease) or _salvage(tx, lease)
    if row is not None:
        row.drop_lease()
    return row


def reap(tx: Tx, row: Row, retry_delay: Callable[[int], float] | None) -> None:
    """A lease ran out: a claim goes back in its place at no cost; a running attempt
    is lost (counted), retried after its delay or dead-lettered."""
    job = row.job
    error = f"lease expired (holder {row.lease_owner} lost)"
    token = row.lease_token
    row.drop_lease()
    if job.status == Status.CLAIMED:
        tx.make_pending(row)
        tx.event(row, EventKind.RELEASED, error)
        tx.save(row)
        return
    tx.event(row, EventKind.LEASE_EXPIRED)
    row.reaped_token = token
    tx.record_error(row, error, None)
    if job.attempts > job.max_retries:
        tx.event(row, EventKind.ATTEMPT_FAILED, error)
        tx.dead_letter(row)
        return
    tx.retry_in(row, 0.0 if retry_delay is None else retry_delay(job.attempts))
    tx.save(row)


def _salvage(tx: Tx, lease: Lease) -> Row | None:
    """The row of a fenced outcome that arrived late, reopened under its lease, if that
    attempt is the job's last one started and its lease was reaped (the rules in
    `store/base.py`); None when refused."""
    row = tx.load(lease.job.id)
    if row is None or row.reaped_token != lease.token:
        return None
    job = row.job
    if job.attempts != lease.job.attempts:
        return None
    was_failed = job.status == Status.FAILED
    if was_failed:
        dead = letter(tx.conn, job.id, by_job=True)
        if job.on_failure is not None or dead is None:
            return None
        if job.unique_key is not None and tx.unique_holder(job.unique_key, job.id) is not None:
            return None
        tx.conn.execute("DELETE FROM dead_letters WHERE id = ?", (dead.id,))
    elif job.status == Status.CLAIMED:
        row.drop_lease()
    elif job.status != Status.PENDING:
        return None
    row.reaped_token = None
    if job.errors and job.errors[-1].attempt == job.attempts:
        job.errors = job.errors[:-1]
        job.last_error = job.errors[-1].error if job.errors else None
    job.finished_at = None
    tx.set_status(row, Status.RUNNING)
    row.lease_token, row.lease_owner, row.lease_expires = lease.token, lease.owner, tx.ts
    tx.event(row, EventKind.LATE_OUTCOME, LATE_OUTCOME)
    tx.save(row)
    if was_failed:  # a workflow step: the steps its dead letter cancelled wait again
        steps.resume(tx, job, row)
    return row
