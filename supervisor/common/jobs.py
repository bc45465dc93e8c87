"""The job model: what a client asks for (`JobSpec`), what is stored (`Job`), and the
records around it (leases, dead letters, events, outcomes). Shared by the stores and the
API; the read models are in `reads.py`, bulk changes in `bulk.py`."""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Collection
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Annotated, Protocol

import msgspec
from goqueue.supervisor.common.enums import TERMINAL, Status
from goqueue.supervisor.common.errors import UnknownJobType
from goqueue.supervisor.common.payloads import check_payload

STATUSES: tuple[Status, ...] = tuple(Status)

Name = Annotated[str, msgspec.Meta(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.:\-]+\Z")]
Priority = Annotated[int, msgspec.Meta(ge=0, le=10)]
Retries = Annotated[int, msgspec.Meta(ge=0, le=100)]
Seconds = Annotated[float, msgspec.Meta(gt=0, le=7 * 86400)]
Delay = Annotated[float, msgspec.Meta(ge=0, le=366 * 86400)]
# `\Z`, not `$` (which lets a trailing newline through in Python), and ASCII classes only
# (Python's and JavaScript's `\s` differ): the served OpenAPI document writes `\Z` as `$`.
Url = Annotated[str, msgspec.Meta(pattern=r"^https?://[^\x00-\x20\x7f]+\Z", max_length=2048)]
Key = Annotated[str, msgspec.Meta(min_length=1, max_length=512)]
# A flow-control key (`concurrency_key`): any text, short enough to index and to show.
FlowKey = Annotated[str, msgspec.Meta(min_length=1, max_length=200)]
AwareTime = Annotated[datetime, msgspec.Meta(tz=True)]

DEFAULT_QUEUE = "default"
DEFAULT_PRIORITY = 5
DEFAULT_MAX_RETRIES = 3
MAX_CHAIN_DEPTH = 32  # on_success/on_failure nesting; deeper recursion would hit Python's limit


# A JSON null, as raw bytes (`Raw` defaults cannot be plain values). A partial, not a
# function: it runs for most jobs, and a partial adds no Python frame.
null_payload = partial(msgspec.Raw, b"null")

# The current time, timezone-aware in UTC (a partial, as above: it runs several times per
# job).
utcnow = partial(datetime.now, UTC)


_ids = random.Random(os.urandom(32))  # reseeded in a forked child: no shared sequence
os.register_at_fork(after_in_child=lambda: _ids.seed(os.urandom(32)))


def new_id() -> str:
    """A fresh job, dead-letter or lease id: a UUIDv7 (RFC 9562), the unix time in
    milliseconds and then 74 random bits, so ids sort by when they were made and
    PostgreSQL's index on them grows at one end. The random bits come from a PRNG seeded
    from the OS once per process (ids must be unique, not secret; `os.urandom` is a system
    call, and this runs twice per job), and it is written out without building a
    `uuid.UUID`."""
    value = (int(time.time() * 1000) << 80) | _ids.getrandbits(80)
    value = (value & ~(0xF << 76)) | (0x7 << 76)  # version 7
    value = (value & ~(0x3 << 62)) | (0x2 << 62)  # RFC 9562 variant
    h = f"{value:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


class JobSpec(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, gc=False):
    """A request to run a job; also the template form of `on_success` / `on_failure`.

    `queue`, `priority` and `max_retries` left out (None) are resolved by `resolve_spec`:
    the actor's declaration, else the server's default. A stored spec has them all set."""

    type: Name
    queue: Name | None = None
    payload: msgspec.Raw = msgspec.field(default_factory=null_payload)
    priority: Priority | None = None
    max_retries: Retries | None = None
    run_at: AwareTime | None = None
    delay_seconds: Delay | None = None
    timeout_seconds: Seconds | None = None
    dedupe_key: Key | None = None
    dedupe_window_seconds: Seconds | None = None
    unique_key: Key | None = None
    concurrency_key: FlowKey | None = None
    # debounce: while a job of this type with this key has not started, an enqueue
    # replaces its payload and puts it off (`docs/guide/flow-control.md`)
    debounce_key: Key | None = None
    debounce_seconds: Seconds | None = None
    debounce_max_seconds: Seconds | None = None
    webhook_url: Url | None = None
    on_success: JobSpec | None = None
    on_failure: JobSpec | None = None

    def due_at(self, now: datetime) -> datetime:
        """When the job first becomes runnable."""
        if self.run_at is not None:
            return self.run_at
        if self.debounce_seconds:
            return now + timedelta(seconds=self.debounce_seconds)
        if self.delay_seconds:
            return now + timedelta(seconds=self.delay_seconds)
        return now

    @property
    def queue_name(self) -> str:
        """The queue, the server's default for a spec that was never resolved."""
        return DEFAULT_QUEUE if self.queue is None else self.queue

    @property
    def priority_value(self) -> int:
        """The priority, the server's default for a spec that was never resolved."""
        return DEFAULT_PRIORITY if self.priority is None else self.priority

    @property
    def max_retries_value(self) -> int:
        """The retries, the server's default for a spec that was never resolved (a
        template stored before `resolve_spec` resolved templates)."""
        return DEFAULT_MAX_RETRIES if self.max_retries is None else self.max_retries


class ResolvedSpec(JobSpec, kw_only=True):
    """A spec as `resolve_spec` returns it: `max_retries` is set, and so are its
    templates' (`queue` and `priority` too, read through `queue_name`, `priority_value`)."""

    max_retries: Retries
    on_success: ResolvedSpec | None = None
    on_failure: ResolvedSpec | None = None


class Declared(Protocol):
    """An actor's declared defaults for its jobs (`ActorInfo` is one)."""

    @property
    def queue(self) -> str | None:
        """Its queue, or None for the server's default."""

    @property
    def priority(self) -> int | None:
        """Its priority, or None for the server's default."""

    @property
    def max_retries(self) -> int | None:
        """Its retries, or None for the server's default."""

    @property
    def shape(self) -> bytes | None:
        """Its payload's type (`actors/shapes.py`), or None for the classic form."""

    @property
    def keyword(self) -> bool:
        """Its keyword form: a null payload stands for `{}`."""


def resolve_spec(
    spec: JobSpec,
    declared: Callable[[str], Declared | None],
    known: Collection[str] | None = None,
    path: str = "",
    *,
    check: bool = True,
) -> ResolvedSpec:
    """`spec` and its templates with `queue`, `priority` and `max_retries` set: the job's
    own value, else its actor's declaration, else the server's default (one place for
    this rule: the engine, the scheduler and `goqueue.pg` use it). With `known`, a type
    not in it raises UnknownJobType naming the field. A typed actor's payload is checked
    here too: one that does not fit raises InvalidPayload naming the field (not with
    `check` off: a spec only looked at, never stored)."""
    if known is not None and spec.type not in known:
        raise UnknownJobType(spec.type, f"{path}type", known)
    actor = declared(spec.type)
    if check and actor is not None and actor.shape is not None:
        check_payload(actor.shape, actor.keyword, spec.payload, path)
    queue, priority, retries = spec.queue, spec.priority, spec.max_retries
    if queue is None:
        queue = (actor.queue if actor else None) or DEFAULT_QUEUE
    if priority is None:
        priority = actor.priority if actor and actor.priority is not None else DEFAULT_PRIORITY
    if retries is None:
        declared_retries = actor.max_retries if actor else None
        retries = DEFAULT_MAX_RETRIES if declared_retries is None else declared_retries
    on_success = on_failure = None
    if spec.on_success is not None:
        on_success = resolve_spec(
            spec.on_success, declared, known, f"{path}on_success.", check=check
        )
    if spec.on_failure is not None:
        on_failure = resolve_spec(
            spec.on_failure, declared, known, f"{path}on_failure.", check=check
        )
    fields = msgspec.structs.asdict(spec)
    if type(spec) is not JobSpec:  # a workflow step (`WorkflowStep`): its job's fields only
        fields = {name: fields[name] for name in JobSpec.__struct_fields__}
    resolved = {"queue": queue, "priority": priority, "max_retries": retries}
    templates = {"on_success": on_success, "on_failure": on_failure}
    return ResolvedSpec(**fields | resolved | templates)


def spec_problem(
    spec: JobSpec,
    prefix: str = "",
    depth: int = 0,
    *,
    url_refusal: Callable[[str], str | None] | None = None,
) -> tuple[str, str] | None:
    """The first rule across fields (which a schema cannot state) that `spec` or one of
    its templates breaks, as (message, field); None when there is none. `url_refusal`
    (a node's egress policy) says why a `webhook_url` may not be used, if it may not.
    Shared by the API, `ctx.enqueue`, the client and `goqueue.pg`."""
    if depth > MAX_CHAIN_DEPTH:
        return f"job templates nest at most {MAX_CHAIN_DEPTH} levels deep", prefix.rstrip(".")
    if spec.run_at is not None and spec.delay_seconds is not None:
        return "give run_at or delay_seconds, not both", f"{prefix}delay_seconds"
    if spec.dedupe_key is not None and spec.dedupe_window_seconds is None:
        return (
            "dedupe_key needs dedupe_window_seconds (how long the key blocks duplicates)",
            f"{prefix}dedupe_window_seconds",
        )
    if spec.dedupe_window_seconds is not None and spec.dedupe_key is None:
        return "dedupe_window_seconds needs a dedupe_key", f"{prefix}dedupe_key"
    if depth and spec.unique_key is not None:
        return (
            "unique_key is not allowed in a job template (a follow-up is enqueued with its "
            "parent's outcome, which a held key must not undo)",
            f"{prefix}unique_key",
        )
    debounce = _debounce_problem(spec, prefix, depth)
    if debounce is not None:
        return debounce
    if spec.webhook_url is not None and url_refusal is not None:
        refusal = url_refusal(spec.webhook_url)
        if refusal is not None:
            return f"webhook_url {refusal}", f"{prefix}webhook_url"
    for name, template in (("on_success", spec.on_success), ("on_failure", spec.on_failure)):
        if template is not None:
            problem = spec_problem(template, f"{prefix}{name}.", depth + 1, url_refusal=url_refusal)
            if problem is not None:
                return problem
    return None


def _debounce_problem(spec: JobSpec, prefix: str, depth: int) -> tuple[str, str] | None:
    """The first debounce rule `spec` breaks, as (message, field)."""
    if spec.debounce_key is None:
        if spec.debounce_seconds is None and spec.debounce_max_seconds is None:
            return None  # (the usual job: no `getattr` on its path)
        name = "debounce_seconds" if spec.debounce_seconds is not None else "debounce_max_seconds"
        return f"{name} needs a debounce_key", f"{prefix}debounce_key"
    if depth:
        return (
            "debounce_key is not allowed in a job template (a follow-up is enqueued with its "
            "parent's outcome)",
            f"{prefix}debounce_key",
        )
    if spec.debounce_seconds is None:
        return (
            "debounce_key needs debounce_seconds (how long the job waits for the next enqueue)",
            f"{prefix}debounce_seconds",
        )
    if spec.run_at is not None or spec.delay_seconds is not None:
        return (
            "a debounced job is due debounce_seconds after its last enqueue: give no run_at "
            "or delay_seconds",
            f"{prefix}debounce_seconds",
        )
    return None


def debounced_run_at(spec: JobSpec, first: datetime, now: datetime) -> datetime:
    """When a debounced job enqueued again at `now` is due: `debounce_seconds` on, but no
    later than `debounce_max_seconds` after `first`, the first enqueue of its burst."""
    due = now + timedelta(seconds=spec.debounce_seconds or 0)
    if spec.debounce_max_seconds is not None:
        due = min(due, first + timedelta(seconds=spec.debounce_max_seconds))
    return due


class AttemptError(msgspec.Struct, kw_only=True, gc=False, omit_defaults=True):
    """Why one attempt failed; `traceback` where the handler raised an unexpected
    exception (the last frames, bounded by `--max-traceback-bytes`), left out otherwise
    (as PostgreSQL's JSON of the errors leaves it out, so webhook bodies agree)."""

    attempt: int
    error: str
    at: datetime
    traceback: str | None = None  # a default: errors stored before tracebacks lack it


class Job(msgspec.Struct, kw_only=True, gc=False, omit_defaults=True):
    """A stored job. `seq` orders jobs enqueued at the same instant (FIFO).

    Untracked by the garbage collector (`gc=False`, errors kept in a tuple): with 100k
    jobs pending, tracked jobs made every full collection a multi-millisecond pause.
    Encoded without the fields left at their defaults (most are None on most jobs), as
    the stores keep it: a job's row is a third smaller, and so is each write of it. The
    API shows every field (`api/wire.py`)."""

    id: str
    type: str
    queue: str
    payload: msgspec.Raw
    priority: int
    status: Status
    attempts: int
    max_retries: int
    run_at: datetime
    timeout_seconds: float | None = None
    dedupe_key: str | None = None
    webhook_url: str | None = None
    on_success: JobSpec | None = None
    on_failure: JobSpec | None = None
    parent_id: str | None = None
    result: msgspec.Raw | None = None
    last_error: str | None = None
    errors: tuple[AttemptError, ...] = ()
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    updated_at: datetime
    # last among the shown fields, as in `JobOut` (webhook bodies are the API's bytes); a
    # default: dead letters stored before unique keys existed lack it
    unique_key: str | None = None
    # A workflow step (see `supervisor/store/new_workflow.py`): its workflow, its key there, its
    # parents' job ids, and their results by key as they finish (a JSON object).
    workflow_id: str | None = None
    step_key: str | None = None
    parent_ids: list[str] | None = None
    parents: msgspec.Raw | None = None
    # its flow-control key: the actor's `key_concurrency` and `key_rate_limit` bound the
    # jobs of its type sharing it, and claims take keys in turn (`docs/guide/flow-control.md`)
    concurrency_key: str | None = None
    debounce_key: str | None = None  # replaced by an enqueue with its key until it starts
    seq: int = 0
    trace_context: dict[str, str] | None = None  # the enqueue's, with --otel

    @classmethod
    def from_spec(
        cls, spec: JobSpec, *, now: datetime, max_retries: int, parent_id: str | None = None
    ) -> Job:
        """Build a fresh pending job; `max_retries` is already resolved against defaults."""
        return cls(
            id=new_id(),
            type=spec.type,
            queue=spec.queue_name,
            payload=spec.payload,
            priority=spec.priority_value,
            status=Status.PENDING,
            attempts=0,
            max_retries=max_retries,
            run_at=spec.due_at(now),
            timeout_seconds=spec.timeout_seconds,
            dedupe_key=spec.dedupe_key,
            unique_key=spec.unique_key,
            concurrency_key=spec.concurrency_key,
            debounce_key=spec.debounce_key,
            webhook_url=spec.webhook_url,
            on_success=spec.on_success,
            on_failure=spec.on_failure,
            parent_id=parent_id,
            result=None,
            last_error=None,
            errors=(),
            created_at=now,
            started_at=None,
            finished_at=None,
            updated_at=now,
        )

    def replay_spec(self) -> JobSpec:
        """The fields a replay of this job starts from (no dedupe, unique or debounce key:
        a replay is deliberate)."""
        return JobSpec(
            type=self.type,
            queue=self.queue,
            payload=self.payload,
            priority=self.priority,
            max_retries=self.max_retries,
            timeout_seconds=self.timeout_seconds,
            concurrency_key=self.concurrency_key,
            webhook_url=self.webhook_url,
            on_success=self.on_success,
            on_failure=self.on_failure,
        )

    def record_error(self, error: str, traceback: str | None, at: datetime) -> None:
        """Keep the error of this job's current attempt (its last error, too)."""
        failed = AttemptError(attempt=self.attempts, error=error, at=at, traceback=traceback)
        self.errors = (*self.errors, failed)
        self.last_error = error

    @property
    def unfinished(self) -> bool:
        """True while the job may still run (not done, failed nor cancelled)."""
        return self.status not in TERMINAL


# The fields of a job as the API shows it (`GET /jobs/{id}`, webhook bodies): all but the
# store's FIFO tie-breaker `seq` and the tracing context (the node's plumbing, --otel).
SHOWN_FIELDS: tuple[str, ...] = tuple(
    f.name for f in msgspec.structs.fields(Job) if f.name not in ("seq", "trace_context")
)


class Lease(msgspec.Struct, kw_only=True, gc=False):
    """A claim on one attempt of a job: only the holder of `token` may record its outcome."""

    job: Job
    token: str
    owner: str
    expires_at: datetime

    @property
    def attempt(self) -> int:
        """The attempt number this lease covers (from 1)."""
        return self.job.attempts


class DeadLetter(msgspec.Struct, kw_only=True, gc=False):
    """A job whose retries are exhausted, archived with every attempt's error."""

    id: str
    job_id: str
    job: Job
    errors: tuple[AttemptError, ...]
    created_at: datetime


class Event(msgspec.Struct, kw_only=True, gc=False):
    """One entry of a job's audit trail. Untracked by the garbage collector (it holds only
    text, numbers and a time): a node keeps several per job, and collections that walked
    them all paused the loop."""

    job_id: str
    event: str  # an EventKind, declared str: the API documents a plain string
    at: datetime
    node: str
    attempt: int
    detail: str | None = None
    traceback: str | None = None  # an `attempt_failed` event's, as in its AttemptError


class Enqueued(msgspec.Struct):
    """The outcome of an enqueue: the job, and whether this call created it."""

    job: Job
    created: bool
    lease: Lease | None = None  # the job was started for this node (`NewJob.start`)


class Outcome(msgspec.Struct):
    """What recording an attempt's outcome changed: the job now, follow-ups created, and
    the workflow steps it made pending (their last parent was this job)."""

    job: Job
    followups: list[Job]
    dead_letter: DeadLetter | None = None
    released: list[Job] = msgspec.field(default_factory=list)
