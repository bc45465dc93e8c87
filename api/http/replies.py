"""What a route answers: a JSON reply (`reply`, with the one encoder), or an `ApiError`
for what the API itself refuses, with the one mapping from the engine's error hierarchy
to statuses and JSON bodies; and `within`, the deadline on a store call.

The bodies themselves live in `goqueue.api.wire`, which clients import without aiohttp;
they are re-exported here so the routes keep one place to import them from. Responses
never show a `Job` as stored: `seq` is the store's tie-breaker, not part of the API, so
jobs go out as `JobOut` (every other field, in the same order).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any, TypeVar, cast

import msgspec
from aiohttp import web
from goqueue.api.wire import (
    BATCH_DECODER,
    BULK_CANCEL_DECODER,
    HIDDEN_JOB_FIELDS,
    LIVE_JOB_FIELDS,
    MAX_BATCH,
    SPEC_DECODER,
    BatchItem,
    BatchRequest,
    BatchResponse,
    BulkCancelled,
    BulkCancelRequest,
    BulkPurged,
    BulkReplayed,
    DeadLetterList,
    DeadLetterOut,
    ErrorOut,
    EventList,
    Health,
    JobList,
    JobOut,
    Purged,
    Ready,
    StatsOut,
    Uuid,
    dead_out,
    job_out,
)
from goqueue.supervisor.common import eager
from goqueue.supervisor.common.errors import (
    Draining,
    DuplicateJob,
    GoQueueError,
    IdempotencyMismatch,
    InvalidJob,
    InvalidState,
    InvalidWorkflow,
    NotFound,
    OutcomeUnknown,
    StoreFull,
    StoreUnavailable,
    TooManyQueues,
    UnknownJobType,
)
from msgspec import UNSET

__all__ = [
    "BATCH_DECODER",
    "BULK_CANCEL_DECODER",
    "HIDDEN_JOB_FIELDS",
    "JSON",
    "LIVE_JOB_FIELDS",
    "MAX_BATCH",
    "OUTCOME_UNKNOWN",
    "SPEC_DECODER",
    "STORE_TIMEOUT",
    "STORE_UNAVAILABLE",
    "ApiError",
    "BatchItem",
    "BatchRequest",
    "BatchResponse",
    "BulkCancelRequest",
    "BulkCancelled",
    "BulkPurged",
    "BulkReplayed",
    "DeadLetterList",
    "DeadLetterOut",
    "ErrorOut",
    "EventList",
    "Health",
    "JobList",
    "JobOut",
    "Purged",
    "Ready",
    "StatsOut",
    "Uuid",
    "bad_request",
    "dead_out",
    "encode",
    "from_domain",
    "job_out",
    "reply",
    "safe_text",
    "within",
]

JSON = "application/json"

# The encoder is built once and reused (msgspec's advice; it holds no loop).
_encode = msgspec.json.Encoder().encode


def encode(value: object) -> bytes:
    """JSON bytes of any response value."""
    return _encode(value)


def reply(value: object, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    """A JSON response."""
    return web.Response(body=_encode(value), status=status, content_type=JSON, headers=headers)


log = logging.getLogger("goqueue.api")

T = TypeVar("T")

STORE_TIMEOUT = 10.0
RETRY_AFTER_FULL = "1"
RETRY_AFTER_QUEUES = "5"
RETRY_AFTER_UNAVAILABLE = "5"
STORE_UNAVAILABLE = "the store is unavailable; retry later"
# POST /jobs and POST /workflows take an Idempotency-Key; the other writes are checked by
# reading the job, queue, schedule or dead letter before repeating them
OUTCOME_UNKNOWN = (
    "the outcome is unknown: the request may have been stored; retry with the same "
    "Idempotency-Key to find out (or, for a write that takes none, read the state first)"
)


class ApiError(Exception):
    """A request the API answers with an error status and `{"error", "details"}`."""

    def __init__(
        self,
        status: int,
        message: str,
        details: dict[str, Any] | None = None,
        *,
        headers: dict[str, str] | None = None,
        existing_id: str | None = None,
        close: bool = False,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.details = details
        self.headers = headers
        self.existing_id = existing_id
        self.close = close  # end the connection after answering (its input is untrusted)

    def response(self) -> web.Response:
        """The JSON answer; text quoting hostile input is made encodable first."""
        existing = UNSET if self.existing_id is None else self.existing_id
        try:
            body = encode(ErrorOut(self.message, self.details, existing))
        except UnicodeEncodeError:  # a lone surrogate from an undecodable header or path
            details = cast("dict[str, Any] | None", safe_text(self.details))
            body = encode(ErrorOut(str(safe_text(self.message)), details, existing))
        response = web.Response(
            body=body, status=self.status, content_type=JSON, headers=self.headers
        )
        if self.close:
            response.force_close()
        return response


def safe_text(value: object) -> object:
    """`value` with every string made encodable (a lone surrogate becomes `\\udcff`)."""
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {safe_text(k): safe_text(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [safe_text(v) for v in value]
    return value


def bad_request(message: str, **details: Any) -> ApiError:
    """A 400 naming what was wrong (`field=`, `parameter=` or `header=`)."""
    return ApiError(400, message, details or None)


def from_domain(exc: GoQueueError) -> ApiError | None:
    """The answer to a deliberate engine or store error; None for one the API cannot
    explain to a client (a fault)."""
    message = str(exc)
    match exc:
        case DuplicateJob():
            details = {"existing_id": exc.existing_id}
            return ApiError(409, message, details, existing_id=exc.existing_id)
        case IdempotencyMismatch():
            return ApiError(
                422, message, {"existing_id": exc.existing_id, "header": "Idempotency-Key"}
            )
        case NotFound():
            return ApiError(404, message)
        case InvalidState():
            return ApiError(409, message, {"status": exc.status})
        case UnknownJobType():
            return ApiError(400, message, {"field": exc.path, "type": exc.job_type})
        case InvalidWorkflow() | InvalidJob():
            return ApiError(400, message, {"field": exc.field})
        case TooManyQueues():
            refused = {"field": exc.field, "max_queues": exc.limit}
            return ApiError(429, message, refused, headers={"Retry-After": RETRY_AFTER_QUEUES})
        case StoreFull():
            return ApiError(503, message, headers={"Retry-After": RETRY_AFTER_FULL})
        case StoreUnavailable():
            # the cause (a driver's message, a host name) goes to the log, never to a client
            log.warning("store unavailable", extra={"error": message})
            return ApiError(
                503, STORE_UNAVAILABLE, headers={"Retry-After": RETRY_AFTER_UNAVAILABLE}
            )
        case OutcomeUnknown():
            log.warning("write outcome unknown", extra={"error": message})
            return ApiError(504, OUTCOME_UNKNOWN, {"header": "Idempotency-Key"})
        case Draining():
            return ApiError(503, message)
    return None


async def within(
    call: Coroutine[Any, Any, T], seconds: float = STORE_TIMEOUT, *, writes: bool = False
) -> T:
    """Await a store-backed call, turning a hang past `seconds` into StoreUnavailable (503)
    for a read, and into OutcomeUnknown (504) for a call that `writes`: its commit may
    land after the answer, so the client must not be told nothing was stored.
    A call that answers without waiting (the memory store) is not timed: it cannot hang,
    and a deadline would cost a timer per request."""
    try:
        started = eager.step(call)
        if isinstance(started, eager.Done):
            return started.value
        async with asyncio.timeout(seconds):
            return await started
    except TimeoutError:
        log.warning("store call timed out", extra={"seconds": seconds, "writes": writes})
        message = f"the store did not answer within {seconds:g} s"
        raise (OutcomeUnknown if writes else StoreUnavailable)(message) from None
