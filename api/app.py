"""The aiohttp application factory: one app per engine, no module-level state."""

from __future__ import annotations

from aiohttp import web
from goqueue.api import deliveries, dlq, jobs, openapi, ops, queues, summary, ui
from goqueue.api.middleware import auth_middleware, errors_middleware, metrics_middleware
from goqueue.api.schemas import encode
from goqueue.api.state import EGRESS, ENGINE, OPENAPI, SETTINGS
from goqueue.supervisor.config import Settings
from goqueue.supervisor.egress import EgressPolicy
from goqueue.supervisor.engine import Engine

__all__ = ["ENGINE", "SETTINGS", "create_app"]

ROUTE_TABLES = (
    jobs.routes,
    deliveries.routes,
    dlq.routes,
    queues.routes,
    ops.routes,
    summary.routes,
    ui.routes,
)


def create_app(engine: Engine, settings: Settings) -> web.Application:
    """The HTTP API of one node, talking only to `engine`."""
    app = web.Application(
        client_max_size=settings.max_body_bytes,
        middlewares=[
            metrics_middleware(engine.metrics),
            errors_middleware(settings.max_body_bytes),
            # no key configured, no middleware: each one is a layer on every request
            *(
                [auth_middleware(settings.api_key, settings.read_api_key)]
                if settings.api_key
                else []
            ),
        ],
    )
    app[ENGINE] = engine
    app[SETTINGS] = settings
    app[EGRESS] = EgressPolicy.of(settings.webhook_allow_hosts, settings.webhook_allow_networks)
    app[ui.ASSETS] = ui.load_assets()
    for table in ROUTE_TABLES:
        app.router.add_routes(table)
    app[OPENAPI] = encode(openapi.build(app, settings))
    return app
