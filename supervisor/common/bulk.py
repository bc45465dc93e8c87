"""Bulk changes, by filter rather than by id: which jobs a bulk cancel takes, and what a
bulk cancel, replay or purge did. Shared by the stores, the engine and the API."""

from __future__ import annotations

from datetime import datetime

import msgspec
from goqueue.supervisor.common.enums import Status
from goqueue.supervisor.common.jobs import Job


class Replayed(msgspec.Struct):
    """What a bulk replay did: the fresh jobs, and how many matching letters it left
    (beyond its limit, or dead-lettered before the call and still there)."""

    jobs: list[Job]
    remaining: int


class Purged(msgspec.Struct):
    """What a bulk purge did: how many letters it deleted, how many matching it left."""

    purged: int
    remaining: int


BULK_CANCEL = "bulk cancel"  # the detail of the `cancelled` event of a bulk cancel


class CancelFilter(msgspec.Struct, kw_only=True, frozen=True):
    """Which unfinished jobs a bulk cancel takes: of `statuses` (pending and claimed;
    running too when forced), in `queue`, of `type`, created before `created_before`
    (each None for any)."""

    statuses: tuple[Status, ...] = (Status.PENDING, Status.CLAIMED)
    queue: str | None = None
    type: str | None = None
    created_before: datetime | None = None

    def matches(self, job: Job) -> bool:
        """True if `job` passes the filters, whatever its status."""
        return (
            (self.queue is None or job.queue == self.queue)
            and (self.type is None or job.type == self.type)
            and (self.created_before is None or job.created_at < self.created_before)
        )


class Cancelled(msgspec.Struct):
    """What a bulk cancel did: the jobs it cancelled, the lease tokens of those a node
    held (claimed or running: to drop or kill), how many matching it left (beyond its
    limit, or taken by another request meanwhile), how many running jobs passing the
    filters it left alone because it was not forced, and how many it cancelled running."""

    jobs: list[Job]
    tokens: list[str]
    remaining: int
    running: int
    killed: int = 0
