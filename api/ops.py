"""Operational routes: liveness, readiness, Prometheus metrics, the OpenAPI document."""

from __future__ import annotations

from aiohttp import web
from goqueue.api.errors import within
from goqueue.api.openapi import Text, operation
from goqueue.api.schemas import JSON, Health, Ready, reply
from goqueue.api.state import ENGINE, OPENAPI
from goqueue.supervisor.errors import StoreUnavailable

routes = web.RouteTableDef()

READY_TIMEOUT = 5.0  # well inside a probe's usual timeout
PROMETHEUS_TEXT = "text/plain; version=0.0.4"


@routes.get("/health")
@operation(responses={200: Health}, strict_query=False)
async def health(request: web.Request) -> web.Response:
    """Liveness: 200 while the process answers, whatever the store does."""
    return reply(Health())


@routes.get("/ready")
@operation(responses={200: Ready, 503: Ready}, strict_query=False)
async def ready(request: web.Request) -> web.Response:
    """Readiness: store reachable, a worker up, not draining; 503 otherwise."""
    try:
        checks = await within(request.app[ENGINE].readiness(), READY_TIMEOUT)
    except StoreUnavailable:
        checks = {"store": False}
    failed = sorted(name for name, ok in checks.items() if not ok)
    if not failed:
        return reply(Ready("ready", checks))
    return reply(Ready("not_ready", checks, f"not ready: {', '.join(failed)}"), 503)


@routes.get("/metrics")
@operation(responses={200: Text(PROMETHEUS_TEXT)}, strict_query=False)
async def metrics(request: web.Request) -> web.Response:
    """Prometheus metrics, text exposition format."""
    engine = request.app[ENGINE]
    await engine.refresh_gauges()
    body, content_type = engine.metrics.render()
    return web.Response(body=body, headers={"Content-Type": content_type})


@routes.get("/openapi.json")
@operation(responses={200: None}, strict_query=False)
async def openapi(request: web.Request) -> web.Response:
    """This API described in OpenAPI 3.1."""
    return web.Response(body=request.app[OPENAPI], content_type=JSON)
