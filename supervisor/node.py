"""What one node is made of. `goqueue.api.cli.serve.build_node` builds it, once and whole;
the arbiter only runs its lifecycle."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from goqueue.supervisor.dispatch.dispatcher import Dispatcher
from goqueue.supervisor.dispatch.hooks import Hooks
from goqueue.supervisor.dispatch.leases import Leases
from goqueue.supervisor.engine import Engine
from goqueue.supervisor.observe.history import History
from goqueue.supervisor.observe.metrics import Metrics
from goqueue.supervisor.schedules.scheduler import Scheduler
from goqueue.supervisor.settings.config import Settings
from goqueue.supervisor.store.base import Store
from goqueue.supervisor.webhooks.delivery import Webhooks
from goqueue.supervisor.workers.pool import Pool


class Server(Protocol):
    """The node's HTTP server, started once the node runs and stopped last."""

    async def start(self) -> None:
        """Start serving."""

    async def stop(self) -> None:
        """Close the listener and finish in-flight requests."""


@dataclass(frozen=True, slots=True)
class Node:
    """The parts of one node, wired: pool → dispatcher → store → hooks."""

    settings: Settings
    store: Store
    pool: Pool
    dispatcher: Dispatcher
    engine: Engine
    hooks: Hooks
    history: History  # the recent past the dashboard shows (also one of the hooks)
    metrics: Metrics
    webhooks: Webhooks  # the outbox on PostgreSQL, in process in memory
    leases: Leases
    scheduler: Scheduler  # periodic jobs
    http: Server
    reload_settings: Callable[[], Settings]  # re-read the configuration (SIGHUP)
