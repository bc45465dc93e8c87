"""Schedule routes: list the node's periodic jobs, enable and disable them."""

from __future__ import annotations

import re

from aiohttp import web
from goqueue.api.http.openapi import operation
from goqueue.api.http.replies import ApiError, bad_request, reply, within
from goqueue.api.http.state import ENGINE
from goqueue.api.wire import ScheduleList, ScheduleOut
from goqueue.supervisor.schedules.scheduler import ScheduleView

routes = web.RouteTableDef()

_NAME = re.compile(r"[A-Za-z0-9_.:\-]{1,200}")


def schedule_out(view: ScheduleView) -> ScheduleOut:
    """The API view of one schedule."""
    spec, state = view.spec, view.state
    return ScheduleOut(
        name=spec.name,
        type=spec.type,
        cron=spec.cron,
        every_seconds=spec.every_seconds,
        timezone=spec.timezone,
        payload=spec.payload,
        queue=spec.queue,
        priority=spec.priority,
        missed=spec.missed.value,
        source=view.source,  # type: ignore[arg-type]
        enabled=state.enabled,
        next_fire=view.next_fire,
        last_fire=state.last_fire,
        last_job_id=state.last_job_id,
    )


def _name(request: web.Request) -> str:
    raw = request.match_info["name"]
    if not _NAME.fullmatch(raw):
        raise bad_request(
            f"schedule name must be 1-200 characters of A-Z a-z 0-9 _ . : -, got {raw[:50]!r}",
            parameter="name",
        )
    return raw


@routes.get("/schedules")
@operation(responses={200: ScheduleList}, errors=(503,))
async def list_schedules(request: web.Request) -> web.Response:
    """This node's periodic jobs: next fire, last fire and its job, enabled or not."""
    views = await within(request.app[ENGINE].schedules.views())
    return reply(ScheduleList([schedule_out(view) for view in views]))


async def _switch(request: web.Request, enabled: bool) -> web.Response:
    name = _name(request)
    view = await within(request.app[ENGINE].schedules.set_enabled(name, enabled), writes=True)
    if view is None:
        raise ApiError(404, f"schedule {name} not found", {"parameter": "name"})
    return reply(schedule_out(view))


@routes.post("/schedules/{name}/enable")
@operation(responses={200: ScheduleOut}, errors=(404, 503, 504))
async def enable_schedule(request: web.Request) -> web.Response:
    """Enable a schedule: it fires from its next tick on (kept across restarts with
    PostgreSQL, for every node)."""
    return await _switch(request, True)


@routes.post("/schedules/{name}/disable")
@operation(responses={200: ScheduleOut}, errors=(404, 503, 504))
async def disable_schedule(request: web.Request) -> web.Response:
    """Disable a schedule: its ticks enqueue nothing until it is enabled again."""
    return await _switch(request, False)
