"""What the stores' reads answer and take, beyond a job itself: counts by status, one
queue's stats, queue depths for a metrics scrape, a page of a listing and the filters of
a job listing. Shared by the stores, the engine, the metrics and the API."""

from __future__ import annotations

from typing import Any

import msgspec


class QueueStats(msgspec.Struct):
    """Counts for one queue."""

    queue: str
    counts: dict[str, int]
    depth_by_priority: dict[str, int]
    paused: bool = False


class Stats(msgspec.Struct):
    """Counts by status and depth (pending, due or not) by queue and priority."""

    counts: dict[str, int]
    queues: dict[str, dict[str, int]]
    dead_letters: int


# The queue label of the pending jobs of every queue beyond the deepest ones, in metrics:
# parentheses are not allowed in a queue name, so no real queue can take this series over.
OTHER_QUEUES = "(other)"


class QueueDepths(msgspec.Struct):
    """Queue health for a metrics scrape, bounded whatever the number of queues: pending
    jobs by priority for the `top` deepest queues, summed by priority over all the others;
    the longest wait of a due job by queue (the same way); dead letters."""

    top: dict[str, dict[str, int]]
    other: dict[str, int]
    queues: int  # queues holding pending jobs
    pending: int  # pending jobs in every queue
    # seconds the longest-waiting due job of each of the `top` queues has waited (0 with
    # none due), the longest of all the others under `OTHER_QUEUES` when there are others
    waiting: dict[str, float] = msgspec.field(default_factory=dict)
    dead_letters: int = 0


class Page(msgspec.Struct):
    """One page of a listing, plus the total matching."""

    items: list[Any]
    total: int


class JobFilter(msgspec.Struct, kw_only=True):
    """Filters for listing jobs."""

    type: str | None = None
    status: str | None = None
    queue: str | None = None
    parent_id: str | None = None  # jobs enqueued by this one (its chain, ctx.enqueue)
    concurrency_key: str | None = None  # a flow-control key's jobs
