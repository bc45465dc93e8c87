"""How the PostgreSQL store's values cross the wire: rows to structs and back.

The psycopg adapters (json and jsonb come back as undecoded `msgspec.Raw`, and `Raw`
parameters go out as JSON text unchanged; uuids come back as `str`), the decoding of a
row selected as `sql.fragments.JOB_FIELDS` into a `Job` (in the same generated order) and of a
dead letter row into a `DeadLetter`, the encoding of jobs as insert parameters (one
array per column for several), and the replacement of NUL characters that PostgreSQL
text cannot hold.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import msgspec
import psycopg
from goqueue.supervisor.common.enums import Status
from goqueue.supervisor.common.jobs import AttemptError, DeadLetter, Job, JobSpec, new_id
from goqueue.supervisor.common.reads import JobFilter
from goqueue.supervisor.common.summaries import DeadFilter
from goqueue.supervisor.store.postgres.sql.statements import JOB_FIELDS, Sql
from psycopg.adapt import AdaptersMap, Dumper, Loader
from psycopg.types.string import TextLoader

Row = tuple[Any, ...]

_SPEC = msgspec.json.Decoder(JobSpec)
_ERRORS = msgspec.json.Decoder(tuple[AttemptError, ...])
_JOB = msgspec.json.Decoder(Job)
_CONTEXT = msgspec.json.Decoder(dict[str, str])


def _context(value: msgspec.Raw | None) -> dict[str, str] | None:
    """A stored trace context (JSON), decoded; None stays None."""
    return None if value is None else _CONTEXT.decode(value)


_ENCODE = msgspec.json.Encoder()


class _RawJsonLoader(Loader):
    """jsonb/json columns come back as undecoded `msgspec.Raw` (decoded where used)."""

    def load(self, data: Any) -> msgspec.Raw:
        return msgspec.Raw(bytes(data))


class _RawJsonDumper(Dumper):
    """`msgspec.Raw` parameters are sent as JSON text, without re-encoding; their type is
    left unknown so the server reads them as the column's (json or jsonb)."""

    def dump(self, obj: Any) -> bytes:
        return bytes(obj)


def adapters() -> AdaptersMap:
    """Adapters for the store's connections: raw JSON both ways, uuids as str."""
    adapters = AdaptersMap(psycopg.adapters)
    register(adapters)
    return adapters


def register(adapters: AdaptersMap) -> None:
    """Put the store's adapters into `adapters` (a connection's, or one cursor's on a
    connection that is not the store's: `goqueue.pg`)."""
    adapters.register_loader("jsonb", _RawJsonLoader)
    adapters.register_loader("json", _RawJsonLoader)
    adapters.register_loader("uuid", TextLoader)
    adapters.register_dumper(msgspec.Raw, _RawJsonDumper)


def raw(value: object) -> msgspec.Raw | None:
    """Encode a struct (or list) as a JSON parameter; None stays NULL."""
    return None if value is None else msgspec.Raw(_ENCODE.encode(value))


_COLUMNS = (
    "id",
    "type",
    "queue",
    "payload",
    "priority",
    "max_retries",
    "run_at",
    "delay",
    "timeout",
    "dedupe_key",
    "unique_key",
    "webhook_url",
    "on_success",
    "on_failure",
    "parent_id",
    "trace_context",
    "concurrency_key",
    "debounce_key",
)
_JSON_COLUMNS = ("payload", "on_success", "on_failure", "trace_context")


def columns(rows: Sequence[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """Insert parameters of several jobs as one array per column (JSON as text)."""
    columns = {name: [row[name] for row in rows] for name in _COLUMNS}
    for name in _JSON_COLUMNS:
        columns[name] = [None if v is None else bytes(v).decode() for v in columns[name]]
    return columns


def insert_params(
    spec: JobSpec,
    max_retries: int,
    parent_id: str | None = None,
    job_id: str | None = None,
    trace_context: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The parameters inserting a pending job from `spec` (the enqueue statements')."""
    return {
        "id": job_id or new_id(),
        "type": spec.type,
        "queue": spec.queue_name,
        "payload": spec.payload,
        "priority": spec.priority_value,
        "max_retries": max_retries,
        "run_at": spec.run_at,
        "delay": spec.delay_seconds or spec.debounce_seconds or 0.0,
        "timeout": spec.timeout_seconds,
        "dedupe_key": text(spec.dedupe_key),
        "unique_key": text(spec.unique_key),
        "webhook_url": text(spec.webhook_url),
        "on_success": raw(spec.on_success),
        "on_failure": raw(spec.on_failure),
        "parent_id": parent_id,
        "trace_context": raw(trace_context),
        "concurrency_key": text(spec.concurrency_key),
        "debounce_key": text(spec.debounce_key),
    }


def pending(params: Mapping[str, Any], spec: JobSpec, decided: Row) -> Job:
    """The job just inserted from `params` (see `insert_params`); `decided` holds what
    the database chose: `run_at, created_at, seq`."""
    run_at, created_at, seq = decided
    return Job(
        id=params["id"],
        type=spec.type,
        queue=spec.queue_name,
        payload=spec.payload,
        priority=spec.priority_value,
        status=Status.PENDING,
        attempts=0,
        max_retries=params["max_retries"],
        run_at=run_at,
        timeout_seconds=spec.timeout_seconds,
        dedupe_key=params["dedupe_key"],
        unique_key=params["unique_key"],
        concurrency_key=params["concurrency_key"],
        debounce_key=params["debounce_key"],
        webhook_url=params["webhook_url"],
        on_success=spec.on_success,
        on_failure=spec.on_failure,
        parent_id=params["parent_id"],
        result=None,
        last_error=None,
        errors=(),
        created_at=created_at,
        started_at=None,
        finished_at=None,
        updated_at=created_at,
        seq=seq,
        trace_context=_context(params["trace_context"]),
    )


def job(row: Row) -> Job:
    """A Job from a row whose first columns are `sql.fragments.JOB_FIELDS` (later ones, such as
    a claim's lease, are ignored); the JSON templates and errors are decoded here."""
    fields = dict(zip(JOB_FIELDS, row, strict=False))
    on_success, on_failure = fields["on_success"], fields["on_failure"]
    if on_success is not None:
        fields["on_success"] = _SPEC.decode(on_success)
    if on_failure is not None:
        fields["on_failure"] = _SPEC.decode(on_failure)
    fields["errors"] = _ERRORS.decode(fields["errors"])
    fields["trace_context"] = _context(fields.get("trace_context"))
    return Job(**fields)


def dead(row: Row) -> DeadLetter:
    """Build a DeadLetter from `id, job_id, job, errors, created_at`."""
    return DeadLetter(
        id=row[0],
        job_id=row[1],
        job=_JOB.decode(row[2]),
        errors=_ERRORS.decode(row[3]),
        created_at=row[4],
    )


def job_filter(filters: JobFilter) -> dict[str, Any]:
    """The parameters of the statements filtering jobs (`Statements.filtered`)."""
    return {
        "type": filters.type,
        "status": filters.status,
        "queue": filters.queue,
        "parent_id": filters.parent_id,
        "concurrency_key": filters.concurrency_key,
    }


def dead_filter(filters: DeadFilter) -> dict[str, Any]:
    """The parameters of the statements filtering dead letters (`dead_where`)."""
    return {
        "type": filters.type,
        "queue": filters.queue,
        "job_id": filters.job_id,
        "pattern": None if filters.error is None else f"%{_like_escape(filters.error)}%",
        "before": filters.before,
        "after": filters.after,
    }


def dead_count(
    filters: DeadFilter, params: dict[str, Any], matching: Sql
) -> tuple[Sql, dict[str, Any]]:
    """How a dead-letter page counts its total, with what: the tallies kept
    (`sql/tallies.py`) when no filter or only the queue and type are set, else by
    reading the letters that pass (`matching`)."""
    if filters.empty:
        return Sql.DEAD_COUNT, {}
    if filters.by_group:
        return Sql.COUNT_DEAD_GROUPED, {"queue": filters.queue, "type": filters.type}
    return matching, params


def dead_prepare(filters: DeadFilter) -> bool | None:
    """psycopg's `prepare` for a statement taking `filters`: one filtered by queue or type
    is planned for its parameters every time (never prepared), so it walks that queue's
    or type's index, not every letter; others as psycopg decides."""
    return False if filters.queue is not None or filters.type is not None else None


def _like_escape(text: str) -> str:
    """`text` matched literally inside a LIKE pattern."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def array_literal(values: Sequence[str | datetime | int | None]) -> str:
    """`values` as the text of a PostgreSQL array, to cast where it is used (`::text::
    text[]`): a list parameter costs psycopg tens of microseconds of the node's CPU to
    adapt (a list of times the most), a string next to nothing. Strings are quoted;
    times are written with their offset."""
    parts = []
    for value in values:  # a loop, not a call per value: this is on every claim's path
        if value is None:
            parts.append("NULL")
        elif isinstance(value, str):
            parts.append('"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"')
        elif isinstance(value, datetime):
            parts.append(value.isoformat())
        else:
            parts.append(str(value))
    return "{" + ",".join(parts) + "}"


def text(value: str | None) -> str | None:
    """PostgreSQL text cannot hold NUL characters: replace them (keys, urls, errors)."""
    return value.replace("\x00", "\ufffd") if value and "\x00" in value else value


def is_uuid(value: str) -> bool:
    """True if `value` can be sent as a uuid (an id of another form names nothing)."""
    try:
        uuid.UUID(value)
    except (ValueError, TypeError, AttributeError):
        return False
    return True
