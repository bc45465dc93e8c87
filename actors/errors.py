"""Exceptions a handler raises to steer its job, and the error raised for a bad actor."""

from __future__ import annotations


class ActorError(Exception):
    """Base of the exceptions in this module."""


class Retry(ActorError):
    """Raise from a handler to retry later: after `delay` seconds, or the usual backoff.

    The attempt still counts against `max_retries`, so a job cannot retry forever.
    """

    def __init__(self, message: str = "retry requested", *, delay: float | None = None) -> None:
        if delay is not None and delay < 0:
            raise ValueError("Retry delay must be >= 0")
        super().__init__(message)
        self.delay = delay


class Fail(ActorError):
    """Raise from a handler to fail the job now, without further retries (dead-letter)."""


class ActorDefinitionError(ActorError):
    """An `@actor` declaration or an actor module is invalid; raised at import time."""


class EnqueueError(ActorError):
    """`ctx.enqueue` was refused: `refusal` says why ("invalid", "duplicate" with the
    `existing_id` of the job holding the dedupe key, or "unavailable")."""

    def __init__(self, message: str, *, refusal: str, existing_id: str | None = None) -> None:
        super().__init__(message)
        self.refusal = refusal
        self.existing_id = existing_id
