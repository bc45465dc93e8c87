"""What goes over HTTP between a node and its clients: every request and response body
of the API, as msgspec types that both sides use (the server to encode and validate,
`goqueue.Client` to build requests and decode answers).

No aiohttp here: a client that imports this module loads msgspec and the job model only.
`goqueue.api.http.replies` re-exports these types for the server's routes.
"""

from __future__ import annotations

import operator
import re
from typing import Annotated, Any, Literal

import msgspec
from goqueue.supervisor.common.enums import TERMINAL, Status, WorkflowStatus
from goqueue.supervisor.common.jobs import (
    AttemptError,
    AwareTime,
    DeadLetter,
    Event,
    Job,
    JobSpec,
    Name,
)
from goqueue.supervisor.common.reads import QueueStats as QueueStats
from goqueue.supervisor.common.steps import Workflow
from goqueue.supervisor.common.steps import WorkflowRequest as WorkflowRequest
from goqueue.supervisor.common.steps import WorkflowStep as WorkflowStep
from msgspec import UNSET, UnsetType

MAX_BATCH = 1000
MAX_WAIT_SECONDS = 60.0  # GET /jobs/{id}?wait= answers within this many seconds

# Annotations for the OpenAPI document only; encoding is unaffected.
Uuid = Annotated[str, msgspec.Meta(extra_json_schema={"format": "uuid"})]


class TimeoutOut(msgspec.Struct):
    """The deadline an attempt of a job gets, and where it comes from: the job's own
    `timeout_seconds`, its actor's declared timeout, or the node's --default-timeout."""

    seconds: float
    source: Literal["job", "actor", "node"]


class TemplateOut(msgspec.Struct, kw_only=True):
    """A chained job's template (`on_success` / `on_failure`) as the API shows it:
    `JobSpec`'s fields, its `payload` any JSON (raw bytes on the server, decoded Python
    values in a client, as `JobOut.payload`); `JobSpec` itself keeps the bytes raw."""

    type: str
    queue: str | None = None
    payload: Any = None
    priority: int | None = None
    max_retries: int | None = None
    run_at: AwareTime | None = None
    delay_seconds: float | None = None
    timeout_seconds: float | None = None
    dedupe_key: str | None = None
    dedupe_window_seconds: float | None = None
    unique_key: str | None = None
    concurrency_key: str | None = None
    debounce_key: str | None = None
    debounce_seconds: float | None = None
    debounce_max_seconds: float | None = None
    webhook_url: str | None = None
    on_success: TemplateOut | None = None
    on_failure: TemplateOut | None = None


def template_out(spec: JobSpec | None) -> TemplateOut | None:
    """The API view of a stored template, and of the templates it chains in turn."""
    if spec is None:
        return None
    fields = msgspec.structs.asdict(spec)
    fields["on_success"] = template_out(spec.on_success)
    fields["on_failure"] = template_out(spec.on_failure)
    return TemplateOut(**fields)


class JobOut(msgspec.Struct):
    """A job as the API shows it.

    `payload` and `result` are any JSON: the server hands over the stored bytes as they
    are (`msgspec.Raw`), a client decodes them into Python values."""

    id: Uuid
    type: str
    queue: str
    payload: Any
    priority: int
    status: Status  # encoded as its value; OpenAPI shows the `Status` enum of strings
    attempts: int
    max_retries: int
    run_at: AwareTime
    timeout_seconds: float | None
    dedupe_key: str | None
    webhook_url: str | None
    on_success: TemplateOut | None
    on_failure: TemplateOut | None
    parent_id: Uuid | None
    result: Any
    last_error: str | None
    errors: list[AttemptError]
    created_at: AwareTime
    started_at: AwareTime | None
    finished_at: AwareTime | None
    updated_at: AwareTime
    unique_key: str | None = None  # a default: nodes before unique jobs do not send it
    # a workflow step: its workflow, key, parents' job ids and their results by key
    workflow_id: Uuid | None = None
    step_key: str | None = None
    parent_ids: list[Uuid] | None = None
    parents: Any = None
    concurrency_key: str | None = None  # its flow-control key
    debounce_key: str | None = None  # an enqueue with it replaces the job until it starts
    # what a running job last reported with ctx.progress (a number 0-1 or a small object),
    # as the node running it knows it; absent otherwise
    progress: Any | UnsetType = UNSET
    # the effective timeout, as the answering node would apply it (absent when this node
    # does not know the job's actor and the job names none)
    timeout: TimeoutOut | UnsetType = UNSET

    @property
    def finished(self) -> bool:
        """True once the job is done, failed or cancelled."""
        return self.status in TERMINAL


HIDDEN_JOB_FIELDS = frozenset({"seq", "trace_context"})  # trace_context: --otel only, internal
# not stored: the answering node fills them in (progress: the node running the job)
LIVE_JOB_FIELDS = ("progress", "timeout")

_JOB_INDEX = {f.name: i for i, f in enumerate(msgspec.structs.fields(Job))}
# A field dropped from Job fails here, at import; a field added to Job stays hidden until
# JobOut lists it (tests/e2e/api/test_routes.py checks the two agree).
_pick_job_fields = operator.itemgetter(
    *(_JOB_INDEX[f] for f in JobOut.__struct_fields__ if f not in LIVE_JOB_FIELDS)
)


def job_out(job: Job, progress: msgspec.Raw | None = None) -> JobOut:
    """The API view of a stored job, with a running job's progress where known (one
    `astuple` and one positional call, both in C: POST /jobs is hot)."""
    out = JobOut(*_pick_job_fields(msgspec.structs.astuple(job)))
    if job.on_success is not None or job.on_failure is not None:  # rare: chained jobs only
        out.on_success = template_out(job.on_success)
        out.on_failure = template_out(job.on_failure)
    if progress is not None:
        out.progress = progress
    return out


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
    429 too many queues, 503, 504 when its outcome is unknown)."""

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


class ScheduleOut(msgspec.Struct):
    """A periodic job: its timetable (`cron` in `timezone`, or `every_seconds`), the job
    each tick enqueues, whether it is enabled, its next tick (null while disabled), its
    last fire (the tick's time) and that job's id. `source` is `config` or `actor`."""

    name: str
    type: str
    cron: str | None
    every_seconds: int | None
    timezone: str
    payload: Any
    queue: str | None
    priority: int | None
    missed: Literal["once", "skip"]
    source: Literal["config", "actor"]
    enabled: bool
    next_fire: AwareTime | None
    last_fire: AwareTime | None
    last_job_id: Uuid | None


class ScheduleList(msgspec.Struct):
    """This node's schedules, by name."""

    schedules: list[ScheduleOut]


class Purged(msgspec.Struct):
    """The id of the dead letter that was deleted."""

    purged: Uuid


class BulkReplayed(msgspec.Struct):
    """A bulk replay: how many dead letters became fresh jobs, and how many matching the
    filters are left (beyond `limit`, or being replayed by another request)."""

    replayed: int
    remaining: int


class BulkPurged(msgspec.Struct):
    """A bulk purge: how many dead letters were deleted, and how many matching are left."""

    purged: int
    remaining: int


MAX_BULK_CANCEL = 1000


class BulkCancelRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """`POST /jobs/cancel`: which unfinished jobs to cancel, oldest first. Filters as
    `GET /jobs` (`queue`, `type`, `status`: only `pending` waits unstarted here; a job
    due later is pending too), `created_before`, at least one of them or `all: true`
    (an empty body must never empty a queue), and at most `limit` (100 unless given, at
    most 1000). Running jobs are left alone (counted as `running`) unless `force: true`:
    then their workers are killed, as for `DELETE /jobs/{id}?force=true`."""

    queue: Name | None = None
    type: Name | None = None
    status: Literal["pending"] | None = None
    created_before: AwareTime | None = None
    limit: Annotated[int, msgspec.Meta(ge=1, le=MAX_BULK_CANCEL)] = 100
    force: bool = False
    all: bool = False

    @property
    def filtered(self) -> bool:
        """True if any filter is given."""
        return any(v is not None for v in (self.queue, self.type, self.status, self.created_before))


class BulkCancelled(msgspec.Struct):
    """A bulk cancel: how many jobs were cancelled (of them, how many were running and
    had their workers killed), how many matching are left (beyond `limit`, or being
    changed by another request), and how many running jobs were left alone because
    `force` was not given."""

    cancelled: int
    killed: int
    remaining: int
    running: int


# Decoders are built once and reused (msgspec's advice; they hold no loop).
SPEC_DECODER = msgspec.json.Decoder(JobSpec)
BATCH_DECODER = msgspec.json.Decoder(BatchEnvelope)
BULK_CANCEL_DECODER = msgspec.json.Decoder(BulkCancelRequest)

_MSGSPEC_PATH = re.compile(r" - at `\$(?P<path>[^`]*)`$")
_NAMED_FIELD = re.compile(r"(?:unknown|missing required) field `(?P<name>[^`]+)`")


def error_field(message: str) -> str | None:
    """`on_success.priority` from msgspec's "... - at `$.on_success.priority`", with the
    name of an unknown or missing field appended; None for the document as a whole."""
    match = _MSGSPEC_PATH.search(message)
    path = match["path"] if match else ""
    named = _NAMED_FIELD.search(message)
    if named:
        path = f"{path}.{named['name']}"
    return path.lstrip(".") or None


# -- workflows -------------------------------------------------------------------------

WORKFLOW_TERMINAL = frozenset(
    {WorkflowStatus.DONE, WorkflowStatus.FAILED, WorkflowStatus.CANCELLED}
)


class WorkflowJobOut(msgspec.Struct):
    """One step of a workflow: its key, its current job (a replay's fresh one after a
    replay), that job's status."""

    key: str
    id: Uuid
    status: Status
    after: list[str] = msgspec.field(default_factory=list)  # the keys it waits for


class WorkflowOut(msgspec.Struct):
    """A workflow with its steps' live statuses, parents before children (in the order
    sent where that order already puts them so)."""

    id: Uuid
    name: str
    status: WorkflowStatus
    created_at: AwareTime
    jobs: list[WorkflowJobOut]

    @property
    def finished(self) -> bool:
        """True once the workflow is done, failed or cancelled (a failed one runs again
        when its failed step is replayed)."""
        return self.status in WORKFLOW_TERMINAL

    def job(self, key: str) -> WorkflowJobOut:
        """The step of `key`; KeyError when there is none."""
        for step in self.jobs:
            if step.key == key:
                return step
        raise KeyError(key)


class WorkflowList(msgspec.Struct):
    """One page of workflows, newest first."""

    workflows: list[WorkflowOut]
    total: int
    limit: int
    offset: int


def workflow_out(workflow: Workflow) -> WorkflowOut:
    """The API view of a workflow."""
    jobs = [WorkflowJobOut(s.key, s.id, s.status, s.after) for s in workflow.steps]
    return WorkflowOut(workflow.id, workflow.name, workflow.status, workflow.created_at, jobs)
