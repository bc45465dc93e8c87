"""The supervisor's closed vocabularies, each a `StrEnum`.

A member is its string (`Status.DONE == "done"`), so stores, logs, metrics labels and
msgspec's JSON all see the same values as before; a misspelt member is a type error
instead of a series or an audit event that silently never matches.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from types import MappingProxyType
from typing import Final


class Status(StrEnum):
    """Where a job is in its life."""

    WAITING = "waiting"  # a workflow step whose parents have not all finished: not claimable
    PENDING = "pending"
    CLAIMED = "claimed"  # a node holds it under a lease; no worker has taken it yet
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL: frozenset[Status] = frozenset({Status.DONE, Status.FAILED, Status.CANCELLED})


class WorkflowStatus(StrEnum):
    """Where a workflow is: its steps' statuses summed up."""

    RUNNING = "running"
    DONE = "done"  # every step done
    FAILED = "failed"  # a step failed for good (its dependents are cancelled)
    CANCELLED = "cancelled"  # cancelled as a whole


class EventKind(StrEnum):
    """What an entry of a job's audit trail records."""

    ENQUEUED = "enqueued"
    STARTED = "started"
    SUCCEEDED = "succeeded"
    ATTEMPT_FAILED = "attempt_failed"
    RETRY_SCHEDULED = "retry_scheduled"
    LEASE_EXPIRED = "lease_expired"
    DEAD_LETTERED = "dead_lettered"
    REPLAYED = "replayed"
    CANCELLED = "cancelled"
    RELEASED = "released"
    LATE_OUTCOME = "late_outcome"  # an outcome written after its lease was reaped
    DEBOUNCED = "debounced"  # an enqueue with its debounce key replaced it before it started


class AttemptOutcome(StrEnum):
    """How one attempt ended (the `outcome` label of the attempt metrics)."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMEOUT = "timeout"
    CRASHED = "crashed"


class WorkerState(StrEnum):
    """A worker process as the supervisor sees it (in the order /stats lists them)."""

    BUSY = "busy"
    IDLE = "idle"
    BOOTING = "booting"
    STOPPING = "stopping"


class KillReason(StrEnum):
    """Why the supervisor ended a worker (None on a worker means it died on its own)."""

    STOPPED = "stopped"  # asked to exit cleanly: shrink, reload, shutdown of an idle worker
    TIMEOUT = "timeout"
    CANCEL = "cancel"
    LEASE_LOST = "lease_lost"
    SHUTDOWN = "shutdown"
    RECYCLE = "recycle"
    BOOT = "boot"  # exited with WORKER_BOOT_ERROR: its actor modules cannot be imported
    MEMORY = "memory"  # its job took more memory than --max-worker-rss-mb allows


class RestartReason(StrEnum):
    """Why a worker was replaced (the `reason` label of the restart counter)."""

    TIMEOUT = "timeout"
    CRASH = "crash"
    RECYCLE = "recycle"
    RELOAD = "reload"
    CANCEL = "cancel"
    SHUTDOWN = "shutdown"
    LEASE_LOST = "lease_lost"
    MEMORY = "memory"


# A worker that died of these is replaced and counted under that restart reason; the
# other endings (stopped, recycled, shut down, boot failure) are counted where decided.
RESTART_AFTER: Final[Mapping[KillReason | None, RestartReason]] = MappingProxyType(
    {
        None: RestartReason.CRASH,
        KillReason.TIMEOUT: RestartReason.TIMEOUT,
        KillReason.CANCEL: RestartReason.CANCEL,
        KillReason.LEASE_LOST: RestartReason.LEASE_LOST,
        KillReason.MEMORY: RestartReason.MEMORY,
    }
)


class WebhookOutcome(StrEnum):
    """What became of one webhook delivery."""

    DELIVERED = "delivered"
    RETRIED = "retried"  # one per retry scheduled
    FAILED = "failed"  # attempts exhausted
    DROPPED = "dropped"  # in memory: queue full, or the sender closed
    REFUSED = "refused"  # the egress policy refused the URL or its address: nothing sent


class WebhookEvent(StrEnum):
    """What a webhook announces (its `X-GoQueue-Event` header): the terminal status."""

    DONE = "job.done"
    FAILED = "job.failed"
    CANCELLED = "job.cancelled"
