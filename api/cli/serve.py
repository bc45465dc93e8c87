"""`goqueue serve`: build a node (store, pool, dispatcher, engine, hooks, HTTP) in one place,
then let the arbiter run it.

This is the only place that knows both the engine and HTTP; the engine never imports
the API. The wiring reads top to bottom as the events flow: the pool reports attempts to
the dispatcher, which writes them to the store and then tells the hooks.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
from collections.abc import Callable

import uvloop
from aiohttp import web
from goqueue.api.http.connections import handler_settings, raise_open_files_limit
from goqueue.api.http.state import CONNECTIONS, EXPOSURE
from goqueue.supervisor.arbiter import EXIT_BOOT_ERROR, Arbiter
from goqueue.supervisor.dispatch.catalog import Catalog
from goqueue.supervisor.dispatch.dispatcher import Dispatcher
from goqueue.supervisor.dispatch.hooks import Hooks, LogHook, MetricsHook, WebhookHook
from goqueue.supervisor.dispatch.leases import Leases
from goqueue.supervisor.dispatch.policy import Policy
from goqueue.supervisor.dispatch.waiters import Waiters
from goqueue.supervisor.engine import Engine
from goqueue.supervisor.node import Node
from goqueue.supervisor.observe.history import History
from goqueue.supervisor.observe.metrics import Metrics
from goqueue.supervisor.observe.tracing_requires import INSTALL, missing_packages
from goqueue.supervisor.schedules.scheduler import Scheduler
from goqueue.supervisor.settings import config
from goqueue.supervisor.settings.config import Settings
from goqueue.supervisor.store.base import Store
from goqueue.supervisor.store.sqlite.choose import embedded_store
from goqueue.supervisor.store.sqlite.store import SqliteStore
from goqueue.supervisor.store.sqlite.url import is_postgres
from goqueue.supervisor.webhooks.delivery import Poster, Webhooks
from goqueue.supervisor.webhooks.egress import EgressPolicy
from goqueue.supervisor.webhooks.outbox import Outbox
from goqueue.supervisor.webhooks.sender import WebhookSender
from goqueue.supervisor.workers.pool import Pool, Recycle, WorkerConfig

log = logging.getLogger("goqueue.node")

WEBHOOK_CONCURRENCY = 8  # attempts in flight at once, per node

# How long a running job may go without word from its supervisor, as a share of the lease.
# Leases are renewed every third of their length, so a supervisor frozen just before a
# renewal leaves its leases two thirds to live: a worker must give up before that (and
# Extend comes every 0.5 s, well inside the rest).
ALLOWANCE_SHARE = 0.6


def make_store(settings: Settings) -> Store:
    """The SQLite file (the default), the in-memory store, or PostgreSQL, as
    `database_url` says."""
    node_id = settings.node_id or config.default_node_id()
    embedded = embedded_store(settings, node_id)
    if embedded is not None:
        return embedded
    if settings.database_url:
        from goqueue.supervisor.store.postgres.store import PostgresStore

        return PostgresStore(
            settings.database_url,
            node_id,
            schema=settings.database_schema,
            lease_seconds=settings.lease_seconds,
            idempotency_ttl=settings.idempotency_ttl,
        )
    raise AssertionError("embedded_store answers for every URL but PostgreSQL")


def make_webhooks(settings: Settings, metrics: Metrics, store: Store) -> Webhooks:
    """The node's webhooks, counting every delivery outcome: at least once from the
    outbox with PostgreSQL or SQLite, best effort in this process with the in-memory store."""
    policy = EgressPolicy.of(settings.webhook_allow_hosts, settings.webhook_allow_networks)
    poster = Poster(policy, timeout=settings.webhook_timeout, concurrency=WEBHOOK_CONCURRENCY)
    secret = settings.webhook_secret.encode() if settings.webhook_secret else None
    if isinstance(store, SqliteStore):
        return Outbox(store.outbox, poster, secret=secret, on_outcome=metrics.webhook)
    if is_postgres(settings.database_url):
        from goqueue.supervisor.store.postgres.store import PostgresStore

        assert isinstance(store, PostgresStore)
        return Outbox(store.outbox, poster, secret=secret, on_outcome=metrics.webhook)
    return WebhookSender(poster, secret=secret, node_id=store.node_id, on_outcome=metrics.webhook)


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


def build_node(settings: Settings, reload_settings: Callable[[], Settings]) -> Node:
    """Every part of one node, wired. Call it on the running loop the node will use."""
    from goqueue.api.http.app import create_app

    store = make_store(settings)
    metrics = Metrics(settings.metrics_max_queues)
    webhooks = make_webhooks(settings, metrics, store)
    history = History()
    waiters = Waiters(store.get)  # GET /jobs/{id}?wait=: woken by outcomes recorded here
    hooks = Hooks([MetricsHook(metrics), LogHook(), WebhookHook(webhooks), history, waiters])
    catalog = Catalog((), settings.limits)  # the first worker's Ready fills it in
    pool = Pool(
        asyncio.get_running_loop(),
        WorkerConfig.of(settings),
        kill_grace=settings.kill_grace,
        recycle=Recycle.of(settings),
        # with a shared database another node may take over a job whose lease ran out;
        # in memory no one else can, so a job has no such bound
        lease_allowance=(
            ALLOWANCE_SHARE * settings.lease_seconds if is_postgres(settings.database_url) else None
        ),
        memory_limit_mb=settings.max_worker_rss_mb,
    )
    dispatcher = Dispatcher(
        store,
        pool,
        catalog,
        hooks,
        policy=Policy.of(settings),
        # a store whose claims cost a round trip keeps a worker's worth in hand
        prefetch=settings.prefetch if store.claim_ahead else 0,
        on_rate_wait=metrics.rate_limit_wait,
    )
    pool.listen(jobs=dispatcher)
    store.set_waker(dispatcher.wake)
    store.set_canceller(dispatcher.cancel_lease)
    scheduler = Scheduler(store, hooks, metrics)  # given its schedules with the catalog
    tracing = None
    if settings.otel:  # only then is OpenTelemetry imported
        from goqueue.supervisor.observe.tracing import Tracing

        tracing = Tracing(store.node_id)
    engine = Engine(
        store,
        pool,
        catalog,
        hooks,
        metrics,
        history=history,
        kill=dispatcher.cancel_lease,
        webhooks=webhooks,
        waiters=waiters,
        scheduler=scheduler,
        start_at_enqueue=dispatcher.start_at_enqueue,
        tracing=tracing,
    )
    pool.listen(children=engine.enqueue_child)  # ctx.enqueue in a running job
    store.set_reporter(engine.node_report)  # published with each heartbeat
    http = HttpServer(settings, lambda: create_app(engine, settings))
    return Node(
        settings=settings,
        store=store,
        pool=pool,
        dispatcher=dispatcher,
        engine=engine,
        hooks=hooks,
        history=history,
        metrics=metrics,
        webhooks=webhooks,
        leases=Leases(store, dispatcher, pool),
        scheduler=scheduler,
        http=http,
        reload_settings=reload_settings,
    )


async def serve_async(settings: Settings, args: argparse.Namespace | None) -> int:
    """Run one node until it is stopped; returns the exit code."""

    def reload_settings() -> Settings:
        return config.reload(settings, args, os.environ)

    node = build_node(settings, reload_settings)
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
    soft, hard = raise_open_files_limit()
    log.info("open files limit", extra={"soft": soft, "hard": hard})
    return uvloop.run(serve_async(settings, args))
