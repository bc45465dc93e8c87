"""The SQLite store's rules, applied to rows inside one transaction (`Tx`): inserting a
job, leasing and starting it, its statuses, dead letters and chained jobs (a workflow's
steps are `steps.py`'s).

The rules are the memory store's, written over rows: a `Tx` loads the rows a call
touches (each once: a second load returns the same `Row`), changes them, and writes
each one back with `save`. One `Tx` is one call, run in a savepoint of the turn's
transaction (`database.py`), so a call that raises changes nothing."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

import msgspec
from goqueue.supervisor.common.deliveries import event_of, job_body
from goqueue.supervisor.common.enums import TERMINAL, EventKind, Status
from goqueue.supervisor.common.errors import (
    UNIQUE_HELD,
    DuplicateJob,
    IdempotencyMismatch,
    StoreFull,
)
from goqueue.supervisor.common.jobs import (
    DeadLetter,
    Enqueued,
    Job,
    JobSpec,
    debounced_run_at,
    new_id,
)
from goqueue.supervisor.store.base import NewJob
from goqueue.supervisor.store.sqlite import steps
from goqueue.supervisor.store.sqlite.keyed import Keys
from goqueue.supervisor.store.sqlite.rows import (
    INSERT,
    INSERT_LETTER,
    SELECT_ROW,
    Group,
    Row,
    letter_row,
)
from goqueue.supervisor.store.sqlite.schema import LIVE_SQL

T = TypeVar("T")
DEDUPE, IDEMPOTENCY = "dedupe", "idempotency"
INSERT_DELIVERY = (
    "INSERT OR IGNORE INTO webhook_deliveries"
    " (id, job_id, event, url, body, created_at, next_attempt_at) VALUES (?, ?, ?, ?, ?, ?, ?)"
)


class PausedQueues:
    """The paused queues, read from the file once and kept as they change (one node owns
    the file, so nothing else changes them); read again after a change that failed."""

    def __init__(self) -> None:
        self._names: set[str] | None = None

    def of(self, conn: sqlite3.Connection) -> set[str]:
        """The paused queues (as this transaction sees them)."""
        if self._names is None:
            self._names = {q for (q,) in conn.execute("SELECT queue FROM paused_queues")}
        return self._names

    def set(self, conn: sqlite3.Connection, queue: str, paused: bool) -> None:
        """Pause or resume `queue`, in the file and here."""
        names = self.of(conn)
        if paused:
            conn.execute("INSERT OR IGNORE INTO paused_queues (queue) VALUES (?)", (queue,))
            names.add(queue)
        else:
            conn.execute("DELETE FROM paused_queues WHERE queue = ?", (queue,))
            names.discard(queue)

    def forget(self) -> None:
        """A change failed: read them from the file again."""
        self._names = None


@dataclass(frozen=True, slots=True)
class Context:
    """What a transaction needs of its store (constant while the store is open)."""

    node_id: str
    lease_seconds: float
    max_pending: int | None
    idempotency_ttl: float
    max_events_per_job: int
    limits: Mapping[str, int | None]  # this node's declared types and their limits
    next_seq: Callable[[], int]
    wake: Callable[[], None]
    # The rows of the jobs this node holds a lease on, as last written: a cache bounded
    # by the attempts in flight, so a start or an outcome does not read its row back.
    # A call loads a copy of a cached row (`Tx.load`): the cached row's job is the one
    # in the leases handed out, which a call whose commit then fails must leave as the
    # file has it (a start that did not commit must not read as started; a heartbeat
    # only extends the row's lease, which no lease handed out shows). A call that fails
    # forgets every row it touched (`Tx.forget`).
    leased: dict[str, Row]
    paused: PausedQueues
    keys: Keys  # the keyed jobs' turns and counts, told of each keyed row written


class Tx:
    """One call's work on the rows, at one instant (`now`)."""

    conn: sqlite3.Connection

    def __init__(self, ctx: Context, now: datetime) -> None:
        self.ctx = ctx
        self.now = now
        self.ts = now.timestamp()
        self._rows: dict[str, Row] = {}
        self.counts: dict[Group, int] = {}  # jobs by group this call moved
        self.flows: set[str] = set()  # workflows whose status this call may have moved

    def on(self, conn: sqlite3.Connection) -> Tx:
        """This call, on `conn` (inside its savepoint)."""
        self.conn = conn
        return self

    def settled(self, out: T) -> T:
        """`out`, once each workflow whose steps this call moved holds its status anew
        (the call's last step, inside its savepoint)."""
        for workflow_id in self.flows:
            steps.settle(self, workflow_id)
        return out

    # -- rows ------------------------------------------------------------------------

    def load(self, job_id: str) -> Row | None:
        """The row of `job_id` (the same `Row` for every load in this call; this call's
        own, not one cached or handed out before it)."""
        row = self._rows.get(job_id) or self._cached(job_id)
        if row is None:
            found = self.conn.execute(SELECT_ROW + " WHERE id = ?", (job_id,)).fetchone()
            if found is None:
                return None
            row = Row.read(found)
        self._rows[job_id] = row
        return row

    def _cached(self, job_id: str) -> Row | None:
        """A copy of the cached row of `job_id`, if there is one (`Context.leased`)."""
        cached = self.ctx.leased.get(job_id)
        return None if cached is None else cached.copy()

    def adopt(self, row: Row) -> None:
        """Take a row read elsewhere as this call's row of its job."""
        self._rows[row.job.id] = row

    def load_where(self, where: str, params: tuple[Any, ...] = ()) -> list[Row]:
        """The rows `where` selects, in its order."""
        out = []
        for found in self.conn.execute(f"{SELECT_ROW} {where}", params):
            row = Row.read(found)
            job_id = row.job.id
            row = self._rows.get(job_id) or self._cached(job_id) or row
            self._rows[job_id] = row
            out.append(row)
        return out

    def save(self, row: Row) -> None:
        """Write `row` back (its new events appended to its trail)."""
        was = row.moved(self.counts)
        job = row.job
        # a step finished or back from finished: its workflow's status may move
        finishing = was is not job.status and (was in TERMINAL or job.status in TERMINAL)
        if finishing and job.workflow_id is not None:
            self.flows.add(job.workflow_id)
        self.conn.execute(*row.update())
        self._mind(row)
        if row.job.concurrency_key is not None:
            self.ctx.keys.wrote(row.job, was)

    def _mind(self, row: Row) -> None:
        """Keep a leased row in the cache of leased rows, or drop it from there."""
        if row.lease_token is None:
            self.ctx.leased.pop(row.job.id, None)
        else:
            self.ctx.leased[row.job.id] = row

    def forget(self) -> None:
        """This call failed (or the commit it was in): the rows it touched, changed in
        memory and not in the file, leave the cache."""
        for job_id in self._rows:
            self.ctx.leased.pop(job_id, None)

    def event(
        self, row: Row, kind: EventKind, detail: str | None = None, tb: str | None = None
    ) -> None:
        """Add an event to `row`'s trail, written with its next `save`."""
        row.event(kind, self.now, self.ctx.node_id, detail, tb, self.ctx.max_events_per_job)

    def paused(self) -> set[str]:
        """The queues dispatch skips."""
        return self.ctx.paused.of(self.conn)

    def pending_count(self) -> int:
        """Pending jobs in every queue."""
        (n,) = self.conn.execute(
            "SELECT coalesce(sum(n), 0) FROM job_counts WHERE status = 'pending'"
        ).fetchone()
        return int(n)

    def check_room(self, adding: int = 1) -> None:
        """Raise StoreFull when `--max-pending` is set and `adding` more would pass it."""
        limit = self.ctx.max_pending
        if limit is not None and self.pending_count() + adding > limit:
            raise StoreFull(f"the queue is full ({limit} pending jobs)")

    # -- enqueue ---------------------------------------------------------------------

    def enqueue(self, new: NewJob, detail: str | None = None) -> Enqueued:
        """Store one job after the idempotency, dedupe and unique key checks."""
        ts = self.ts
        if new.idempotency_key is not None:
            seen = self._key(IDEMPOTENCY, new.idempotency_key)
            if seen is not None:
                if seen[1] != (new.request_hash or ""):
                    raise IdempotencyMismatch(seen[0])
                row = self.load(seen[0])
                if row is not None:
                    return Enqueued(row.job, created=False)
        spec = new.spec
        if spec.debounce_key is not None:
            replaced = self._debounce(spec)
            if replaced is not None:
                self._remember(new, replaced.job.id, [])
                return Enqueued(replaced.job, created=False)
        if spec.dedupe_key is not None and spec.dedupe_window_seconds:
            held = self._key(DEDUPE, spec.dedupe_key)
            if held is not None:
                raise DuplicateJob(held[0])
        if spec.unique_key is not None:
            holder = self.unique_holder(spec.unique_key)
            if holder is not None:
                raise DuplicateJob(holder, UNIQUE_HELD)
        self.check_room()
        row = self.insert(
            spec,
            new.max_retries,
            new.parent_id,
            start=new.start is not None,
            trace=new.trace_context,
            detail=detail,
        )
        job_id = row.job.id
        keys = []
        if spec.dedupe_key is not None and spec.dedupe_window_seconds:
            keys.append((DEDUPE, spec.dedupe_key, job_id, "", ts + spec.dedupe_window_seconds))
        self._remember(new, job_id, keys)
        lease = row.lease() if row.job.status == Status.RUNNING else None
        return Enqueued(row.job, created=True, lease=lease)

    def _remember(self, new: NewJob, job_id: str, keys: list[tuple[Any, ...]]) -> None:
        """Write the keys of an enqueue (`keys`, and its idempotency key)."""
        if new.idempotency_key is not None:
            expires = self.ts + self.ctx.idempotency_ttl
            keys.append((IDEMPOTENCY, new.idempotency_key, job_id, new.request_hash or "", expires))
        if keys:
            self.conn.executemany("INSERT OR REPLACE INTO job_keys VALUES (?, ?, ?, ?, ?)", keys)

    def _debounce(self, spec: JobSpec) -> Row | None:
        """The row of the job of `spec`'s type and debounce key that has not started, its
        payload replaced and put off (`debounced_run_at`); None when there is none."""
        found = self.load_where(
            "WHERE type = ? AND debounce_key = ? AND status = 'pending'"
            " AND json_extract(CAST(job AS TEXT), '$.attempts') = 0 ORDER BY seq LIMIT 1",
            (spec.type, spec.debounce_key),
        )
        if not found:
            return None
        row = found[0]
        job = row.job
        job.payload = spec.payload
        job.run_at = debounced_run_at(spec, job.created_at, self.now)
        job.updated_at = self.now
        self.event(row, EventKind.DEBOUNCED)
        self.save(row)
        self.ctx.wake()  # its due time moved: the dispatcher's timer may have to
        return row

    def _key(self, kind: str, key: str) -> tuple[str, str] | None:
        """(job id, request hash) of a key not expired."""
        found = self.conn.execute(
            "SELECT job_id, request_hash FROM job_keys WHERE kind = ? AND key = ? AND expires > ?",
            (kind, key, self.ts),
        ).fetchone()
        return None if found is None else (found[0], found[1])

    def unique_holder(self, key: str, besides: str = "") -> str | None:
        """The unfinished job holding unique key `key` (other than `besides`)."""
        found = self.conn.execute(
            f"SELECT id FROM jobs WHERE unique_key = ? AND status IN {LIVE_SQL} AND id != ?",
            (key, besides),
        ).fetchone()
        return None if found is None else str(found[0])

    def insert(
        self,
        spec: JobSpec,
        max_retries: int,
        parent_id: str | None,
        *,
        start: bool = False,
        trace: dict[str, str] | None = None,
        detail: str | None = None,
        prepare: Callable[[Row], None] | None = None,
    ) -> Row:
        """Store a new job, pending; or (`start`) running for this node, when it is due
        now, its queue is not paused and its type has no limit (a worker waits for it: no
        claim is woken). `prepare` sets what else the row holds before it is written."""
        job = Job.from_spec(spec, now=self.now, max_retries=max_retries, parent_id=parent_id)
        job.seq = self.ctx.next_seq()
        job.trace_context = trace
        row = self._rows[job.id] = Row(job)
        self.event(row, EventKind.ENQUEUED, detail)
        if prepare is not None:
            prepare(row)
        if job.status == Status.PENDING:  # not a waiting workflow step
            if (
                start
                and job.run_at <= self.now
                and self.ctx.limits.get(job.type) is None
                and job.queue not in self.paused()
            ):
                self.lease(row, started=True)
            else:
                self.ctx.wake()
        row.moved(self.counts)
        self.conn.execute(INSERT, row.insert())
        self._mind(row)
        if job.concurrency_key is not None:
            self.ctx.keys.wrote(job, None)
        return row

    def follow_up(self, spec: JobSpec | None, parent: Job) -> list[Job]:
        """Chain a template (past `--max-pending`: its parent already had its place)."""
        if spec is None:
            return []
        child = self.insert(spec, spec.max_retries_value, parent.id, trace=parent.trace_context)
        return [child.job]

    # -- leases and statuses ---------------------------------------------------------

    def lease(self, row: Row, started: bool) -> None:
        """Lease `row` to this node: its attempt started, or only claimed."""
        row.lease_token = new_id()
        row.lease_owner = self.ctx.node_id
        row.lease_expires = self.ts + self.ctx.lease_seconds
        if started:
            self.begin(row)
        else:
            self.set_status(row, Status.CLAIMED)
            row.job.started_at = None

    def begin(self, row: Row) -> None:
        """The attempt starts: it is charged, and the job is running."""
        job = row.job
        self.set_status(row, Status.RUNNING)
        job.attempts += 1
        job.started_at = self.now
        self.event(row, EventKind.STARTED)

    def set_status(self, row: Row, status: Status) -> None:
        """Move the job to `status`; a terminal one owes its webhook, written with it."""
        job = row.job
        job.status = status
        job.updated_at = self.now
        if status in TERMINAL and job.webhook_url is not None:
            event = event_of(job)
            if event is not None:
                self.conn.execute(
                    INSERT_DELIVERY,
                    (new_id(), job.id, event, job.webhook_url, job_body(job), self.ts, self.ts),
                )

    def make_pending(self, row: Row) -> None:
        """Pending again (claimable once due); the dispatcher hears of it."""
        self.set_status(row, Status.PENDING)
        self.ctx.wake()

    def record_error(self, row: Row, error: str, traceback: str | None) -> None:
        """Keep an attempt's error with the job."""
        row.job.record_error(error, traceback, self.now)

    def retry_in(self, row: Row, seconds: float) -> None:
        """Pending again, due `seconds` from now."""
        row.job.run_at = self.now + timedelta(seconds=seconds)
        self.make_pending(row)

    def dead_letter(self, row: Row) -> DeadLetter:
        """Retries exhausted: failed, archived as a dead letter, dependents cancelled."""
        job = row.job
        job.finished_at = self.now
        self.set_status(row, Status.FAILED)
        dead = DeadLetter(
            id=new_id(),
            job_id=job.id,
            job=msgspec.structs.replace(job),
            errors=job.errors,
            created_at=self.now,
        )
        self.conn.execute(INSERT_LETTER, letter_row(dead))
        self.event(row, EventKind.DEAD_LETTERED, dead.id)
        self.save(row)
        steps.cancel_dependents(self, row)
        return dead

    def cancel(
        self,
        row: Row,
        detail: str | None = None,
        error: str | None = None,
        *,
        dependents: bool = True,
    ) -> str | None:
        """Cancel an unfinished job (and, with `dependents`, the steps waiting on it);
        the token of the lease it had, if any."""
        token = row.lease_token
        row.drop_lease()
        row.waiting_on = None
        job = row.job
        job.finished_at = self.now
        if error is not None:
            job.last_error = error
        self.set_status(row, Status.CANCELLED)
        self.event(row, EventKind.CANCELLED, detail)
        self.save(row)
        if dependents:
            steps.cancel_dependents(self, row)
        return token
