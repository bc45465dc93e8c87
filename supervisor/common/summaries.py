"""Compact read models for operators (the dashboard and anyone else): queues with their
depth and wait, worker processes, live nodes, and job or dead-letter rows whose payloads
are cut to a preview by the store itself, so a list never ships megabytes.

They are answered as they are by the summary routes (`api/http/routes/summary.py`).
"""

from __future__ import annotations

import os
from typing import Any

import msgspec
from goqueue.supervisor.common.enums import Status, WorkerState
from goqueue.supervisor.common.jobs import AwareTime, DeadLetter, Job
from msgspec import UNSET, UnsetType

DEFAULT_PREVIEW = 200  # characters of a payload, result or error shown in a list row
MAX_PREVIEW = 10_000


class Preview(msgspec.Struct, gc=False):
    """The start of a long text (a payload or result as JSON, or an error): `text` holds at
    most the requested number of characters of it; `size` is the whole text in bytes."""

    text: str
    size: int
    truncated: bool


def preview(raw: bytes | memoryview, limit: int) -> Preview:
    """The first `limit` characters of UTF-8 `raw`, decoding no more than needed (a
    character is at most 4 bytes, so 4 * limit bytes hold at least `limit` of them)."""
    view = memoryview(raw)
    head = bytes(view[: limit * 4]).decode("utf-8", "replace")
    text = head[:limit]
    return Preview(text, len(view), len(view) > limit * 4 or len(head) > limit)


def text_preview(text: str | None, limit: int) -> Preview | None:
    """A preview of a plain string (an error message), or None."""
    if text is None:
        return None
    return Preview(text[:limit], len(text.encode("utf-8", "surrogateescape")), len(text) > limit)


class QueueSummary(msgspec.Struct):
    """One queue: pending jobs (due or scheduled) by priority, how long the longest-waiting
    due job has waited, and whether dispatch from it is paused. Queues with pending or
    running jobs are listed, and paused ones even when empty."""

    name: str
    pending: int
    scheduled: int  # pending but not due yet (delayed, or waiting for a retry)
    running: int
    depth_by_priority: dict[str, int]  # pending jobs by priority, highest first
    oldest_due_at: AwareTime | None  # run_at of the due job that has waited longest
    waiting_seconds: float | None  # how long that job has waited, by the store's clock
    paused: bool


class NodeSummary(msgspec.Struct):
    """A node sharing the store: when it started, its last heartbeat, the types it runs.
    `live` is false once its heartbeat is older than the lease reaper tolerates."""

    node_id: str
    started_at: AwareTime
    heartbeat_at: AwareTime
    live: bool
    types: list[str]
    # what the node published with that heartbeat (None from nodes that publish none)
    report: NodeReport | None = None


class WorkerSummary(msgspec.Struct):
    """One worker process of this node, and the attempt it is running, if any."""

    pid: int
    slot: int
    generation: int
    state: WorkerState
    retiring: bool  # will be replaced after its current job (reload, recycle, shrink)
    job_id: str | None
    job_type: str | None
    attempt: int | None
    running_seconds: float | None  # how long the current attempt has run
    rss_kb: int | None  # resident memory now (None where /proc cannot tell)
    jobs_run: int


# At most this many workers in a node's report: it rides on every heartbeat.
REPORT_WORKERS = 64


class NodeReport(msgspec.Struct):
    """What a node publishes with each heartbeat, so any node can show the whole cluster:
    its worker processes (at most REPORT_WORKERS) and the jobs it finished and the
    attempts that failed on it in the last minute."""

    workers: list[WorkerSummary]
    done_last_minute: int
    failed_last_minute: int


class JobBrief(msgspec.Struct):
    """A job as a list row: every scalar field, and previews of payload, result and error."""

    id: str
    type: str
    queue: str
    priority: int
    status: Status
    attempts: int
    max_retries: int
    run_at: AwareTime
    created_at: AwareTime
    started_at: AwareTime | None
    finished_at: AwareTime | None
    updated_at: AwareTime
    parent_id: str | None
    payload: Preview
    result: Preview | None
    last_error: Preview | None
    # a running job's last ctx.progress (a number 0-1 or a small object), where the node
    # answering runs it; absent otherwise (as `JobOut.progress`)
    progress: Any | UnsetType = UNSET


class DeadBrief(msgspec.Struct):
    """A dead letter as a list row."""

    id: str
    job_id: str
    type: str
    queue: str
    priority: int
    attempts: int
    max_retries: int
    created_at: AwareTime  # when it was dead-lettered
    payload: Preview
    last_error: Preview | None


class DeadFilter(msgspec.Struct, kw_only=True):
    """Filters for dead letters; `error` is a case-insensitive substring of the last
    error, `before` and `after` bound when the letter was written (exclusive)."""

    type: str | None = None
    queue: str | None = None
    error: str | None = None
    job_id: str | None = None
    before: AwareTime | None = None
    after: AwareTime | None = None

    def matches(self, dead: DeadLetter) -> bool:
        """True when `dead` passes every filter that is set (the memory store's test)."""
        job = dead.job
        return (
            (self.type is None or job.type == self.type)
            and (self.queue is None or job.queue == self.queue)
            and (self.job_id is None or dead.job_id == self.job_id)
            and (self.before is None or dead.created_at < self.before)
            and (self.after is None or dead.created_at > self.after)
            and (self.error is None or self.error.casefold() in (job.last_error or "").casefold())
        )

    @property
    def empty(self) -> bool:
        """True when no filter is set: a bulk action then needs `all=true`."""
        return self == DeadFilter()

    @property
    def by_group(self) -> bool:
        """True when nothing but the type and the queue may be set: the letters passing
        are counted by (queue, type) as they come and go, so the stores count no rows."""
        return self == DeadFilter(type=self.type, queue=self.queue)


_PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024


def rss_kb(pid: int) -> int | None:
    """A process's resident memory in KiB, read from /proc (None where there is none)."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE_KB
    except (OSError, ValueError, IndexError):
        return None


class QueueDepth(msgspec.Struct):
    """A queue and its pending jobs."""

    name: str
    pending: int


class LiveStats(msgspec.Struct):
    """Store counts as read at `at`: jobs by status, dead letters, and the queues with the
    most pending jobs (at most ten)."""

    at: AwareTime
    counts: dict[str, int]
    dead_letters: int
    busiest: list[QueueDepth]


class TypeStats(msgspec.Struct):
    """One job type over the jobs the store still keeps (finished ones until pruned): how
    many are in each status, the run time of finished attempts and the failure rate.

    Run times are those of each finished job's last attempt (finished_at - started_at);
    `failure_rate` is failed / (done + failed), None before any finished.
    """

    type: str
    counts: dict[str, int]  # by status, every status listed (zero included)
    p50_seconds: float | None
    p95_seconds: float | None
    failure_rate: float | None


def type_stats(
    counts: dict[str, dict[str, int]], runs: dict[str, tuple[float | None, float | None]]
) -> list[TypeStats]:
    """Per-type stats from counts by (type, status) and (p50, p95) run times by type."""
    out = []
    for name in sorted(counts):
        by_status = {str(status): counts[name].get(status, 0) for status in Status}
        finished = by_status[Status.DONE] + by_status[Status.FAILED]
        rate = by_status[Status.FAILED] / finished if finished else None
        p50, p95 = runs.get(name, (None, None))
        out.append(TypeStats(name, by_status, p50, p95, rate))
    return out


def percentile(ordered: list[float], q: float) -> float | None:
    """The `q` quantile of `ordered` (ascending), interpolated between the two nearest
    values as PostgreSQL's percentile_cont is, so both stores answer alike."""
    if not ordered:
        return None
    at = q * (len(ordered) - 1)
    low = int(at)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)


def job_brief(job: Job, limit: int) -> JobBrief:
    """A job as a list row, its payload, result and error cut to `limit` characters."""
    return JobBrief(
        id=job.id,
        type=job.type,
        queue=job.queue,
        priority=job.priority,
        status=job.status,
        attempts=job.attempts,
        max_retries=job.max_retries,
        run_at=job.run_at,
        created_at=job.created_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        updated_at=job.updated_at,
        parent_id=job.parent_id,
        payload=preview(job.payload, limit),
        result=None if job.result is None else preview(job.result, limit),
        last_error=text_preview(job.last_error, limit),
    )


def dead_brief(dead: DeadLetter, limit: int) -> DeadBrief:
    """A dead letter as a list row, its payload and error cut to `limit` characters."""
    job = dead.job
    return DeadBrief(
        id=dead.id,
        job_id=dead.job_id,
        type=job.type,
        queue=job.queue,
        priority=job.priority,
        attempts=job.attempts,
        max_retries=job.max_retries,
        created_at=dead.created_at,
        payload=preview(job.payload, limit),
        last_error=text_preview(job.last_error, limit),
    )
