"""The client without I/O: what each operation sends and how its answer is read.

Every operation of the API is a `Call` (`goqueue.client.calls`): method, path, body,
headers, whether sending it twice is harmless, and a function reading a successful answer
into the API's own msgspec types (`goqueue.api.wire`). The operations that take several
requests (waiting for a job, paging, batches, bulk dead-letter actions) are in `flows`.
`Client` (blocking, `http.client`) and `AsyncClient` (aiohttp) only
move bytes, sleep and retry; they share everything here, so the two cannot disagree about
the API.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime
from typing import Any, NamedTuple, Protocol, TypedDict, TypeVar, Unpack, cast

import msgspec
from goqueue.api.wire import (
    MAX_BATCH,
    SPEC_DECODER,
    BatchResponse,
    BulkCancelled,
    BulkPurged,
    BulkReplayed,
    DeadLetterList,
    DeadLetterOut,
    EventList,
    JobList,
    JobOut,
    Purged,
    QueueStats,
    ScheduleList,
    ScheduleOut,
    StatsOut,
    error_field,
)
from goqueue.client.calls import Call, decoder, quote, with_query
from goqueue.client.errors import (
    InvalidJob,
    JobCancelled,
    JobFailed,
    RequestError,
    error_for,
)
from goqueue.supervisor.common.jobs import Event, JobSpec, spec_problem

T = TypeVar("T")

IDEMPOTENCY_HEADER = "Idempotency-Key"
PAGE_SIZE = 100


class JobOptions(TypedDict, total=False):
    """The optional parts of a job (`POST /jobs` fields), plus how to send it: its own
    `idempotency_key` (else the client makes one) and `strict=False` to enqueue a type no
    live node has registered yet."""

    queue: str
    priority: int
    max_retries: int
    run_at: datetime | str
    delay_seconds: float
    timeout_seconds: float
    dedupe_key: str
    dedupe_window_seconds: float
    unique_key: str
    concurrency_key: str
    debounce_key: str
    debounce_seconds: float
    debounce_max_seconds: float
    webhook_url: str
    on_success: JobSpec | Mapping[str, Any]
    on_failure: JobSpec | Mapping[str, Any]
    idempotency_key: str
    strict: bool


_SENDING = ("idempotency_key", "strict")
SPEC_OPTIONS = tuple(name for name in JobOptions.__annotations__ if name not in _SENDING)


class Producer(Protocol):
    """Anything that enqueues jobs as `Client.enqueue` does (what `Actor.send` needs)."""

    def enqueue(self, type: str, payload: Any = None, **options: Unpack[JobOptions]) -> JobOut:
        """Enqueue one job."""
        ...


class AsyncProducer(Protocol):
    """Anything that enqueues jobs as `AsyncClient.enqueue` does."""

    async def enqueue(
        self, type: str, payload: Any = None, **options: Unpack[JobOptions]
    ) -> JobOut:
        """Enqueue one job."""
        ...


_read_job = decoder(JobOut)
_read_jobs = decoder(JobList)
_read_dead = decoder(DeadLetterOut)
_read_dead_letters = decoder(DeadLetterList)
_read_stats = decoder(StatsOut)
_read_queue = decoder(QueueStats)
_decode_events = msgspec.json.Decoder(EventList).decode
_decode_batch = msgspec.json.Decoder(BatchResponse).decode
_decode_purged = msgspec.json.Decoder(Purged).decode
_read_replayed = decoder(BulkReplayed)
_read_cancelled = decoder(BulkCancelled)
_read_purged_many = decoder(BulkPurged)
_decode_schedules = msgspec.json.Decoder(ScheduleList).decode
_read_schedule = decoder(ScheduleOut)


class Submitted(NamedTuple):
    """An enqueue's answer: the job, and whether this call created it (False: its
    Idempotency-Key named a job enqueued before)."""

    job: JobOut
    created: bool


# -- jobs in, as the API takes them --------------------------------------------------------

_encode = msgspec.json.Encoder().encode


def job_request(type: str, payload: Any, options: Mapping[str, Any]) -> tuple[JobSpec, bytes]:
    """Check a job as the node will (the same msgspec type, the same rules across fields)
    and encode it: raises InvalidJob (a BadRequest) naming the field, as the node's 400
    would."""
    unknown = sorted(set(options) - set(SPEC_OPTIONS) - set(_SENDING))
    if unknown:
        raise TypeError(f"unknown job option(s): {', '.join(unknown)}")
    fields: dict[str, Any] = {"type": type}
    if payload is not None:
        fields["payload"] = payload
    fields.update((k, options[k]) for k in SPEC_OPTIONS if options.get(k) is not None)
    body = _encode(fields)
    return check(body), body


def check(body: bytes, prefix: str = "") -> JobSpec:
    """Decode one job's JSON into the node's `JobSpec` and apply its rules."""
    try:
        spec = SPEC_DECODER.decode(body)
    except msgspec.ValidationError as exc:
        where = error_field(str(exc))
        raise InvalidJob(str(exc), {"field": prefix + where} if where else None) from None
    problem = spec_problem(spec, prefix)
    if problem is not None:
        raise InvalidJob(problem[0], {"field": problem[1]})
    return spec


def enqueue(body: bytes, key: str, *, made_key: bool, strict: bool) -> Call[Submitted]:
    """POST /jobs, safe to repeat thanks to its Idempotency-Key. With a key this client
    made up (`made_key`), a 200 is a repeat of this very call: the job is still new."""

    def read(status: int, raw: bytes) -> Submitted:
        return Submitted(_read_job(status, raw), status == 201 or made_key)

    path = with_query("/jobs", {"strict": None if strict else False})
    return Call("POST", path, read, body, {IDEMPOTENCY_HEADER: key}, safe=True)


def new_key() -> str:
    """An Idempotency-Key for one enqueue and its retries."""
    return str(uuid.uuid4())


def submission(type: str, payload: Any, options: JobOptions) -> Call[Submitted]:
    """The enqueue of one job, checked first as the node would: keyed by the caller's
    `idempotency_key`, else by one made up here for this call and its retries."""
    _, body = job_request(type, payload, options)
    given = options.get("idempotency_key")
    key = given or new_key()
    # a debounced enqueue's 200 is the job it replaced, not a repeat of this call (one
    # retried after its answer was lost may then say it created nothing)
    made = not given and options.get("debounce_key") is None
    return enqueue(body, key, made_key=made, strict=options.get("strict", True))


def batch(bodies: list[bytes], *, strict: bool) -> Call[list[JobOut | RequestError]]:
    """POST /jobs/batch. Not repeated on its own: the route takes no Idempotency-Key."""

    def read(status: int, raw: bytes) -> list[JobOut | RequestError]:
        out: list[JobOut | RequestError] = []
        for item in _decode_batch(raw).results:
            if isinstance(item.job, JobOut):
                out.append(item.job)
            else:
                details = item.details if isinstance(item.details, dict) else None
                existing = item.existing_id if isinstance(item.existing_id, str) else None
                message = item.error if isinstance(item.error, str) else f"HTTP {item.status}"
                out.append(error_for(item.status, message, details, existing_id=existing))
        return out

    body = b'{"jobs":[' + b",".join(bodies) + b"]}"
    path = with_query("/jobs/batch", {"strict": None if strict else False})
    return Call("POST", path, read, body)


def batch_bodies(jobs: Iterable[JobSpec | Mapping[str, Any]]) -> list[bytes | InvalidJob]:
    """Each job of a batch encoded and checked on its own (an invalid one is its error)."""
    out: list[bytes | InvalidJob] = []
    for job in jobs:
        raw = _encode(job)
        try:
            check(raw)
        except InvalidJob as exc:
            out.append(exc)
        else:
            out.append(raw)
    return out


def chunks(items: list[bytes], size: int = MAX_BATCH) -> Iterator[list[bytes]]:
    """Batches of at most `size` (the node's limit per request)."""
    for start in range(0, len(items), size):
        yield items[start : start + size]


# -- everything else ---------------------------------------------------------------------


def get(job_id: str, wait: float | None = None) -> Call[JobOut]:
    """GET /jobs/{id}, with `wait`: once finished, or after that many seconds."""
    path = with_query(f"/jobs/{quote(job_id)}", {"wait": None if wait is None else f"{wait:.3f}"})
    return Call("GET", path, _read_job, safe=True, wait=wait or 0.0)


def jobs_page(
    type: str | None,
    status: str | None,
    queue: str | None,
    limit: int | None,
    offset: int | None,
    concurrency_key: str | None = None,
) -> Call[JobList]:
    """GET /jobs: one page, newest first."""
    query = {
        "type": type,
        "status": status,
        "queue": queue,
        "concurrency_key": concurrency_key,
        "limit": limit,
        "offset": offset,
    }
    return Call("GET", with_query("/jobs", query), _read_jobs, safe=True)


def events(job_id: str) -> Call[list[Event]]:
    """GET /jobs/{id}/events."""
    return Call(
        "GET",
        f"/jobs/{quote(job_id)}/events",
        lambda status, body: _decode_events(body).events,
        safe=True,
    )


def cancel(job_id: str, force: bool) -> Call[JobOut]:
    """DELETE /jobs/{id} (not repeated: a second cancel of a cancelled job is a 409)."""
    path = with_query(f"/jobs/{quote(job_id)}", {"force": True if force else None})
    return Call("DELETE", path, _read_job)


class CancelFilters(TypedDict, total=False):
    """What `POST /jobs/cancel` takes: filters (`queue`, `type`, `status`,
    `created_before`) or `all=True`, `limit` (100 unless given) and `force`."""

    queue: str
    type: str
    status: str
    created_before: datetime | str
    limit: int
    force: bool
    all: bool


def cancel_many(filters: CancelFilters) -> Call[BulkCancelled]:
    """POST /jobs/cancel (not repeated: the answer's counts would be lost)."""
    body = {k: v.isoformat() if isinstance(v, datetime) else v for k, v in filters.items()}
    return Call("POST", "/jobs/cancel", _read_cancelled, msgspec.json.encode(body))


def stats() -> Call[StatsOut]:
    """GET /stats."""
    return Call("GET", "/stats", _read_stats, safe=True)


def queue_stats(name: str) -> Call[QueueStats]:
    """GET /queues/{name}/stats."""
    return Call("GET", f"/queues/{quote(name)}/stats", _read_queue, safe=True)


def set_paused(name: str, paused: bool) -> Call[QueueStats]:
    """POST /queues/{name}/pause or /resume (the same twice is the same as once)."""
    action = "pause" if paused else "resume"
    return Call("POST", f"/queues/{quote(name)}/{action}", _read_queue, safe=True)


def dead_page(
    limit: int | None, offset: int | None, filters: DeadSelection | None = None
) -> Call[DeadLetterList]:
    """GET /dlq: one page, newest first (of the letters passing `filters`)."""
    query = _dead_query(cast(DeadFilters, filters or {}), DeadSelection.__annotations__)
    path = with_query("/dlq", query | {"limit": limit, "offset": offset})
    return Call("GET", path, _read_dead_letters, safe=True)


def dead(dead_id: str) -> Call[DeadLetterOut]:
    """GET /dlq/{id}."""
    return Call("GET", f"/dlq/{quote(dead_id)}", _read_dead, safe=True)


def replay(dead_id: str) -> Call[JobOut]:
    """POST /dlq/{id}/replay (not repeated: a second replay would find no letter)."""
    return Call("POST", f"/dlq/{quote(dead_id)}/replay", _read_job)


def purge(dead_id: str) -> Call[str]:
    """DELETE /dlq/{id}; the purged letter's id."""
    return Call(
        "DELETE", f"/dlq/{quote(dead_id)}", lambda status, body: _decode_purged(body).purged
    )


class DeadSelection(TypedDict, total=False):
    """Which dead letters a listing shows: every filter given must match (`error` is a
    substring of the last error, any case; `before` and `after` bound when the letter
    was written)."""

    type: str
    queue: str
    error: str
    before: datetime | str
    after: datetime | str


class DeadFilters(DeadSelection, total=False):
    """Which dead letters a bulk replay or purge takes (as `DeadSelection`); with no
    filter, `all=True` is required."""

    all: bool


def _dead_query(filters: DeadFilters, allowed: Iterable[str]) -> dict[str, object]:
    """The query parameters of dead-letter filters (times as RFC 3339)."""
    unknown = sorted(set(filters) - set(allowed))
    if unknown:
        raise TypeError(f"unknown dead-letter filter(s): {', '.join(unknown)}")
    query: dict[str, object] = {k: v for k, v in filters.items() if v is not None}
    for name in ("before", "after"):
        when = query.get(name)
        if isinstance(when, datetime):
            if when.tzinfo is None:
                raise ValueError(f"{name} must be timezone-aware")
            query[name] = when.isoformat()
    if query.get("all") is False:
        del query["all"]
    return query


def _bulk_path(path: str, filters: DeadFilters, limit: int) -> str:
    query = _dead_query(filters, (*DeadSelection.__annotations__, "all"))
    return with_query(path, query | {"limit": limit})


def replay_matching(filters: DeadFilters, limit: int) -> Call[BulkReplayed]:
    """POST /dlq/replay (not repeated: a second request would take the next letters)."""
    return Call("POST", _bulk_path("/dlq/replay", filters, limit), _read_replayed)


def purge_matching(filters: DeadFilters, limit: int) -> Call[BulkPurged]:
    """DELETE /dlq with filters (not repeated, as a replay)."""
    return Call("DELETE", _bulk_path("/dlq", filters, limit), _read_purged_many)


def schedules() -> Call[list[ScheduleOut]]:
    """GET /schedules: the node's periodic jobs, by name."""
    return Call(
        "GET", "/schedules", lambda status, body: _decode_schedules(body).schedules, safe=True
    )


def set_schedule_enabled(name: str, enabled: bool) -> Call[ScheduleOut]:
    """POST /schedules/{name}/enable or /disable (the same twice is the same as once)."""
    action = "enable" if enabled else "disable"
    return Call("POST", f"/schedules/{quote(name)}/{action}", _read_schedule, safe=True)


# -- results -------------------------------------------------------------------------------


def outcome(job: JobOut) -> JobOut:
    """A finished job's outcome: the job when it is done, else JobFailed (or
    JobCancelled) carrying it."""
    if job.status == "done":
        return job
    if job.status == "cancelled":
        raise JobCancelled(job)
    raise JobFailed(job)
