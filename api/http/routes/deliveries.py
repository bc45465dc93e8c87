"""A job's webhook deliveries: each with every attempt, its status code and node."""

from __future__ import annotations

import msgspec
from aiohttp import web
from goqueue.api.http.openapi import operation
from goqueue.api.http.params import path_id
from goqueue.api.http.replies import ApiError, reply, within
from goqueue.api.http.state import ENGINE
from goqueue.supervisor.common.deliveries import Delivery

routes = web.RouteTableDef()


class DeliveryList(msgspec.Struct):
    """A job's webhook deliveries, oldest first (at least once on PostgreSQL, where any
    node's attempts show; best effort and this node's only in memory)."""

    deliveries: list[Delivery]


@routes.get("/jobs/{id}/deliveries")
@operation(responses={200: DeliveryList}, errors=(404, 503))
async def job_deliveries(request: web.Request) -> web.Response:
    """Show a job's webhook deliveries and every attempt at each."""
    job_id = path_id(request)
    found = await within(request.app[ENGINE].deliveries(job_id))
    if found is None:
        raise ApiError(404, f"job {job_id} not found")
    return reply(DeliveryList(found))
