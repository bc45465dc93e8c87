"""Queue routes: node-wide stats, one queue's stats, pause and resume."""

from __future__ import annotations

from aiohttp import web
from goqueue.api.http.openapi import operation
from goqueue.api.http.params import queue_name
from goqueue.api.http.replies import StatsOut, reply, within
from goqueue.api.http.state import ENGINE, STORE
from goqueue.supervisor.common.reads import QueueStats

routes = web.RouteTableDef()


@routes.get("/stats")
@operation(responses={200: StatsOut}, errors=(503,))
async def stats(request: web.Request) -> web.Response:
    """Counts by status, pending depth by queue and priority, dead letters, workers."""
    counts, workers = await within(request.app[ENGINE].stats())
    return reply(StatsOut(counts.counts, counts.queues, counts.dead_letters, workers))


@routes.get("/queues/{name}/stats")
@operation(responses={200: QueueStats}, errors=(503,))
async def queue_stats(request: web.Request) -> web.Response:
    """One queue's counts by status and pending depth by priority."""
    name = queue_name(request)
    return reply(await within(request.app[STORE].queue_stats(name)))


@routes.post("/queues/{name}/pause")
@operation(responses={200: QueueStats}, errors=(429, 503, 504))
async def pause(request: web.Request) -> web.Response:
    """Stop dispatching from a queue (on every node sharing the store)."""
    name = queue_name(request)
    return reply(await within(request.app[ENGINE].set_paused(name, True), writes=True))


@routes.post("/queues/{name}/resume")
@operation(responses={200: QueueStats}, errors=(503, 504))
async def resume(request: web.Request) -> web.Response:
    """Dispatch from a paused queue again."""
    name = queue_name(request)
    return reply(await within(request.app[ENGINE].set_paused(name, False), writes=True))
