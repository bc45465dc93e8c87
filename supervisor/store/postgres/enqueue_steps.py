"""One enqueue inside a transaction, as the statements it runs (sans I/O).

`keyed_enqueue` claims the idempotency key, then the dedupe key, then inserts the job
with its `enqueued` event: a generator that yields each statement with its parameters
and is sent the statement's first row (None if none). The store runs it on its own
connections (`enqueue.py`), `goqueue.pg` on the caller's, sync or async, inside the
caller's transaction: one definition of the dedupe and idempotency rules for both, over
the statements of `sql/statements.py`.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping, Sequence
from typing import Any, TypeVar

import psycopg
from goqueue.supervisor.common.enums import EventKind
from goqueue.supervisor.common.errors import (
    UNIQUE_HELD,
    DuplicateJob,
    IdempotencyMismatch,
    StoreUnavailable,
)
from goqueue.supervisor.common.jobs import Enqueued, JobSpec, new_id
from goqueue.supervisor.store.base import NewJob
from goqueue.supervisor.store.postgres import rows as pg_rows
from goqueue.supervisor.store.postgres.rows import Row
from goqueue.supervisor.store.postgres.sql.statements import Sql, Statements
from psycopg import AsyncConnection, AsyncCursor, Connection, Cursor

T = TypeVar("T")

Query = tuple[str, Mapping[str, Any]]
Steps = Generator[Query, Row | None, T]

ENQUEUED: Sequence[tuple[EventKind, str | None]] = ((EventKind.ENQUEUED, None),)


def dedupes(spec: JobSpec) -> bool:
    """True when the job holds a dedupe key for a window."""
    return spec.dedupe_key is not None and bool(spec.dedupe_window_seconds)


def insert(
    sql: Statements,
    spec: JobSpec,
    max_retries: int,
    *,
    node: str,
    parent_id: str | None = None,
    job_id: str | None = None,
    events: Sequence[tuple[EventKind, str | None]] = ENQUEUED,
    trace_context: dict[str, str] | None = None,
) -> Query:
    """The statement inserting a pending job with its `events` (kind, detail); it answers
    the whole job (`pg_rows.job`)."""
    params = pg_rows.insert_params(spec, max_retries, parent_id, job_id, trace_context) | {
        "node": node,
        "events": [kind.value for kind, _ in events],
        "details": [detail for _, detail in events],
    }
    return sql[Sql.INSERT_JOB], params


def keyed_enqueue(
    sql: Statements, new: NewJob, *, node: str, idempotency_ttl: float
) -> Steps[Enqueued]:
    """Store `new` inside the caller's transaction (a savepoint, so that a refusal undoes
    only this job). A repeat of its idempotency key answers the original job
    (`created=False`); raises IdempotencyMismatch, DuplicateJob (a dedupe key inside its
    window, or a unique key a live job holds) or StoreUnavailable."""
    job_id = new_id()
    if new.idempotency_key is not None:
        original = yield from _repeated(sql, new, job_id, idempotency_ttl)
        if original is not None:
            return original
    if new.spec.debounce_key is not None:
        replaced = yield from debounce(sql, new, node=node)
        if replaced is not None:
            return replaced
    if dedupes(new.spec):
        params = {
            "key": pg_rows.text(new.spec.dedupe_key),
            "id": job_id,
            "window": new.spec.dedupe_window_seconds,
        }
        if (yield sql[Sql.CLAIM_DEDUPE], params) is None:
            holder = yield sql[Sql.DEDUPE_HOLDER], params
            raise DuplicateJob("unknown" if holder is None else str(holder[0]))
    for _ in range(3):
        row = yield insert(
            sql,
            new.spec,
            new.max_retries,
            node=node,
            parent_id=new.parent_id,
            job_id=job_id,
            trace_context=new.trace_context,
        )
        if row is not None:
            return Enqueued(pg_rows.job(row), created=True)
        # a live job holds the unique key (only that stops the insert); it may have
        # finished since, freeing the key: then the insert is tried again
        holder = yield sql[Sql.UNIQUE_HOLDER], {"key": pg_rows.text(new.spec.unique_key)}
        if holder is not None:
            raise DuplicateJob(str(holder[0]), UNIQUE_HELD)
    raise StoreUnavailable("unique key changed hands concurrently; retry")


def _repeated(
    sql: Statements, new: NewJob, job_id: str, idempotency_ttl: float
) -> Steps[Enqueued | None]:
    """Claim `new`'s idempotency key for `job_id`; the original job when the key names
    one already (a repeat). Raises IdempotencyMismatch or StoreUnavailable."""
    request_hash = pg_rows.text(new.request_hash) or ""
    params = {
        "key": pg_rows.text(new.idempotency_key),
        "hash": request_hash,
        "id": job_id,
        "ttl": idempotency_ttl,
    }
    if (yield sql[Sql.CLAIM_IDEMPOTENCY], params) is not None:
        return None
    held = yield sql[Sql.IDEMPOTENCY_HOLDER], params
    if held is None:  # deleted meanwhile by expiry: ours to take on a retry
        raise StoreUnavailable("idempotency key changed concurrently; retry")
    if held[0] != request_hash:
        raise IdempotencyMismatch(str(held[1]))
    original = yield sql[Sql.GET], {"id": held[1]}
    if original is None:
        raise StoreUnavailable(f"idempotency key names a missing job {held[1]}")
    return Enqueued(pg_rows.job(original), created=False)


def debounce(sql: Statements, new: NewJob, *, node: str) -> Steps[Enqueued | None]:
    """Replace the job of `new`'s type and debounce key that has not started, under the
    key's lock (held to the end of the transaction: one enqueue of a key at a time on
    every node), its idempotency key moved to it; None when there is none."""
    spec = new.spec
    key = pg_rows.text(spec.debounce_key)
    yield sql[Sql.DEBOUNCE_LOCK], {"lock": f"goqueue debounce {spec.type} {key}"}
    params = {
        "type": spec.type,
        "key": key,
        "payload": spec.payload,
        "seconds": spec.debounce_seconds,
        "max": spec.debounce_max_seconds,
        "node": node,
    }
    row = yield sql[Sql.DEBOUNCE], params
    if row is None:
        return None
    job = pg_rows.job(row)
    if new.idempotency_key is not None:
        moved = {"id": job.id, "key": pg_rows.text(new.idempotency_key)}
        yield sql[Sql.IDEMPOTENCY_MOVE], moved
    return Enqueued(job, created=False)


async def run_async(on: AsyncConnection[Row] | AsyncCursor[Row], steps: Steps[T]) -> T:
    """Run `steps` on an async connection or cursor. A database error is thrown into
    them (so they can roll back a savepoint of theirs) before it is raised."""
    try:
        query = next(steps)
        while True:
            try:
                cur = await on.execute(*query)
                row = await cur.fetchone() if _has_rows(cur) else None
            except psycopg.Error as exc:
                query = steps.throw(exc)
            else:
                query = steps.send(row)
    except StopIteration as done:
        result: T = done.value
        return result


def run(on: Connection[Row] | Cursor[Row], steps: Steps[T]) -> T:
    """Run `steps` on a blocking connection or cursor (as `run_async`)."""
    try:
        query = next(steps)
        while True:
            try:
                cur = on.execute(*query)
                row = cur.fetchone() if _has_rows(cur) else None
            except psycopg.Error as exc:
                query = steps.throw(exc)
            else:
                query = steps.send(row)
    except StopIteration as done:
        result: T = done.value
        return result


def _has_rows(cur: Cursor[Row] | AsyncCursor[Row]) -> bool:
    """False when the statement surely answered no rows (SAVEPOINT and the like). In
    pipeline mode the result is not there yet (None): fetching waits for it."""
    result = cur.pgresult  # not `description`: it builds a Column per column
    return result is None or bool(result.nfields)
