"""The aiohttp application factory: one app per engine, no module-level state."""

from __future__ import annotations

from aiohttp import web
from goqueue.api.http import openapi, ui
from goqueue.api.http.connections import ConnectionGuard, connection_cap
from goqueue.api.http.exposure import Exposure
from goqueue.api.http.middleware import front_middleware
from goqueue.api.http.routes import (
    deliveries,
    dlq,
    jobs,
    ops,
    queues,
    schedules,
    summary,
    workflows,
)
from goqueue.api.http.scrape_gauges import GaugeRefresh
from goqueue.api.http.state import (
    CONNECTIONS,
    EGRESS,
    ENGINE,
    EXPOSURE,
    GAUGES,
    OPENAPI,
    SETTINGS,
    STORE,
)
from goqueue.supervisor.engine import Engine
from goqueue.supervisor.settings.config import Settings
from goqueue.supervisor.webhooks.egress import EgressPolicy

__all__ = ["ENGINE", "SETTINGS", "create_app"]

ROUTE_TABLES = (
    jobs.routes,
    workflows.routes,
    deliveries.routes,
    dlq.routes,
    queues.routes,
    ops.routes,
    schedules.routes,
    summary.routes,
    ui.routes,
)


def create_app(engine: Engine, settings: Settings) -> web.Application:
    """The HTTP API of one node, talking only to `engine`. Its connection guard is in
    `app[CONNECTIONS]`; `HttpServer` listens through it."""
    cap = connection_cap(settings.max_connections, settings.worker_bounds[1])
    guard = ConnectionGuard(cap, settings.header_timeout, engine.metrics)
    app = web.Application(
        client_max_size=settings.max_body_bytes,
        # one layer around every handler: guard, key, query check, errors, metrics
        middlewares=[
            front_middleware(
                engine.metrics,
                settings.max_body_bytes,
                guard,
                settings.api_key,
                settings.public_reads,
            ),
            # --otel: an incoming `traceparent` is the parent of the enqueue's span
            *([engine.tracing.middleware()] if engine.tracing is not None else []),
        ],
    )
    app[ENGINE] = engine
    app[STORE] = engine.store
    app[SETTINGS] = settings
    app[EGRESS] = EgressPolicy.of(settings.webhook_allow_hosts, settings.webhook_allow_networks)
    app[CONNECTIONS] = guard
    app[EXPOSURE] = exposure = Exposure.of(settings)
    engine.metrics.set_open_api(exposure.open)
    app[GAUGES] = gauges = GaugeRefresh(engine.refresh_gauges)
    app.on_cleanup.append(lambda _app: gauges.close())
    app[ui.ASSETS] = ui.load_assets()
    for table in ROUTE_TABLES:
        app.router.add_routes(table)
    app[OPENAPI] = openapi.Document(openapi.describe(app, settings))
    return app
