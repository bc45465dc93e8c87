"""One node, built once and whole: `build_node` makes every part with what it needs, in
the order events flow (store, hooks, pool, dispatcher, engine); the arbiter only runs its
lifecycle. The engine never imports the API: the HTTP server is made by a callable the
caller (`goqueue serve`) passes in."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from goqueue.supervisor.common.catalog import Catalog
from goqueue.supervisor.common.lifecycle import Lifecycle
from goqueue.supervisor.dispatch.dispatcher import Dispatcher
from goqueue.supervisor.dispatch.leases import Leases
from goqueue.supervisor.dispatch.outcomes import Hooks
from goqueue.supervisor.dispatch.policy import Policy
from goqueue.supervisor.dispatch.wakeup import Wakeup
from goqueue.supervisor.engine import Engine
from goqueue.supervisor.observe.history import History
from goqueue.supervisor.observe.hooks import job_logs
from goqueue.supervisor.observe.loop import Work
from goqueue.supervisor.observe.metrics import Metrics
from goqueue.supervisor.queue_budget import QueueBudget, reserved_queues
from goqueue.supervisor.schedules.scheduler import Scheduler
from goqueue.supervisor.settings import config
from goqueue.supervisor.settings.config import Settings
from goqueue.supervisor.settings.stores import is_postgres
from goqueue.supervisor.store.base import NodeLinks, Store
from goqueue.supervisor.store.sqlite.choose import embedded_store
from goqueue.supervisor.store.sqlite.store import SqliteStore
from goqueue.supervisor.waiters import Waiters
from goqueue.supervisor.webhooks.delivery import Poster, Webhooks
from goqueue.supervisor.webhooks.egress import EgressPolicy
from goqueue.supervisor.webhooks.hook import WebhookHook
from goqueue.supervisor.webhooks.outbox import Outbox
from goqueue.supervisor.webhooks.sender import WebhookSender
from goqueue.supervisor.workers.events import Listeners
from goqueue.supervisor.workers.pool import Pool, Recycle, WorkerConfig

WEBHOOK_CONCURRENCY = 8  # attempts in flight at once, per node

# How long a running job may go without word from its supervisor, as a share of the lease.
# Leases are renewed every third of their length, so a supervisor frozen just before a
# renewal leaves its leases two thirds to live: a worker must give up before that (and
# Extend comes every 0.5 s, well inside the rest).
ALLOWANCE_SHARE = 0.6


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
    lifecycle: Lifecycle  # the node's phase: the arbiter moves it, the parts read it
    links: NodeLinks  # what the store calls back into (`Store.open`)
    listeners: Listeners  # who hears the pool, the arbiter aside (`Pool.listen`)
    store: Store
    pool: Pool
    dispatcher: Dispatcher
    engine: Engine
    hooks: Hooks
    history: History  # the recent past the dashboard shows
    metrics: Metrics
    webhooks: Webhooks  # the outbox with SQLite and PostgreSQL, in process in memory
    leases: Leases
    scheduler: Scheduler  # periodic jobs
    http: Server
    reload_settings: Callable[[], Settings]  # re-read the configuration (SIGHUP)


def make_store(
    settings: Settings, wake: Callable[[], None], metrics: Metrics
) -> tuple[Store, Webhooks]:
    """The store `database_url` names (the SQLite file `goqueue.db` by default,
    `memory://`, or PostgreSQL) and the webhooks that go with it, counting every delivery
    outcome: at least once from the file's or the database's outbox, best effort in this
    process in memory. `wake` is the dispatcher's."""
    node_id = settings.node_id or config.default_node_id()
    policy = EgressPolicy.of(settings.webhook_allow_hosts, settings.webhook_allow_networks)
    poster = Poster(policy, timeout=settings.webhook_timeout, concurrency=WEBHOOK_CONCURRENCY)
    secret = settings.webhook_secret.encode() if settings.webhook_secret else None
    embedded = embedded_store(settings, node_id, wake)
    if isinstance(embedded, SqliteStore):
        return embedded, Outbox(embedded.outbox, poster, secret=secret, on_outcome=metrics.webhook)
    if embedded is not None:
        sender = WebhookSender(poster, secret=secret, node_id=node_id, on_outcome=metrics.webhook)
        return embedded, sender
    from goqueue.supervisor.store.postgres.store import PostgresStore

    shared = PostgresStore(
        settings.database_url or "",
        node_id,
        schema=settings.database_schema,
        lease_seconds=settings.lease_seconds,
        idempotency_ttl=settings.idempotency_ttl,
        wake=wake,
    )
    return shared, Outbox(shared.outbox, poster, secret=secret, on_outcome=metrics.webhook)


def build_node(
    settings: Settings,
    reload_settings: Callable[[], Settings],
    http: Callable[[Engine], Server],
) -> Node:
    """Every part of one node, each given what it needs as it is made. Call it on the
    running loop the node will use; `http` makes the HTTP server over the engine."""
    metrics = Metrics(settings.metrics_max_queues)
    lifecycle = Lifecycle()
    wakeup = Wakeup()  # the dispatcher's, made first: the store calls it
    store, webhooks = make_store(settings, wakeup.wake, metrics)
    history = History(metrics.finished)  # samples the counts the metrics keep
    waiters = Waiters(store.get)  # GET /jobs/{id}?wait=: woken by outcomes recorded here
    hooks = Hooks([metrics, job_logs(), WebhookHook(webhooks), waiters])
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
        on_read=metrics.loop.spent(Work.WORKERS),
    )
    dispatcher = Dispatcher(
        store,
        pool,
        catalog,
        hooks,
        traits=store.traits,
        wakeup=wakeup,
        lifecycle=lifecycle,
        policy=Policy.of(settings),
        prefetch=settings.prefetch,
        on_rate_wait=metrics.rate_limit_wait,
        on_key_wait=metrics.key_limit_wait,
        on_pass=metrics.loop.spent(Work.DISPATCH),
    )
    metrics.loop.start(asyncio.get_running_loop())
    tracing = None
    if settings.otel:  # only then is OpenTelemetry imported
        from goqueue.supervisor.observe.tracing import Tracing

        tracing = Tracing(store.node_id)
    # periodic jobs; the jobs they fire are told to the enqueue hooks as the engine's own are
    scheduler = Scheduler(
        store,
        hooks.after_enqueue,
        metrics,
        produced=None if tracing is None else tracing.produced,
    )
    # the actors' own queues are reserved too once the first worker's Ready names them
    reserved = reserved_queues(settings.queues, (), settings.schedules)
    budget = QueueBudget(store, settings.max_queues, reserved=reserved)
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
        schedules=scheduler,
        lifecycle=lifecycle,
        budget=budget,
        dispatch=dispatcher.at_enqueue.enqueue,
        tracing=tracing,
    )
    return Node(
        settings=settings,
        lifecycle=lifecycle,
        # given to the store as it opens: a job another node cancelled runs here; what this
        # node publishes with each heartbeat
        links=NodeLinks(cancel=dispatcher.cancel_lease, report=engine.node_report),
        # given to the pool as the arbiter starts it, with the arbiter as the workers' own
        listeners=Listeners(jobs=dispatcher, children=engine.enqueue_child),
        store=store,
        pool=pool,
        dispatcher=dispatcher,
        engine=engine,
        hooks=hooks,
        history=history,
        metrics=metrics,
        webhooks=webhooks,
        leases=Leases(store, dispatcher, pool),
        scheduler=scheduler,  # given its schedules with the catalog
        http=http(engine),
        reload_settings=reload_settings,
    )
