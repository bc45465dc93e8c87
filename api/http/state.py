"""Typed application state (aiohttp's `AppKey`): what a handler may reach, and nothing else."""

from __future__ import annotations

from aiohttp import web
from goqueue.api.http.connections import ConnectionGuard
from goqueue.api.http.exposure import Exposure
from goqueue.api.http.openapi import Document
from goqueue.api.http.scrape_gauges import GaugeRefresh
from goqueue.supervisor.engine import Engine
from goqueue.supervisor.settings.config import Settings
from goqueue.supervisor.store.base import Store
from goqueue.supervisor.webhooks.egress import EgressPolicy

ENGINE = web.AppKey("engine", Engine)
STORE = web.AppKey("store", Store)  # reads go straight to it; writes go through the engine
SETTINGS = web.AppKey("settings", Settings)
OPENAPI = web.AppKey("openapi", Document)
EGRESS = web.AppKey("egress", EgressPolicy)  # where webhooks may go, checked at enqueue
EXPOSURE = web.AppKey("exposure", Exposure)
GAUGES = web.AppKey("gauges", GaugeRefresh)
CONNECTIONS = web.AppKey("connections", ConnectionGuard)
