"""`goqueue serve`: build a node with its HTTP server, then let the arbiter run it.

This is the only place that knows both the node and HTTP; the node's builder
(`goqueue.supervisor.node.build_node`) is given how to make the server over the engine.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Callable

import uvloop
from goqueue.api.http.app import create_app
from goqueue.api.http.connections import raise_open_files_limit
from goqueue.api.http.server import HttpServer
from goqueue.supervisor.arbiter import EXIT_BOOT_ERROR, Arbiter
from goqueue.supervisor.engine import Engine
from goqueue.supervisor.node import Node, build_node
from goqueue.supervisor.observe.tracing_requires import INSTALL, missing_packages
from goqueue.supervisor.settings import config
from goqueue.supervisor.settings.config import Settings

log = logging.getLogger("goqueue.node")


def build_served_node(settings: Settings, reload_settings: Callable[[], Settings]) -> Node:
    """A node as `goqueue serve` runs it: with the HTTP API over its engine."""

    def http(engine: Engine) -> HttpServer:
        return HttpServer(settings, lambda: create_app(engine, settings))

    return build_node(settings, reload_settings, http)


async def serve_async(settings: Settings, args: argparse.Namespace | None) -> int:
    """Run one node until it is stopped; returns the exit code."""

    def reload_settings() -> Settings:
        return config.reload(settings, args, os.environ)

    node = build_served_node(settings, reload_settings)
    code = await Arbiter(node).run()
    if node.engine.tracing is not None:
        node.engine.tracing.close()  # the last spans, within a bound
    return code


def serve(settings: Settings, args: argparse.Namespace | None) -> int:
    """Run a node on uvloop (chosen once, here), with as many open files as allowed (the
    workers inherit the raised limit)."""
    if settings.otel and (missing := missing_packages()):
        log.error(f"cannot start: --otel needs {', '.join(missing)}: {INSTALL}")
        return EXIT_BOOT_ERROR
    raise_open_files_limit()  # told in the `listening` line: a node refused says one line
    return uvloop.run(serve_async(settings, args))
