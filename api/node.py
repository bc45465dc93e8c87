"""`goqueue serve`: wire a store, the arbiter and the HTTP API into one running node.

This is the only place that knows both the engine and HTTP; the engine never imports
the API.
"""

from __future__ import annotations

import argparse
import logging
import os

import uvloop
from aiohttp import web
from goqueue.supervisor import config
from goqueue.supervisor.arbiter import Arbiter, Hooks
from goqueue.supervisor.config import Settings
from goqueue.supervisor.engine import Engine
from goqueue.supervisor.store.base import Store
from goqueue.supervisor.store.memory import MemoryStore

log = logging.getLogger("goqueue.node")


def make_store(settings: Settings) -> Store:
    """The in-memory store, or PostgreSQL when a database URL is configured."""
    node_id = settings.node_id or config.default_node_id()
    if settings.database_url:
        from goqueue.supervisor.store.postgres import PostgresStore

        return PostgresStore(
            settings.database_url,
            node_id,
            schema=settings.database_schema,
            lease_seconds=settings.lease_seconds,
            idempotency_ttl=settings.idempotency_ttl,
        )
    return MemoryStore(
        node_id,
        lease_seconds=settings.lease_seconds,
        max_pending=settings.max_pending,
        idempotency_ttl=settings.idempotency_ttl,
    )


class HttpServer:
    """The aiohttp runner, started once the engine exists and stopped last."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.runner: web.AppRunner | None = None

    async def start(self, engine: Engine) -> None:
        """Serve the API for `engine`."""
        from goqueue.api.app import create_app

        app = create_app(engine, self.settings)
        self.runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self.runner.setup()
        site = web.TCPSite(self.runner, self.settings.host, self.settings.port, backlog=1024)
        await site.start()
        log.info("listening", extra={"host": self.settings.host, "port": self.settings.port})

    async def stop(self) -> None:
        """Close the listener and finish in-flight requests."""
        if self.runner is not None:
            await self.runner.cleanup()


async def serve_async(settings: Settings, args: argparse.Namespace | None) -> int:
    """Run one node until it is stopped; returns the exit code."""
    http = HttpServer(settings)

    def reload_settings() -> Settings:
        return config.reload(settings, args, os.environ)

    store = make_store(settings)
    arbiter = Arbiter(settings, store, Hooks(http.start, http.stop, reload_settings))
    return await arbiter.run()


def serve(settings: Settings, args: argparse.Namespace | None) -> int:
    """Run a node on uvloop (chosen once, here)."""
    return uvloop.run(serve_async(settings, args))
