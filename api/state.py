"""Typed application state (aiohttp's `AppKey`): what a handler may reach, and nothing else."""

from __future__ import annotations

from aiohttp import web
from goqueue.supervisor.config import Settings
from goqueue.supervisor.egress import EgressPolicy
from goqueue.supervisor.engine import Engine

ENGINE = web.AppKey("engine", Engine)
SETTINGS = web.AppKey("settings", Settings)
OPENAPI = web.AppKey("openapi", bytes)
EGRESS = web.AppKey("egress", EgressPolicy)  # where webhooks may go, checked at enqueue
