"""One hierarchy for every error the supervisor raises on purpose (engine, stores, the
node's start); the API maps those a request can meet to a status."""

from __future__ import annotations

import difflib
from collections.abc import Collection


class GoQueueError(Exception):
    """Base of every deliberate GoQueue error."""


class ConfigError(GoQueueError):
    """A configuration value is invalid; the message names the option."""


class StoreError(GoQueueError):
    """Base of errors a store raises for a request it refuses."""


UNIQUE_HELD = "it holds the unique_key until it finishes"


class DuplicateJob(StoreError):
    """A job with the same dedupe key was enqueued inside its window, or a job holding
    the same unique key is not finished yet."""

    def __init__(self, existing_id: str, held: str | None = None) -> None:
        super().__init__(f"duplicate of job {existing_id}" + (f" ({held})" if held else ""))
        self.existing_id = existing_id


class IdempotencyMismatch(StoreError):
    """An Idempotency-Key was reused with a different request body."""

    def __init__(self, existing_id: str) -> None:
        super().__init__("Idempotency-Key was already used with a different request body")
        self.existing_id = existing_id


class TooManyQueues(GoQueueError):
    """A job names a new queue while `--max-queues` queues hold pending jobs or are
    paused; `field` names where (`queue`, `on_success.queue`)."""

    def __init__(self, limit: int, field: str = "queue") -> None:
        super().__init__(
            f"too many queues: {limit} queues hold pending jobs or are paused "
            "(--max-queues); use an existing queue, or retry once some have emptied"
        )
        self.limit = limit
        self.field = field


class StoreFull(StoreError):
    """The bounded in-memory store holds as many pending jobs as it may."""


class StoreUnavailable(StoreError):
    """The store cannot be reached right now (database down); retry later."""


class OutcomeUnknown(StoreError):
    """A write was sent but its answer never came (a timeout, a connection lost while its
    commit was in flight): it may or may not have been stored. Unlike StoreUnavailable,
    it does not mean nothing was stored, so only a retry with the same Idempotency-Key
    is safe."""


class StoreMisconfigured(ConfigError):
    """The store's settings are wrong, which no restart of the database would cure (a
    database that does not exist, credentials refused, no permission on the schema): the
    node stops instead of retrying."""


class NotFound(StoreError):
    """No job or dead letter has that id."""


class InvalidState(StoreError):
    """The job is not in a state that allows the request (e.g. cancelling a finished job)."""

    def __init__(self, message: str, status: str) -> None:
        super().__init__(message)
        self.status = status


class UnknownJobType(GoQueueError):
    """No actor of that name is registered (on this node, or on any live node)."""

    def __init__(self, job_type: str, path: str = "type", known: Collection[str] = ()) -> None:
        close = difflib.get_close_matches(job_type, sorted(known), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        super().__init__(
            f"unknown job type {job_type!r}: no actor of that name is registered{hint}"
        )
        self.job_type = job_type
        self.path = path


class InvalidJob(GoQueueError):
    """A job's fields contradict each other (rules a schema cannot state); `field` names
    the one to fix."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


class InvalidPayload(InvalidJob):
    """A payload does not fit its typed actor's parameters (a missing field, a wrong type,
    an unknown field); `field` names where (`payload.width`), and so does the message."""

    def __init__(self, reason: str, field: str) -> None:
        super().__init__(f"{field}: {reason}", field)
        self.reason = reason


class InvalidWorkflow(GoQueueError):
    """The steps do not form a workflow (no steps, a duplicate or unknown key, a cycle);
    `field` names the place to fix."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


class Draining(GoQueueError):
    """The node is shutting down and accepts no new jobs."""


class BootError(GoQueueError):
    """The first worker could not import the actor modules: the node cannot start."""
