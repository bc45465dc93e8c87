"""What `goqueue.Client`, `goqueue.AsyncClient` and `goqueue.pg` raise: one hierarchy.

    ClientError
    ├── RequestError          the request was refused; `status` is the HTTP status
    │   ├── BadRequest              400: invalid job (`details["field"]` names it)
    │   │   └── InvalidJob          ... found by the client itself: nothing was sent
    │   ├── Unauthorized            401: missing or wrong API key
    │   ├── NotFound                404: no such job or dead letter
    │   ├── Conflict                409: a duplicate (`existing_id`) or a job in the wrong state
    │   ├── PayloadTooLarge         413
    │   ├── IdempotencyMismatch     422: an Idempotency-Key reused with another body
    │   ├── Unavailable             503: queue full, node draining, store down (`retry_after`)
    │   └── OutcomeUnknown          504: the write may or may not have been stored
    ├── ConnectionFailed      no answer: refused, timed out, dropped
    ├── UnexpectedAnswer      an answer that is not what the API describes
    ├── JobFailed             `wait`: the job failed for good (`JobCancelled`: it was cancelled)
    └── WaitTimeout           `wait`: still unfinished at the timeout (also a TimeoutError)

`goqueue.pg` raises the same classes, with the status the HTTP API would have answered.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from goqueue.api.wire import JobOut


class ClientError(Exception):
    """Base of every error a GoQueue client raises."""


class RequestError(ClientError):
    """The node refused the request: `status` (HTTP), the message, and `details` (the
    offending field, parameter or header, where there is one)."""

    status = 0

    def __init__(self, message: str, details: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details: dict[str, Any] = dict(details or {})

    @property
    def field(self) -> str | None:
        """The job field at fault (`priority`, `on_success.type`...), if named."""
        field = self.details.get("field")
        return field if isinstance(field, str) else None


class BadRequest(RequestError):
    """400: the job (or another input) is invalid; `field` names what."""

    status = 400


class InvalidJob(BadRequest):
    """A job the node would refuse with a 400, found before sending it (the same msgspec
    type and rules as the node's); nothing was sent."""


class Unauthorized(RequestError):
    """401: the node needs an API key (`api_key=` or $GOQUEUE_API_KEY) and got none or
    another."""

    status = 401


class NotFound(RequestError):
    """404: no job or dead letter has that id."""

    status = 404


class _NamesExisting(RequestError):
    """A refusal that names the job already holding what the request asked for
    (`existing_id`, from the argument or the answer's details)."""

    def __init__(
        self,
        message: str,
        details: Mapping[str, Any] | None = None,
        existing_id: str | None = None,
    ) -> None:
        super().__init__(message, details)
        found = existing_id or self.details.get("existing_id")
        self.existing_id: str | None = found if isinstance(found, str) else None


class Conflict(_NamesExisting):
    """409: a duplicate inside its dedupe window, or of a unique key an unfinished job
    holds (`existing_id` is the job holding the key), or a job in a state that refuses the
    request (cancelling a finished job)."""

    status = 409


class PayloadTooLarge(RequestError):
    """413: the request body is larger than the node accepts."""

    status = 413


class IdempotencyMismatch(_NamesExisting):
    """422: the Idempotency-Key was used before with a different job; `existing_id` is
    that job."""

    status = 422


class Unavailable(RequestError):
    """503: the queue is full, the node is draining or its store is down; try later
    (`retry_after` seconds, when the node said)."""

    status = 503

    def __init__(
        self,
        message: str,
        details: Mapping[str, Any] | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message, details)
        self.retry_after = retry_after


class OutcomeUnknown(RequestError):
    """504: the node's store did not confirm the write in time, so it may or may not
    have been stored. Unlike a 503, sending it again as it was might do it twice: send it
    with the same Idempotency-Key (`idempotency_key=`), which answers the job if it was
    stored and stores it if not. The client's retries already do so for enqueues."""

    status = 504


class ConnectionFailed(ClientError):
    """No answer from the node. `sent` is False when the request surely never reached it
    (the connection was refused), so sending it again is always safe; `timed_out` when
    the client gave up waiting."""

    def __init__(self, message: str, *, sent: bool, timed_out: bool = False) -> None:
        super().__init__(message)
        self.sent = sent
        self.timed_out = timed_out


class UnexpectedAnswer(ClientError):
    """The node answered with something the API does not describe (not GoQueue?)."""


class JobFailed(ClientError):
    """`wait`: the job ended without a result. `job` is its final state, `error` its last
    error and `attempts` how many attempts ran."""

    def __init__(self, job: JobOut) -> None:
        self.job = job
        self.error = job.last_error
        self.attempts = job.attempts
        super().__init__(
            f"job {job.id} ({job.type}) {job.status} after {job.attempts} "
            f"attempt{'s' if job.attempts != 1 else ''}: {job.last_error or 'no error recorded'}"
        )


class JobCancelled(JobFailed):
    """`wait`: the job was cancelled."""


class WaitTimeout(ClientError, TimeoutError):
    """`wait`: the job had not finished within the timeout; `job` is its state then."""

    def __init__(self, job: JobOut, timeout: float) -> None:
        self.job = job
        self.timeout = timeout
        super().__init__(f"job {job.id} is still {job.status} after {timeout:g} s")


_BY_STATUS: dict[int, type[RequestError]] = {
    cls.status: cls
    for cls in (
        BadRequest,
        Unauthorized,
        NotFound,
        Conflict,
        PayloadTooLarge,
        IdempotencyMismatch,
        Unavailable,
        OutcomeUnknown,
    )
}


def error_for(
    status: int,
    message: str,
    details: Mapping[str, Any] | None = None,
    *,
    existing_id: str | None = None,
    retry_after: float | None = None,
) -> RequestError:
    """The error for an answer with this status (a plain `RequestError` for a status
    without a class of its own)."""
    cls = _BY_STATUS.get(status)
    if cls is None:
        error = RequestError(message, details)
        error.status = status
        return error
    if issubclass(cls, Conflict | IdempotencyMismatch):
        return cls(message, details, existing_id)
    if cls is Unavailable:
        return Unavailable(message, details, retry_after)
    return cls(message, details)
