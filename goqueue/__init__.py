"""GoQueue: a background job processor with a REST API, whose supervisor really kills hung
handlers.

What users import is here. Declaring actors: `from goqueue import actor, Retry, Fail`.
Producing jobs: `goqueue.Client`, `goqueue.AsyncClient`, `goqueue.configure` (for
`my_actor.send()`), the errors they raise, and `goqueue.pg.enqueue` (inside your own
PostgreSQL transaction). The card's folders are installed beneath this package as
`goqueue.actors` (what worker processes load), `goqueue.supervisor` (the engine) and
`goqueue.api` (HTTP and the command line).

Importing `goqueue` loads only `goqueue.actors`, so a worker process stays light: the
producer's side is imported the first time one of its names is used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from goqueue.actors import (
    Actor,
    ActorDefinitionError,
    Context,
    EnqueueError,
    Fail,
    Retry,
    TypedActor,
    actor,
)

if TYPE_CHECKING:
    from goqueue import pg
    from goqueue.client import (
        AsyncClient,
        BadRequest,
        Client,
        ClientError,
        Conflict,
        ConnectionFailed,
        DeadLetter,
        IdempotencyMismatch,
        InvalidJob,
        Job,
        JobCancelled,
        JobFailed,
        JobSpec,
        NotFound,
        OutcomeUnknown,
        PayloadTooLarge,
        RequestError,
        Retries,
        Unauthorized,
        Unavailable,
        UnexpectedAnswer,
        WaitTimeout,
        configure,
    )
    from goqueue.client.workflows import (
        Chain,
        Group,
        Step,
        Task,
        Workflow,
        WorkflowTimeout,
        chain,
        group,
        task,
    )

__all__ = [
    "Actor",
    "ActorDefinitionError",
    "AsyncClient",
    "BadRequest",
    "Chain",
    "Client",
    "ClientError",
    "Conflict",
    "ConnectionFailed",
    "Context",
    "DeadLetter",
    "EnqueueError",
    "Fail",
    "Group",
    "IdempotencyMismatch",
    "InvalidJob",
    "Job",
    "JobCancelled",
    "JobFailed",
    "JobSpec",
    "NotFound",
    "OutcomeUnknown",
    "PayloadTooLarge",
    "RequestError",
    "Retries",
    "Retry",
    "Step",
    "Task",
    "TypedActor",
    "Unauthorized",
    "Unavailable",
    "UnexpectedAnswer",
    "WaitTimeout",
    "Workflow",
    "WorkflowTimeout",
    "actor",
    "chain",
    "configure",
    "group",
    "pg",
    "task",
]


# Served lazily, the first time one is used: every public name not imported above (the
# producer's side, from `goqueue.client`, and the `pg` module).
_LAZY = frozenset(__all__) - frozenset(globals())


def __getattr__(name: str) -> Any:
    if name == "pg":
        return importlib.import_module("goqueue.pg")
    if name in _LAZY:
        return getattr(importlib.import_module("goqueue.client"), name)
    raise AttributeError(f"module 'goqueue' has no attribute {name!r}")
