"""Operational routes: liveness, readiness, Prometheus metrics, the OpenAPI document."""

from __future__ import annotations

from aiohttp import web
from goqueue.api.http.openapi import Text, operation
from goqueue.api.http.replies import JSON, Health, Ready, reply, within
from goqueue.api.http.state import ENGINE, EXPOSURE, GAUGES, OPENAPI
from goqueue.supervisor.common.errors import StoreUnavailable
from msgspec import UNSET

routes = web.RouteTableDef()

READY_TIMEOUT = 5.0  # well inside a probe's usual timeout
PROMETHEUS_TEXT = "text/plain; version=0.0.4"
AUTH_CHECK = "auth"  # informational: never fails readiness
SCRAPE_WAIT = 0.05  # seconds a scrape waits for fresh queue depths before answering


@routes.get("/health")
@operation(responses={200: Health}, strict_query=False)
async def health(request: web.Request) -> web.Response:
    """Liveness: 200 while the process answers, whatever the store does."""
    return reply(Health())


@routes.get("/ready")
@operation(responses={200: Ready, 503: Ready}, strict_query=False)
async def ready(request: web.Request) -> web.Response:
    """Readiness: store reachable, a worker up, not draining; 503 otherwise. `checks.auth`
    is false when the API listens beyond loopback with no key: a warning, not a failure."""
    try:
        checks = await within(request.app[ENGINE].readiness(), READY_TIMEOUT)
    except StoreUnavailable:
        checks = {"store": False}
    failed = sorted(name for name, ok in checks.items() if not ok)
    exposure = request.app[EXPOSURE]
    checks[AUTH_CHECK] = not exposure.open
    said = [exposure.warning()] if exposure.open else []
    said += [w for w in [request.app[ENGINE].store_warning()] if w is not None]
    warnings = said or UNSET
    if not failed:
        return reply(Ready("ready", checks, warnings=warnings))
    return reply(Ready("not_ready", checks, f"not ready: {', '.join(failed)}", warnings), 503)


@routes.get("/metrics")
@operation(responses={200: Text(PROMETHEUS_TEXT)}, strict_query=False)
async def metrics(request: web.Request) -> web.Response:
    """Prometheus metrics, text exposition format."""
    await request.app[GAUGES].fresh(SCRAPE_WAIT)
    body, content_type = request.app[ENGINE].metrics.render()
    return web.Response(body=body, headers={"Content-Type": content_type})


@routes.get("/openapi.json")
@operation(responses={200: None}, strict_query=False)
async def openapi(request: web.Request) -> web.Response:
    """This API described in OpenAPI 3.1."""
    actors = request.app[ENGINE].catalog.actors
    return web.Response(body=request.app[OPENAPI].render(actors), content_type=JSON)
