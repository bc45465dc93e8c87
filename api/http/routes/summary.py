"""Summary routes: compact answers for operators' tools (the dashboard polls these).

`GET /stats/history` (this node's last hour and the store's counts), `GET /queues`,
`GET /workers`, and list rows with payloads cut to a preview (`GET /summary/jobs`,
`GET /summary/dlq`). Store reads behind them are shared between callers for a second or
two, so ten open dashboards cost the store what one does.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgspec
from aiohttp import web
from goqueue.api.http.openapi import operation
from goqueue.api.http.params import (
    AFTER,
    BEFORE,
    CONCURRENCY_KEY,
    ERROR,
    LIMIT,
    OFFSET,
    QUEUE,
    STATUS,
    TYPE,
    IntParam,
)
from goqueue.api.http.replies import bad_request, reply, within
from goqueue.api.http.state import ENGINE, STORE
from goqueue.supervisor.common.enums import Status
from goqueue.supervisor.common.errors import StoreUnavailable
from goqueue.supervisor.common.flow import TypeKeys, type_keys
from goqueue.supervisor.common.reads import JobFilter
from goqueue.supervisor.common.summaries import (
    DEFAULT_PREVIEW,
    MAX_PREVIEW,
    DeadBrief,
    DeadFilter,
    JobBrief,
    LiveStats,
    NodeSummary,
    QueueSummary,
    TypeStats,
    WorkerSummary,
)
from goqueue.supervisor.observe.history import BUCKET_SECONDS, Window, WorkerCount, WorkerExit
from msgspec import UNSET, UnsetType

routes = web.RouteTableDef()

MAX_SINCE = 10**12 - 1
_UUID = re.compile(r"[0-9a-fA-F]{8}-(?:[0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}")


@dataclass(frozen=True, slots=True)
class UuidParam:
    """A UUID (answered lower-case), or absent."""

    name: str
    description: str

    def parse(self, query: Mapping[str, str]) -> str | None:
        """The value, or None when absent."""
        raw = query.get(self.name)
        if raw is not None and not _UUID.fullmatch(raw):
            raise bad_request(f"{self.name} must be a UUID, got {raw[:50]!r}", parameter=self.name)
        return raw.lower() if raw is not None else None

    def schema(self) -> dict[str, Any]:
        """Its JSON Schema, for OpenAPI."""
        return {"type": "string", "format": "uuid"}


SINCE = IntParam(
    "since", 0, 0, MAX_SINCE, "only buckets starting at or after this time (unix seconds)"
)
PREVIEW = IntParam(
    "preview",
    DEFAULT_PREVIEW,
    1,
    MAX_PREVIEW,
    "characters kept of each payload, result and error (the rest is cut)",
)
JOB_ID = UuidParam("job_id", "only the dead letter of this job")
PARENT_ID = UuidParam("parent_id", "only jobs this job enqueued (its chain, ctx.enqueue)")


class HistoryOut(msgspec.Struct):
    """This node's recent throughput and the store's counts, for a live chart.

    `series` holds 5 s buckets over the last hour (those from `since` on): `done` and
    `failed` count this node's outcomes (failed = attempts that failed, retried or
    dead-lettered); `depth` is the store's pending count, noted when it was read (by
    this route or a metrics scrape; null in a bucket where nobody read it). `latest` is
    at most 2 s old and shared by every caller; it is null, with `store_error` set, while
    the store does not answer. `workers` are this node's, by state."""

    node: str
    bucket_seconds: int
    now: float
    series: Window
    latest: LiveStats | None
    workers: dict[str, int]
    store_error: str | UnsetType = UNSET


class QueueList(msgspec.Struct):
    """Every queue with pending or running jobs, and every paused queue, by name."""

    queues: list[QueueSummary]


class WorkersOut(msgspec.Struct):
    """This node's worker processes, their exits since it started (by reason, and the
    last 50), and the nodes sharing the store with their last heartbeat."""

    node: str
    workers: list[WorkerSummary]
    exits_by_reason: dict[str, int]
    recent_exits: list[WorkerExit]
    nodes: list[NodeSummary]
    count: WorkerCount | None = None  # the count aimed for, between --workers MIN:MAX


class JobBriefList(msgspec.Struct):
    """One page of jobs as list rows, newest first."""

    jobs: list[JobBrief]
    total: int
    limit: int
    offset: int


class TypeStatsList(msgspec.Struct):
    """Every job type among the jobs kept, by name: counts by status, the p50 and p95 run
    time of finished jobs' last attempts (seconds), and failed / (done + failed)."""

    types: list[TypeStats]


class TypeKeysList(msgspec.Struct):
    """Every type with a per-key limit (`key_concurrency`) on this node, by name: how many
    of its keys are at their limit, the due jobs waiting on them, and the keys with the
    most waiting."""

    types: list[TypeKeys]


class DeadBriefList(msgspec.Struct):
    """One page of dead letters as list rows, newest first."""

    dead_letters: list[DeadBrief]
    total: int
    limit: int
    offset: int


@routes.get("/stats/history")
@operation(responses={200: HistoryOut}, query_params=(SINCE,))
async def history(request: web.Request) -> web.Response:
    """This node's last hour in 5 s buckets, and the store's counts (at most 2 s old)."""
    since = SINCE.parse(request.query)
    engine = request.app[ENGINE]
    out = HistoryOut(
        node=engine.store.node_id,
        bucket_seconds=BUCKET_SECONDS,
        now=engine.history.clock(),
        series=Window([], [], [], []),
        latest=None,
        workers=engine.workers(),
    )
    try:
        out.latest = await within(engine.live_stats())
    except StoreUnavailable:  # the node's own numbers are still worth answering
        out.store_error = "the store is unavailable"
    out.series = engine.history.window(since)  # after the read: it may note the depth
    return reply(out)


@routes.get("/queues")
@operation(responses={200: QueueList}, errors=(503,))
async def queues(request: web.Request) -> web.Response:
    """Every queue with work, or paused: depth by priority, the longest wait, paused."""
    return reply(QueueList(await within(request.app[ENGINE].queue_summaries())))


@routes.get("/workers")
@operation(responses={200: WorkersOut}, errors=(503,))
async def workers(request: web.Request) -> web.Response:
    """This node's workers and their recent exits, and the live nodes of the store."""
    engine = request.app[ENGINE]
    nodes = await within(request.app[STORE].nodes())
    history = engine.history
    return reply(
        WorkersOut(
            engine.store.node_id,
            engine.worker_summaries(),
            history.exit_counts(),
            history.exits(),
            nodes,
            history.worker_count(),
        )
    )


@routes.get("/summary/jobs")
@operation(
    responses={200: JobBriefList},
    errors=(503,),
    query_params=(TYPE, STATUS, QUEUE, PARENT_ID, CONCURRENCY_KEY, LIMIT, OFFSET, PREVIEW),
)
async def job_briefs(request: web.Request) -> web.Response:
    """List jobs newest first, as rows with payload, result and error cut to a preview."""
    query = request.query
    filters = JobFilter(
        type=TYPE.parse(query),
        status=STATUS.parse(query),
        queue=QUEUE.parse(query),
        parent_id=PARENT_ID.parse(query),
        concurrency_key=CONCURRENCY_KEY.parse(query),
    )
    limit, offset, cut = LIMIT.parse(query), OFFSET.parse(query), PREVIEW.parse(query)
    engine = request.app[ENGINE]
    page = await within(request.app[STORE].job_briefs(filters, limit, offset, cut))
    briefs = [_with_progress(brief, engine.progress(brief.id)) for brief in page.items]
    return reply(JobBriefList(briefs, page.total, limit, offset))


def _with_progress(brief: JobBrief, progress: msgspec.Raw | None) -> JobBrief:
    """A running row with the progress this node knows of (a copy: rows are shared
    between callers for a second or two)."""
    if brief.status != Status.RUNNING or progress is None:
        return brief
    return msgspec.structs.replace(brief, progress=progress)


@routes.get("/summary/types")
@operation(responses={200: TypeStatsList}, errors=(503,))
async def type_stats(request: web.Request) -> web.Response:
    """Per job type: counts by status, p50/p95 run time and failure rate."""
    return reply(TypeStatsList(await within(request.app[STORE].type_stats())))


@routes.get("/summary/keys")
@operation(responses={200: TypeKeysList}, errors=(503,))
async def key_holds(request: web.Request) -> web.Response:
    """Per job type with a per-key limit: the keys at their limit and the jobs waiting on
    them (flow control by key)."""
    limits = request.app[ENGINE].catalog.key_limits
    holds = await within(request.app[STORE].key_holds(limits))
    return reply(TypeKeysList(type_keys(limits, holds)))


@routes.get("/summary/dlq")
@operation(
    responses={200: DeadBriefList},
    errors=(503,),
    query_params=(TYPE, QUEUE, ERROR, JOB_ID, BEFORE, AFTER, LIMIT, OFFSET, PREVIEW),
)
async def dead_briefs(request: web.Request) -> web.Response:
    """List dead letters newest first, filtered, as rows with previews."""
    query = request.query
    filters = DeadFilter(
        type=TYPE.parse(query),
        queue=QUEUE.parse(query),
        error=ERROR.parse(query),
        job_id=JOB_ID.parse(query),
        before=BEFORE.parse(query),
        after=AFTER.parse(query),
    )
    limit, offset, cut = LIMIT.parse(query), OFFSET.parse(query), PREVIEW.parse(query)
    page = await within(request.app[STORE].dead_briefs(filters, limit, offset, cut))
    return reply(DeadBriefList(page.items, page.total, limit, offset))
