"""The client without I/O: what each operation sends and how its answer is read.

Every operation of the API is a `Call`: method, path, body, headers, whether sending it
twice is harmless, and a function reading a successful answer into the API's own msgspec
types (`goqueue.api.wire`). `Client` (blocking, `http.client`) and `AsyncClient`
(aiohttp) only move bytes and retry; they share everything here, so the two cannot
disagree about the API.
"""

from __future__ import annotations

import os
import random
import urllib.parse
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, NamedTuple, Protocol, TypedDict, TypeVar, Unpack, cast

import msgspec
from goqueue.api.wire import (
    MAX_BATCH,
    SPEC_DECODER,
    BatchResponse,
    BulkPurged,
    BulkReplayed,
    DeadLetterList,
    DeadLetterOut,
    ErrorOut,
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
from goqueue.client.errors import (
    ClientError,
    ConnectionFailed,
    InvalidJob,
    JobCancelled,
    JobFailed,
    RequestError,
    Unavailable,
    UnexpectedAnswer,
    error_for,
)
from goqueue.supervisor.backoff import backoff
from goqueue.supervisor.jobs import Event, JobSpec, spec_problem

T = TypeVar("T")

DEFAULT_URL = "http://127.0.0.1:8080"
DEFAULT_TIMEOUT = 10.0
URL_ENV = "GOQUEUE_URL"
KEY_ENVS = ("GOQUEUE_API_KEY", "API_KEY")  # as the node reads its key
IDEMPOTENCY_HEADER = "Idempotency-Key"
API_KEY_HEADER = "X-API-Key"
USER_AGENT = "goqueue-python"
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


# -- where and how -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A node's base URL, split for `http.client` (and joined again for aiohttp)."""

    url: str
    scheme: str
    host: str
    port: int
    path: str  # a prefix for every route ("" or "/goqueue", behind a proxy)

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        """Check and split `http(s)://HOST[:PORT][/PREFIX]`; ValueError if it is not."""
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"invalid URL {url!r}: expected http://HOST[:PORT]")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            raise ValueError(f"invalid URL {url!r}: bad port") from None
        if parts.query or parts.fragment:
            raise ValueError(f"invalid URL {url!r}: no query or fragment expected")
        return cls(url.rstrip("/"), parts.scheme, parts.hostname, port, parts.path.rstrip("/"))


def url_from(url: str | None) -> str:
    """The node's URL: the argument, else $GOQUEUE_URL, else http://127.0.0.1:8080."""
    return url or os.environ.get(URL_ENV) or DEFAULT_URL


def key_from(api_key: str | None) -> str | None:
    """The API key: the argument, else $GOQUEUE_API_KEY, else $API_KEY (none: None)."""
    return api_key or next((os.environ[k] for k in KEY_ENVS if os.environ.get(k)), None)


@dataclass(frozen=True, slots=True)
class Retries:
    """How a request that is safe to send again is retried after a 503 or a dropped
    connection: at most `attempts` more times, waiting the project's one backoff
    (`base * 2^(n-1)`, capped, jittered), or the node's Retry-After when that is longer
    (still capped). A request refused before reaching the node is always safe."""

    attempts: int = 3
    base: float = 0.2
    cap: float = 5.0
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)

    def delay(self, retry: int, error: ClientError) -> float:
        """Seconds before retry number `retry` (from 1) after `error`."""
        wait = backoff(retry, self.base, self.cap, self.rng)
        if isinstance(error, Unavailable) and error.retry_after is not None:
            wait = max(wait, min(error.retry_after, self.cap))
        return wait


NO_RETRIES = Retries(attempts=0)


def may_retry(call: Call[Any], error: ClientError) -> bool:
    """True if `call` can be sent again after `error` without doing anything twice."""
    if isinstance(error, ConnectionFailed):
        return not error.timed_out and (not error.sent or call.safe)
    return isinstance(error, Unavailable) and call.safe


# -- calls ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """One request and how to read its successful answer (`read(status, body)`)."""

    method: str
    path: str  # quoted, with its query string, below the endpoint's prefix
    read: Callable[[int, bytes], T]
    body: bytes | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    safe: bool = False  # sending it twice does no harm (reads, keyed enqueues, pause)
    wait: float = 0.0  # seconds the node may hold the answer back (added to the timeout)


def headers(api_key: str | None, call: Call[Any]) -> dict[str, str]:
    """The headers of one request."""
    sent = {"Accept": "application/json", "User-Agent": USER_AGENT, **call.headers}
    if call.body is not None:
        sent["Content-Type"] = "application/json"
    if api_key:
        sent[API_KEY_HEADER] = api_key
    return sent


def answer(call: Call[T], status: int, body: bytes, retry_after: str | None) -> T:
    """The result of `call` from the node's answer, or the error it stands for."""
    if status >= 400:
        raise refusal(status, body, retry_after)
    try:
        return call.read(status, body)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise UnexpectedAnswer(
            f"{call.method} {call.path}: the answer is not what the API describes ({exc})"
        ) from None


_ERROR = msgspec.json.Decoder(ErrorOut)


def refusal(status: int, body: bytes, retry_after: str | None = None) -> RequestError:
    """The typed error for an error answer (`{"error", "details", "existing_id"}`)."""
    try:
        error = _ERROR.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        text = body[:200].decode(errors="replace").strip()
        return error_for(status, text or f"HTTP {status}", retry_after=_seconds(retry_after))
    existing = error.existing_id if isinstance(error.existing_id, str) else None
    return error_for(
        status,
        error.error,
        error.details,
        existing_id=existing,
        retry_after=_seconds(retry_after),
    )


def _seconds(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None  # an HTTP date: not worth parsing here


def _decoder(kind: type[T]) -> Callable[[int, bytes], T]:
    decode = msgspec.json.Decoder(kind).decode
    return lambda status, body: decode(body)


def quote(segment: str) -> str:
    """A path segment, quoted so an id or queue name can never change the path."""
    return urllib.parse.quote(segment, safe="")


def with_query(path: str, query: Mapping[str, object]) -> str:
    """`path?a=1&b=2` from the items that are not None (booleans in lower case)."""
    items = {
        k: (str(v).lower() if isinstance(v, bool) else str(v))
        for k, v in query.items()
        if v is not None
    }
    return f"{path}?{urllib.parse.urlencode(items)}" if items else path


_read_job = _decoder(JobOut)
_read_jobs = _decoder(JobList)
_read_dead = _decoder(DeadLetterOut)
_read_dead_letters = _decoder(DeadLetterList)
_read_stats = _decoder(StatsOut)
_read_queue = _decoder(QueueStats)
_decode_events = msgspec.json.Decoder(EventList).decode
_decode_batch = msgspec.json.Decoder(BatchResponse).decode
_decode_purged = msgspec.json.Decoder(Purged).decode
_read_replayed = _decoder(BulkReplayed)
_read_purged_many = _decoder(BulkPurged)
_decode_schedules = msgspec.json.Decoder(ScheduleList).decode
_read_schedule = _decoder(ScheduleOut)


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
    type: str | None, status: str | None, queue: str | None, limit: int | None, offset: int | None
) -> Call[JobList]:
    """GET /jobs: one page, newest first."""
    query = {"type": type, "status": status, "queue": queue, "limit": limit, "offset": offset}
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


SWEEP_LIMIT = 500  # letters per request when a bulk action takes every match


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


class Sweep:
    """A bulk action over every matching letter, as many requests as it takes (sans I/O).
    It stops when nothing matches any more, or after as many letters as matched at the
    first request: letters that die meanwhile (a replayed job failing again) are not
    chased forever."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit  # None: every match; N: one request of at most N
        self.done = 0
        self.remaining = 0
        self._cap: int | None = None

    def next_limit(self) -> int | None:
        """The limit of the next request, or None when finished."""
        if self.limit is not None:
            return self.limit if self._cap is None else None
        if self._cap is None:
            return SWEEP_LIMIT
        left = self._cap - self.done
        return min(SWEEP_LIMIT, left) if left > 0 and self.remaining > 0 else None

    def note(self, count: int, remaining: int) -> None:
        """A request's answer."""
        if self._cap is None:
            self._cap = count + remaining
        elif count == 0:
            self._cap = self.done  # taken by someone else meanwhile: stop
        self.done += count
        self.remaining = remaining


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


class Seen:
    """Ids met while paging newest first: a job enqueued meanwhile shifts the pages, so
    the next page may start with jobs already seen; they are skipped."""

    def __init__(self) -> None:
        self.ids: set[str] = set()

    def fresh(self, job_id: str) -> bool:
        """True the first time an id is met."""
        if job_id in self.ids:
            return False
        self.ids.add(job_id)
        return True
