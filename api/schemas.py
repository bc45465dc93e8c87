"""Request and response bodies of the HTTP API, with the decoders and the one encoder.

Responses never show a `Job` as stored: `seq` is the store's tie-breaker, not part of the
API, so jobs go out as `JobOut` (every other field, in the same order). The conversion is
one `astuple` and one positional constructor call, both in C, since POST /jobs is hot.
"""

from __future__ import annotations

import operator
from typing import Annotated, Any, Literal

import msgspec
from aiohttp import web
from goqueue.supervisor.jobs import AttemptError, AwareTime, DeadLetter, Event, Job, JobSpec
from msgspec import UNSET, UnsetType

MAX_BATCH = 1000

# Annotations for the OpenAPI document only; encoding is unaffected.
Uuid = Annotated[str, msgspec.Meta(extra_json_schema={"format": "uuid"})]

JSON = "application/json"

# `Status`'s values, spelt out so that OpenAPI shows an inline enum of strings (a StrEnum
# would become a named component); tests/api/test_routes.py checks the two agree.
JobStatus = Literal["pending", "running", "done", "failed", "cancelled"]


class JobOut(msgspec.Struct):
    """A job as the API shows it."""

    id: Uuid
    type: str
    queue: str
    payload: msgspec.Raw
    priority: int
    status: JobStatus
    attempts: int
    max_retries: int
    run_at: AwareTime
    timeout_seconds: float | None
    dedupe_key: str | None
    webhook_url: str | None
    on_success: JobSpec | None
    on_failure: JobSpec | None
    parent_id: Uuid | None
    result: msgspec.Raw | None
    last_error: str | None
    errors: list[AttemptError]
    created_at: AwareTime
    started_at: AwareTime | None
    finished_at: AwareTime | None
    updated_at: AwareTime


HIDDEN_JOB_FIELDS = frozenset({"seq"})

_JOB_INDEX = {f.name: i for i, f in enumerate(msgspec.structs.fields(Job))}
# A field dropped from Job fails here, at import; a field added to Job stays hidden until
# JobOut lists it (tests/api/test_routes.py checks the two agree).
_pick_job_fields = operator.itemgetter(*(_JOB_INDEX[f] for f in JobOut.__struct_fields__))


def job_out(job: Job) -> JobOut:
    """The API view of a stored job."""
    return JobOut(*_pick_job_fields(msgspec.structs.astuple(job)))


class DeadLetterOut(msgspec.Struct):
    """A dead letter: the job's last snapshot and every attempt's error."""

    id: Uuid
    job_id: Uuid
    job: JobOut
    errors: list[AttemptError]
    created_at: AwareTime


def dead_out(dead: DeadLetter) -> DeadLetterOut:
    """The API view of a dead letter."""
    errors = list(dead.errors)
    return DeadLetterOut(dead.id, dead.job_id, job_out(dead.job), errors, dead.created_at)


class JobList(msgspec.Struct):
    """One page of jobs, newest first."""

    jobs: list[JobOut]
    total: int
    limit: int
    offset: int


class DeadLetterList(msgspec.Struct):
    """One page of dead letters, newest first."""

    dead_letters: list[DeadLetterOut]
    total: int
    limit: int
    offset: int


class EventList(msgspec.Struct):
    """A job's audit trail, oldest first."""

    events: list[Event]


class StatsOut(msgspec.Struct):
    """Counts by status, pending depth by queue and priority, dead letters, this node's
    workers by state."""

    counts: dict[str, int]
    queues: dict[str, dict[str, int]]
    dead_letters: int
    workers: dict[str, int]


class BatchRequest(msgspec.Struct, forbid_unknown_fields=True):
    """Several jobs to enqueue at once; each is answered on its own."""

    jobs: Annotated[list[JobSpec], msgspec.Meta(min_length=1, max_length=MAX_BATCH)]


class BatchEnvelope(msgspec.Struct, forbid_unknown_fields=True):
    """A batch as first read: the list of items, each decoded and answered on its own."""

    jobs: Annotated[list[msgspec.Raw], msgspec.Meta(min_length=1, max_length=MAX_BATCH)]


class BatchItem(msgspec.Struct):
    """One job's answer in a batch: `status` 201 with `job`, or an error status with
    `error` and `details` (400 naming the field as `jobs[i].…`, 409 with `existing_id`,
    429 too many queues, 503)."""

    status: int
    job: JobOut | UnsetType = UNSET
    error: str | UnsetType = UNSET
    details: dict[str, Any] | UnsetType = UNSET
    existing_id: Uuid | UnsetType = UNSET


class BatchResponse(msgspec.Struct):
    """The answers to a batch, in request order."""

    results: list[BatchItem]


class ErrorOut(msgspec.Struct):
    """Every error answer. `details` names the offending field, parameter or header where
    there is one; `existing_id` is set on a duplicate (409)."""

    error: str
    details: dict[str, Any] | None = None
    existing_id: Uuid | UnsetType = UNSET


class Health(msgspec.Struct):
    """Liveness: the process answers."""

    status: Literal["ok"] = "ok"


class Ready(msgspec.Struct):
    """Readiness and the checks behind it; `error` says which failed (503). `checks.auth`
    is informational: false when the API listens beyond loopback with no API key, which
    `warnings` explains; it never makes a node unready."""

    status: Literal["ready", "not_ready"]
    checks: dict[str, bool]
    error: str | UnsetType = UNSET
    warnings: list[str] | UnsetType = UNSET


class Purged(msgspec.Struct):
    """The id of the dead letter that was deleted."""

    purged: Uuid


# Encoders and decoders are built once and reused (msgspec's advice; they hold no loop).
_encode = msgspec.json.Encoder().encode
SPEC_DECODER = msgspec.json.Decoder(JobSpec)
BATCH_DECODER = msgspec.json.Decoder(BatchEnvelope)


def encode(value: object) -> bytes:
    """JSON bytes of any response value."""
    return _encode(value)


def reply(value: object, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    """A JSON response."""
    return web.Response(body=_encode(value), status=status, content_type=JSON, headers=headers)
