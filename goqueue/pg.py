"""Enqueue inside your own PostgreSQL transaction: the job exists if and only if your
transaction commits.

    with psycopg.connect(dsn) as conn, conn.transaction():
        conn.execute("INSERT INTO orders ...")
        goqueue.pg.enqueue(conn, "email", {"to": "a@example.com"})

`enqueue` (psycopg `Connection`) and `enqueue_async` (`AsyncConnection`) write the job
with the store's own statements and rules (dedupe, idempotency, the `enqueued`
event), in a savepoint of the caller's transaction, and NOTIFY the nodes
in it too: the notification is delivered at commit, so idle nodes wake only for a job
that exists. No node is asked: the job is checked here with the node's own types.

- The schema (`schema=`, else $GOQUEUE_DATABASE_SCHEMA, else `goqueue`) must exist: a
  node creates it at start, or `goqueue migrate`.
- The type must be one a live node has registered, unless `strict=False` (deploying
  producers ahead of their consumers).
- Defaults: the job's own fields, else (when `type` is the `Actor` itself) the actor's
  declaration, else the server's defaults. Given only a name, an actor's declared queue,
  priority and retries are not known here (its timeout still applies when it runs).
- A typed actor's payload is checked here when `type` is the `Actor` itself (a misfit is
  BadRequest naming the field). Given only a name, its type is not known without
  importing the actor's module, so the worker's own check applies when the job runs.
- A refusal (Conflict for a duplicate, IdempotencyMismatch, BadRequest for an invalid
  job or unknown type) rolls back only the savepoint: the caller's transaction goes on.
- On a connection in autocommit mode outside any transaction, the job is committed at
  once, in a transaction of its own.
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Unpack

import msgspec
import psycopg
from goqueue.api.wire import JobOut, job_out
from goqueue.client import core
from goqueue.client.core import JobOptions
from goqueue.client.errors import (
    BadRequest,
    ClientError,
    Conflict,
    IdempotencyMismatch,
    Unavailable,
)
from goqueue.supervisor.common import errors
from goqueue.supervisor.common.jobs import (
    Declared,
    Enqueued,
    JobSpec,
    resolve_spec,
)
from goqueue.supervisor.settings.config import Settings
from goqueue.supervisor.settings.stores import channel, schema_name_problem
from goqueue.supervisor.store.base import NewJob
from goqueue.supervisor.store.postgres import enqueue_steps as pg_steps
from goqueue.supervisor.store.postgres import rows as pg_rows
from goqueue.supervisor.store.postgres.sql.statements import Sql, Statements
from psycopg import AsyncConnection, AsyncCursor, Connection, Cursor
from psycopg.pq import TransactionStatus
from psycopg.rows import TupleRow, tuple_row

if TYPE_CHECKING:
    from goqueue.actors import Actor

SCHEMA_ENV = "GOQUEUE_DATABASE_SCHEMA"  # the node's own option: producers share its setting
PRODUCER = "goqueue.pg"  # the audit trail's `node` for jobs enqueued here
SAVEPOINT = "goqueue_enqueue"


def _node_default(name: str) -> Any:
    """A node setting's default, as `Settings` declares it (one place for each)."""
    (found,) = [f.default for f in msgspec.structs.fields(Settings) if f.name == name]
    return found


DEFAULT_SCHEMA: str = _node_default("database_schema")
IDEMPOTENCY_TTL: float = _node_default("idempotency_ttl")  # as long as a node keeps keys
LIVE_SECONDS: float = 3 * _node_default("lease_seconds")  # a node counts while it beats


def enqueue(
    conn: Connection[Any],
    type: str | Actor,
    payload: Any = None,
    *,
    schema: str | None = None,
    **options: Unpack[JobOptions],
) -> JobOut:
    """Insert a job in `conn`'s current transaction (see the module); returns it."""
    job = _Enqueue(type, payload, schema, options)
    with _cursor(conn) as cur:
        try:
            if conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE:
                with conn.transaction():
                    return job.result(pg_steps.run(cur, job.steps(savepoint=False)))
            return job.result(pg_steps.run(cur, job.steps(savepoint=True)))
        except psycopg.errors.UndefinedTable as exc:
            raise job.not_migrated() from exc


async def enqueue_async(
    conn: AsyncConnection[Any],
    type: str | Actor,
    payload: Any = None,
    *,
    schema: str | None = None,
    **options: Unpack[JobOptions],
) -> JobOut:
    """`enqueue` on an async connection."""
    job = _Enqueue(type, payload, schema, options)
    async with _async_cursor(conn) as cur:
        try:
            if conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE:
                async with conn.transaction():
                    enqueued = await pg_steps.run_async(cur, job.steps(savepoint=False))
                return job.result(enqueued)
            return job.result(await pg_steps.run_async(cur, job.steps(savepoint=True)))
        except psycopg.errors.UndefinedTable as exc:
            raise job.not_migrated() from exc


def _cursor(conn: Connection[Any]) -> Cursor[TupleRow]:
    """A cursor on the caller's connection with the store's adapters (JSON as raw
    bytes, uuids as text) and plain tuples, whatever the connection's own settings."""
    cur = conn.cursor(row_factory=tuple_row)
    pg_rows.register(cur.adapters)
    return cur


def _async_cursor(conn: AsyncConnection[Any]) -> AsyncCursor[TupleRow]:
    cur = conn.cursor(row_factory=tuple_row)
    pg_rows.register(cur.adapters)
    return cur


@lru_cache(maxsize=16)
def _statements(schema: str) -> Statements:
    return Statements(schema)


class _Enqueue:
    """One enqueue: the job checked as the API checks it, then its statements."""

    def __init__(
        self, type: str | Actor, payload: Any, schema: str | None, options: Mapping[str, Any]
    ) -> None:
        from goqueue.actors import Actor

        actor = type if isinstance(type, Actor) else None
        name = actor.name if actor is not None else str(type)
        if actor is not None:
            options = actor.options(options)  # type: ignore[arg-type]
        self.schema = schema or os.environ.get(SCHEMA_ENV) or DEFAULT_SCHEMA
        if problem := schema_name_problem(self.schema):
            raise ValueError(f"schema: {problem}")
        self.sql = _statements(self.schema)
        self.spec, body = core.job_request(name, payload, options)
        self.key: str | None = options.get("idempotency_key")
        self.request_hash = hashlib.sha256(body).hexdigest() if self.key is not None else None
        self.strict: bool = options.get("strict", True)
        info = actor.info() if actor is not None else None
        self.declared: Declared | None = info

    def steps(self, *, savepoint: bool) -> pg_steps.Steps[Enqueued]:
        """In a savepoint: check the types (when strict), claim the keys, insert, NOTIFY.
        A refusal or a database error rolls the savepoint back before it is raised."""
        if savepoint:
            yield f"SAVEPOINT {SAVEPOINT}", {}
        try:
            enqueued = yield from self._enqueue()
        except Exception as exc:
            if savepoint:
                yield f"ROLLBACK TO SAVEPOINT {SAVEPOINT}", {}
            if isinstance(exc, errors.GoQueueError):
                raise _refused(exc) from None
            raise
        if savepoint:
            yield f"RELEASE SAVEPOINT {SAVEPOINT}", {}
        return enqueued

    def _enqueue(self) -> pg_steps.Steps[Enqueued]:
        known: frozenset[str] | None = None
        if self.strict:
            # the store's statement, its rows gathered into one array
            listed = f"SELECT array(SELECT * FROM ({self.sql[Sql.KNOWN_TYPES]}) AS known)"
            row = yield listed, {"live": LIVE_SECONDS}
            known = frozenset(row[0]) if row is not None else frozenset()
        spec = resolve_spec(self.spec, self._declared, known)
        new = NewJob(
            spec=spec,
            max_retries=spec.max_retries,
            idempotency_key=self.key,
            request_hash=self.request_hash,
            trace_context=_sent(spec),
        )
        enqueued = yield from pg_steps.keyed_enqueue(
            self.sql, new, node=PRODUCER, idempotency_ttl=IDEMPOTENCY_TTL
        )
        if enqueued.created:
            yield self._notify(spec)
        return enqueued

    def _declared(self, job_type: str) -> Declared | None:
        declared = self.declared
        return declared if declared is not None and job_type == self.spec.type else None

    def _notify(self, spec: JobSpec) -> pg_steps.Query:
        """NOTIFY in the caller's transaction: delivered when (and if) it commits. The
        payload is the nodes' own ("<sender> <epoch>", the epoch of a job due later)."""
        due = spec.due_at(datetime.now(UTC))
        epoch = repr(due.timestamp()) if due > datetime.now(UTC) else ""
        params = {"channel": channel(self.schema), "payload": f"{PRODUCER} {epoch}"}
        return self.sql[Sql.NOTIFY], params

    @staticmethod
    def result(enqueued: Enqueued) -> JobOut:
        """The job as a client sees it (payload and result decoded)."""
        out = job_out(enqueued.job)
        return msgspec.structs.replace(
            out,
            payload=msgspec.json.decode(out.payload),
            result=None if out.result is None else msgspec.json.decode(out.result),
        )

    def not_migrated(self) -> ClientError:
        return ClientError(
            f"schema {self.schema!r} holds no GoQueue tables: start a node on this database "
            "or run `goqueue migrate` (with the same --database-schema)"
        )


def _refused(exc: errors.GoQueueError) -> ClientError:
    """The client's error for a refusal, with the status the HTTP API answers it with."""
    match exc:
        case errors.DuplicateJob():
            return Conflict(str(exc), {"existing_id": exc.existing_id}, exc.existing_id)
        case errors.IdempotencyMismatch():
            return IdempotencyMismatch(
                str(exc), {"existing_id": exc.existing_id, "header": "Idempotency-Key"}
            )
        case errors.UnknownJobType():
            hint = " (strict=False enqueues it anyway)"
            return BadRequest(str(exc) + hint, {"field": exc.path, "type": exc.job_type})
        case errors.InvalidJob():
            return BadRequest(str(exc), {"field": exc.field})
        case errors.StoreUnavailable():
            return Unavailable(str(exc))
    return ClientError(str(exc))


def _sent(spec: JobSpec) -> dict[str, str] | None:
    """With OpenTelemetry in the application (its API already imported), this enqueue
    as a PRODUCER span of the current trace, its context kept with the job; else None."""
    if "opentelemetry.trace" not in sys.modules:
        return None
    from opentelemetry import propagate, trace

    queue = spec.queue_name
    attributes = {
        "messaging.system": "goqueue",
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "messaging.destination.name": queue,
        "goqueue.job.type": spec.type,
    }
    tracer = trace.get_tracer("goqueue")
    with tracer.start_as_current_span(
        f"send {queue}", kind=trace.SpanKind.PRODUCER, attributes=attributes
    ):
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
    return carrier or None
