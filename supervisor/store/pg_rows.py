"""How the PostgreSQL store's values cross the wire: rows to structs and back.

The psycopg adapters (json and jsonb come back as undecoded `msgspec.Raw`, and `Raw`
parameters go out as JSON text unchanged; uuids come back as `str`), the decoding of a
row selected as `JOB_COLUMNS` into a `Job` and of a dead letter row into a `DeadLetter`,
the encoding of jobs as insert parameters (one array per column for several), and the
replacement of NUL characters that PostgreSQL text cannot hold.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
import psycopg
from goqueue.supervisor.jobs import AttemptError, DeadLetter, Job, JobSpec
from psycopg.adapt import AdaptersMap, Dumper, Loader
from psycopg.types.string import TextLoader

Row = tuple[Any, ...]

_SPEC = msgspec.json.Decoder(JobSpec)
_ERRORS = msgspec.json.Decoder(tuple[AttemptError, ...])
_JOB = msgspec.json.Decoder(Job)
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
    adapters.register_loader("jsonb", _RawJsonLoader)
    adapters.register_loader("json", _RawJsonLoader)
    adapters.register_loader("uuid", TextLoader)
    adapters.register_dumper(msgspec.Raw, _RawJsonDumper)
    return adapters


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
    "webhook_url",
    "on_success",
    "on_failure",
    "parent_id",
)
_JSON_COLUMNS = ("payload", "on_success", "on_failure")


def columns(rows: Sequence[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """Insert parameters of several jobs as one array per column (JSON as text)."""
    columns = {name: [row[name] for row in rows] for name in _COLUMNS}
    for name in _JSON_COLUMNS:
        columns[name] = [None if v is None else bytes(v).decode() for v in columns[name]]
    return columns


def pending(params: Mapping[str, Any], spec: JobSpec, decided: Row) -> Job:
    """The job just inserted from `params` (see `PostgresStore._insert_params`);
    `decided` holds what the database chose: `run_at, created_at, seq`."""
    run_at, created_at, seq = decided
    return Job(
        id=params["id"],
        type=spec.type,
        queue=spec.queue,
        payload=spec.payload,
        priority=spec.priority,
        status="pending",
        attempts=0,
        max_retries=params["max_retries"],
        run_at=run_at,
        timeout_seconds=spec.timeout_seconds,
        dedupe_key=params["dedupe_key"],
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
    )


def job(row: Row) -> Job:
    """Build a Job from the first `N_JOB_COLUMNS` of a row selected as `JOB_COLUMNS`."""
    on_success, on_failure, errors = row[12], row[13], row[17]
    return Job(
        id=row[0],
        type=row[1],
        queue=row[2],
        payload=row[3],
        priority=row[4],
        status=row[5],
        attempts=row[6],
        max_retries=row[7],
        run_at=row[8],
        timeout_seconds=row[9],
        dedupe_key=row[10],
        webhook_url=row[11],
        on_success=None if on_success is None else _SPEC.decode(on_success),
        on_failure=None if on_failure is None else _SPEC.decode(on_failure),
        parent_id=row[14],
        result=row[15],
        last_error=row[16],
        errors=_ERRORS.decode(errors),
        created_at=row[18],
        started_at=row[19],
        finished_at=row[20],
        updated_at=row[21],
        seq=row[22],
    )


def dead(row: Row) -> DeadLetter:
    """Build a DeadLetter from `id, job_id, job, errors, created_at`."""
    return DeadLetter(
        id=row[0],
        job_id=row[1],
        job=_JOB.decode(row[2]),
        errors=_ERRORS.decode(row[3]),
        created_at=row[4],
    )


def text(value: str | None) -> str | None:
    """PostgreSQL text cannot hold NUL characters: replace them (keys, urls, errors)."""
    return value.replace("\x00", "\ufffd") if value and "\x00" in value else value
