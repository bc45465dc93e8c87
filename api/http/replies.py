"""Request and response bodies of the HTTP API, with the one encoder and `reply`.

The bodies themselves live in `goqueue.api.wire`, which clients import without aiohttp;
they are re-exported here so the routes keep one place to import them from. Responses
never show a `Job` as stored: `seq` is the store's tie-breaker, not part of the API, so
jobs go out as `JobOut` (every other field, in the same order).
"""

from __future__ import annotations

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

__all__ = [
    "BATCH_DECODER",
    "BULK_CANCEL_DECODER",
    "HIDDEN_JOB_FIELDS",
    "JSON",
    "LIVE_JOB_FIELDS",
    "MAX_BATCH",
    "SPEC_DECODER",
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
    "dead_out",
    "encode",
    "job_out",
    "reply",
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
