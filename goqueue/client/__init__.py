"""Clients of a GoQueue node's HTTP API: `Client` (blocking, thread-safe) and
`AsyncClient` (asyncio), typed with the API's own msgspec types.

Modules: `core` (every call and answer, without I/O), `calls` (what a call is: its
headers, answers, errors and retries), `sync` (`Client`, over
`http.client`), `aio` (`AsyncClient`, over aiohttp), `errors` (one hierarchy) and
`default` (the client `Actor.send()` uses, set up by `goqueue.configure`). Importing this
package loads no aiohttp: `AsyncClient` is imported when first named.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from goqueue.api.wire import DeadLetterOut as DeadLetter
from goqueue.api.wire import JobOut as Job
from goqueue.api.wire import QueueStats
from goqueue.api.wire import StatsOut as Stats
from goqueue.client.calls import Retries
from goqueue.client.core import JobOptions, Submitted
from goqueue.client.default import configure
from goqueue.client.errors import (
    BadRequest,
    ClientError,
    Conflict,
    ConnectionFailed,
    IdempotencyMismatch,
    InvalidJob,
    JobCancelled,
    JobFailed,
    NotFound,
    OutcomeUnknown,
    PayloadTooLarge,
    RequestError,
    Unauthorized,
    Unavailable,
    UnexpectedAnswer,
    WaitTimeout,
)
from goqueue.client.sync import Client
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
from goqueue.supervisor.common.jobs import Event, JobSpec

if TYPE_CHECKING:
    from goqueue.client.aio import AsyncClient

__all__ = [
    "AsyncClient",
    "BadRequest",
    "Chain",
    "Client",
    "ClientError",
    "Conflict",
    "ConnectionFailed",
    "DeadLetter",
    "Event",
    "Group",
    "IdempotencyMismatch",
    "InvalidJob",
    "Job",
    "JobCancelled",
    "JobFailed",
    "JobOptions",
    "JobSpec",
    "NotFound",
    "OutcomeUnknown",
    "PayloadTooLarge",
    "QueueStats",
    "RequestError",
    "Retries",
    "Stats",
    "Step",
    "Submitted",
    "Task",
    "Unauthorized",
    "Unavailable",
    "UnexpectedAnswer",
    "WaitTimeout",
    "Workflow",
    "WorkflowTimeout",
    "chain",
    "configure",
    "group",
    "task",
]


def __getattr__(name: str) -> Any:
    if name == "AsyncClient":
        from goqueue.client.aio import AsyncClient

        return AsyncClient
    raise AttributeError(f"module 'goqueue.client' has no attribute {name!r}")
