"""The node's HTTP server: the aiohttp runner over the app, listening through the app's
connection guard (header deadline, connection cap)."""

from __future__ import annotations

import asyncio
import logging
import resource
from collections.abc import Callable

from aiohttp import web
from goqueue.api.http.connections import handler_settings
from goqueue.api.http.state import CONNECTIONS, EXPOSURE
from goqueue.supervisor.settings.config import Settings

log = logging.getLogger("goqueue.node")


class HttpServer:
    """The aiohttp runner over an app made when the node starts serving, listening through
    the app's connection guard (header deadline, connection cap)."""

    def __init__(self, settings: Settings, make_app: Callable[[], web.Application]) -> None:
        self.settings = settings
        self.make_app = make_app
        self.runner: web.AppRunner | None = None
        self.listener: asyncio.Server | None = None

    async def start(self) -> None:
        """Serve the API."""
        settings = self.settings
        app = self.make_app()
        # handler_cancellation off: a write in flight finishes even if its client leaves
        self.runner = web.AppRunner(app, handle_signals=False, handler_cancellation=False)
        await self.runner.setup()
        server = self.runner.server
        assert server is not None
        guard = app[CONNECTIONS]
        protocol = guard.factory(server, handler_settings(settings.keepalive_timeout))
        self.listener = await asyncio.get_running_loop().create_server(
            protocol, settings.host, settings.port, backlog=1024
        )
        log.info(
            "listening",
            extra={
                "host": settings.host,
                "port": settings.port,
                "max_connections": guard.max_connections,
                "open_files": resource.getrlimit(resource.RLIMIT_NOFILE)[0],
            },
        )
        exposure = app[EXPOSURE]
        if exposure.open:
            log.warning("THE API IS OPEN: %s", exposure.warning(), extra={"host": settings.host})

    @property
    def port(self) -> int | None:
        """The port listened on (the chosen one when `--port 0`)."""
        if self.listener is None or not self.listener.sockets:
            return None
        return int(self.listener.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        """Close the listener and finish in-flight requests."""
        if self.listener is not None:
            self.listener.close()
        if self.runner is not None:
            await self.runner.cleanup()
