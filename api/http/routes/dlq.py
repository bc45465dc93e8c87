"""Dead-letter routes: list, show (by the letter's id or its job's), replay, purge, and
the same two actions in bulk over the letters a filter selects."""

from __future__ import annotations

from aiohttp import web
from goqueue.api.http.openapi import operation
from goqueue.api.http.params import (
    AFTER,
    BEFORE,
    ERROR,
    LIMIT,
    OFFSET,
    PAGE,
    QUEUE,
    TYPE,
    BoolParam,
    IntParam,
    path_id,
)
from goqueue.api.http.replies import (
    ApiError,
    BulkPurged,
    BulkReplayed,
    DeadLetterList,
    DeadLetterOut,
    JobOut,
    Purged,
    bad_request,
    dead_out,
    job_out,
    reply,
    within,
)
from goqueue.api.http.state import ENGINE, STORE
from goqueue.supervisor.common.errors import Draining
from goqueue.supervisor.common.jobs import DeadLetter
from goqueue.supervisor.common.summaries import DeadFilter

routes = web.RouteTableDef()

DEFAULT_BULK = 100
MAX_BULK = 1000
BULK_LIMIT = IntParam(
    "limit",
    DEFAULT_BULK,
    1,
    MAX_BULK,
    "at most this many dead letters, the oldest first; `remaining` in the answer says "
    "how many matching are left",
)
ALL = BoolParam("all", "true: act on every dead letter (required when no filter is given)")
FILTERS = (TYPE, QUEUE, ERROR, BEFORE, AFTER)
BULK_FILTERS = (*FILTERS, ALL, BULK_LIMIT)


def dead_filter(request: web.Request) -> DeadFilter:
    """The dead-letter filters of the query string (all optional)."""
    query = request.query
    return DeadFilter(
        type=TYPE.parse(query),
        queue=QUEUE.parse(query),
        error=ERROR.parse(query),
        before=BEFORE.parse(query),
        after=AFTER.parse(query),
    )


def bulk_filter(request: web.Request) -> DeadFilter:
    """The filters of a bulk action; 400 when there are none and `all` is not true (an
    empty query string must never empty the dead-letter queue)."""
    query = request.query
    filters = dead_filter(request)
    if filters.empty and not ALL.parse(query):
        raise bad_request(
            "give a filter (type, queue, error, before, after) or all=true to act on "
            "every dead letter",
            parameter="all",
        )
    return filters


async def find_dead(request: web.Request) -> DeadLetter:
    """The dead letter `{id}` names, by its own id or its job's; 404 naming both."""
    some_id = path_id(request, "dead letter or job")
    dead = await within(request.app[STORE].get_dead(some_id))
    if dead is None:
        raise not_found(some_id)
    return dead


def not_found(some_id: str) -> ApiError:
    """The 404 of an id that names no dead letter, as its own id or its job's."""
    return ApiError(
        404,
        f"dead letter {some_id} not found: it is neither a dead letter's id nor the id of a "
        "job in the dead-letter queue",
        {"id": some_id},
    )


@routes.get("/dlq")
@operation(responses={200: DeadLetterList}, query_params=(*FILTERS, *PAGE))
async def list_dead(request: web.Request) -> web.Response:
    """List dead letters, newest first; filtered, the ones a bulk action would take."""
    limit, offset = LIMIT.parse(request.query), OFFSET.parse(request.query)
    page = await within(request.app[STORE].list_dead(limit, offset, dead_filter(request)))
    letters = [dead_out(dead) for dead in page.items]
    return reply(DeadLetterList(letters, page.total, limit, offset))


@routes.post("/dlq/replay")
@operation(responses={200: BulkReplayed}, errors=(429, 503, 504), query_params=BULK_FILTERS)
async def replay_matching(request: web.Request) -> web.Response:
    """Replay the dead letters a filter selects (the oldest `limit`), each as a fresh job."""
    filters = bulk_filter(request)
    limit = BULK_LIMIT.parse(request.query)
    engine = request.app[ENGINE]
    if engine.draining:  # a replay adds work, like POST /jobs
        raise Draining("the node is shutting down and accepts no new jobs")
    replayed = await within(engine.replay_many(filters, limit), writes=True)
    return reply(BulkReplayed(len(replayed.jobs), replayed.remaining))


@routes.delete("/dlq")
@operation(responses={200: BulkPurged}, errors=(503, 504), query_params=BULK_FILTERS)
async def purge_matching(request: web.Request) -> web.Response:
    """Delete the dead letters a filter selects (the oldest `limit`)."""
    filters = bulk_filter(request)
    limit = BULK_LIMIT.parse(request.query)
    purged = await within(request.app[ENGINE].purge_many(filters, limit), writes=True)
    return reply(BulkPurged(purged.purged, purged.remaining))


@routes.get("/dlq/{id}")
@operation(responses={200: DeadLetterOut}, errors=(404, 503))
async def get_dead(request: web.Request) -> web.Response:
    """Show one dead letter, by its own id or its job's, with every attempt's error."""
    dead = await find_dead(request)
    return reply(dead_out(dead))


@routes.post("/dlq/{id}/replay")
@operation(responses={201: JobOut}, errors=(404, 429, 503, 504))
async def replay_dead(request: web.Request) -> web.Response:
    """Enqueue a fresh job from a dead letter (by its id or its job's); the letter goes
    once the job is stored."""
    engine = request.app[ENGINE]
    if engine.draining:  # a replay adds work, like POST /jobs
        raise Draining("the node is shutting down and accepts no new jobs")
    dead = await find_dead(request)
    job = await within(engine.replay(dead.id), writes=True)
    return reply(job_out(job), 201, {"Location": f"/jobs/{job.id}"})


@routes.delete("/dlq/{id}")
@operation(responses={200: Purged}, errors=(404, 503, 504))
async def purge_dead(request: web.Request) -> web.Response:
    """Delete a dead letter (by its id or its job's)."""
    dead = await find_dead(request)
    if not await within(request.app[ENGINE].purge_dead(dead.id), writes=True):
        raise not_found(dead.id)
    return reply(Purged(dead.id))
