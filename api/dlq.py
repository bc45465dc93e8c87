"""Dead-letter routes: list, show, replay, purge."""

from __future__ import annotations

from aiohttp import web
from goqueue.api.errors import ApiError, within
from goqueue.api.openapi import operation
from goqueue.api.params import LIMIT, OFFSET, PAGE, path_id
from goqueue.api.schemas import (
    DeadLetterList,
    DeadLetterOut,
    JobOut,
    Purged,
    dead_out,
    job_out,
    reply,
)
from goqueue.api.state import BUDGET, ENGINE
from goqueue.supervisor.errors import Draining

routes = web.RouteTableDef()


@routes.get("/dlq")
@operation(responses={200: DeadLetterList}, query_params=PAGE)
async def list_dead(request: web.Request) -> web.Response:
    """List dead letters, newest first."""
    limit, offset = LIMIT.parse(request.query), OFFSET.parse(request.query)
    page = await within(request.app[ENGINE].list_dead(limit, offset))
    letters = [dead_out(dead) for dead in page.items]
    return reply(DeadLetterList(letters, page.total, limit, offset))


@routes.get("/dlq/{id}")
@operation(responses={200: DeadLetterOut}, errors=(404, 503))
async def get_dead(request: web.Request) -> web.Response:
    """Show one dead letter with every attempt's error."""
    dead_id = path_id(request, "dead letter")
    dead = await within(request.app[ENGINE].get_dead(dead_id))
    if dead is None:
        raise ApiError(404, f"dead letter {dead_id} not found")
    return reply(dead_out(dead))


@routes.post("/dlq/{id}/replay")
@operation(responses={201: JobOut}, errors=(404, 429, 503))
async def replay_dead(request: web.Request) -> web.Response:
    """Enqueue a fresh job from a dead letter; the letter goes once the job is stored."""
    dead_id = path_id(request, "dead letter")
    engine = request.app[ENGINE]
    if engine.draining:  # a replay adds work, like POST /jobs
        raise Draining("the node is shutting down and accepts no new jobs")
    dead = await within(engine.get_dead(dead_id))
    if dead is None:
        raise ApiError(404, f"dead letter {dead_id} not found")
    await request.app[BUDGET].admit_spec(dead.job.replay_spec(), "job.")
    job = await within(engine.replay(dead_id))
    return reply(job_out(job), 201, {"Location": f"/jobs/{job.id}"})


@routes.delete("/dlq/{id}")
@operation(responses={200: Purged}, errors=(404, 503))
async def purge_dead(request: web.Request) -> web.Response:
    """Delete a dead letter."""
    dead_id = path_id(request, "dead letter")
    if not await within(request.app[ENGINE].purge_dead(dead_id)):
        raise ApiError(404, f"dead letter {dead_id} not found")
    return reply(Purged(dead_id))
