"""HTTP errors: `ApiError` for what the API itself refuses, and the one mapping from the
engine's error hierarchy (and aiohttp's own exceptions) to statuses and JSON bodies."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any, TypeVar

from aiohttp import web
from goqueue.api.schemas import JSON, ErrorOut, encode
from goqueue.supervisor.errors import (
    Draining,
    DuplicateJob,
    GoQueueError,
    IdempotencyMismatch,
    InvalidState,
    NotFound,
    StoreFull,
    StoreUnavailable,
    UnknownJobType,
)
from msgspec import UNSET

log = logging.getLogger("goqueue.api")

T = TypeVar("T")

STORE_TIMEOUT = 10.0
RETRY_AFTER_FULL = "1"
RETRY_AFTER_UNAVAILABLE = "5"


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
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.details = details
        self.headers = headers
        self.existing_id = existing_id

    def response(self) -> web.Response:
        """The JSON answer."""
        body = ErrorOut(
            self.message, self.details, UNSET if self.existing_id is None else self.existing_id
        )
        return web.Response(
            body=encode(body), status=self.status, content_type=JSON, headers=self.headers
        )


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
        case StoreFull():
            return ApiError(503, message, headers={"Retry-After": RETRY_AFTER_FULL})
        case StoreUnavailable():
            return ApiError(
                503,
                message or "the store is unavailable",
                headers={"Retry-After": RETRY_AFTER_UNAVAILABLE},
            )
        case Draining():
            return ApiError(503, message)
    return None


async def within(awaitable: Awaitable[T], seconds: float = STORE_TIMEOUT) -> T:
    """Await a store-backed call, turning a hang past `seconds` into StoreUnavailable (503)."""
    try:
        async with asyncio.timeout(seconds):
            return await awaitable
    except TimeoutError:
        log.warning("store call timed out", extra={"seconds": seconds})
        raise StoreUnavailable(f"the store did not answer within {seconds:g} s") from None
