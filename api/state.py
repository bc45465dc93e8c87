"""Typed application state (aiohttp's `AppKey`): what a handler may reach, and nothing else."""

from __future__ import annotations

from aiohttp import web
from goqueue.api.budget import QueueBudget
from goqueue.api.connections import ConnectionGuard
from goqueue.api.exposure import Exposure
from goqueue.api.gauges import GaugeRefresh
from goqueue.supervisor.config import Settings
from goqueue.supervisor.egress import EgressPolicy
from goqueue.supervisor.engine import Engine

ENGINE = web.AppKey("engine", Engine)
SETTINGS = web.AppKey("settings", Settings)
OPENAPI = web.AppKey("openapi", bytes)
EGRESS = web.AppKey("egress", EgressPolicy)  # where webhooks may go, checked at enqueue
BUDGET = web.AppKey("queue_budget", QueueBudget)
EXPOSURE = web.AppKey("exposure", Exposure)
GAUGES = web.AppKey("gauges", GaugeRefresh)
CONNECTIONS = web.AppKey("connections", ConnectionGuard)
