"""Prometheus series for one node, on a registry of its own (no default REGISTRY).

`Metrics` is itself the hook that counts what happens to jobs, as dramatiq's Prometheus
middleware is: the series move in the call that reports the event. The series that move
on every job or request are tallies (`Tally`, `TallyHistogram`): plain counts, turned
into Prometheus families only when scraped. Workers report their
outcomes to the supervisor over the pipe and only the supervisor records them, so plain
single-process collectors suffice (no multiprocess mode).
"""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from enum import StrEnum
from functools import partial
from typing import Any

from goqueue.supervisor.common.enums import (
    TERMINAL,
    AttemptOutcome,
    RestartReason,
    Status,
    WebhookOutcome,
    WorkerState,
)
from goqueue.supervisor.common.hooks import Hook
from goqueue.supervisor.common.jobs import Job, Outcome
from goqueue.supervisor.common.reads import OTHER_QUEUES as OTHER_QUEUES
from goqueue.supervisor.common.reads import QueueDepths
from goqueue.supervisor.observe.loop import LoopWatch, Work
from goqueue.supervisor.store.base import Upkeep
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

TERMINAL_STATUSES: tuple[Status, ...] = tuple(s for s in Status if s in TERMINAL)
DEFAULT_DEPTH_QUEUES = 100

ATTEMPT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
HTTP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1)
LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


class ConnectionClose(StrEnum):
    """Why the node closed an HTTP connection itself."""

    HEADER_TIMEOUT = "header_timeout"  # no complete request headers in time (slowloris)
    EVICTED = "evicted"  # idle the longest when a new connection needed its place
    REFUSED = "refused"  # over the cap with every connection busy: answered 503


_WITH_CREATED = frozenset({"counter", "histogram", "summary"})
_HTTP_WORK = (Work.HTTP,)


class Tally:
    """A labelled counter kept as plain counts, for series that move on every request or
    job: an update is one dict operation (no lock, no child lookup), and the Prometheus
    family is built only when scraped. Registered on a registry as a custom collector."""

    def __init__(self, name: str, documentation: str, labels: Sequence[str]) -> None:
        self.name = name
        self.documentation = documentation
        self.labels = list(labels)
        self.counts: defaultdict[tuple[str, ...], float] = defaultdict(float)

    def inc(self, key: tuple[str, ...], amount: float = 1) -> None:
        """Count `amount` for the label values `key`."""
        self.counts[key] += amount

    def declare(self, key: tuple[str, ...]) -> None:
        """Export the series for `key` at zero until it moves."""
        self.counts.setdefault(key, 0)

    def describe(self) -> list[Metric]:
        """The family, without samples (for the registry's name check)."""
        return [CounterMetricFamily(self.name, self.documentation, labels=self.labels)]

    def collect(self) -> Iterator[Metric]:
        """The family with one sample per label set seen."""
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labels)
        for key, count in list(self.counts.items()):
            family.add_metric([str(value) for value in key], count)
        yield family


class TallyHistogram:
    """A labelled histogram kept as plain counts per bucket (see `Tally`)."""

    def __init__(
        self, name: str, documentation: str, labels: Sequence[str], buckets: Sequence[float]
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labels = list(labels)
        self.bounds = tuple(buckets)
        self.buckets: dict[tuple[str, ...], list[int]] = {}  # one count per bound, then +Inf
        self.sums: dict[tuple[str, ...], float] = {}

    def observe(self, key: tuple[str, ...], value: float) -> None:
        """One observation for the label values `key`."""
        buckets = self.buckets.get(key)
        if buckets is None:
            buckets = self.declare(key)
        buckets[bisect_left(self.bounds, value)] += 1
        self.sums[key] += value

    def declare(self, key: tuple[str, ...]) -> list[int]:
        """Export the series for `key` at zero until it moves; its bucket counts."""
        if key not in self.buckets:
            self.buckets[key] = [0] * (len(self.bounds) + 1)
            self.sums[key] = 0.0
        return self.buckets[key]

    def describe(self) -> list[Metric]:
        """The family, without samples (for the registry's name check)."""
        return [HistogramMetricFamily(self.name, self.documentation, labels=self.labels)]

    def collect(self) -> Iterator[Metric]:
        """The family with cumulative buckets per label set."""
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labels)
        bounds = [*map(floatToGoString, self.bounds), "+Inf"]
        for key, counts in list(self.buckets.items()):
            cumulative, total = [], 0
            for bound, count in zip(bounds, counts, strict=True):
                total += count
                cumulative.append((bound, total))
            family.add_metric([str(value) for value in key], cumulative, self.sums[key])
        yield family


class WithoutCreated(Collector):
    """A registry's families without their `*_created` samples: a second series per
    counter and histogram that dashboards rarely use. prometheus-client's own switch
    (`disable_created_metrics`) is process-wide; this keeps the choice with the node's
    registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def collect(self) -> Iterator[Metric]:
        for family in self.registry.collect():  # fresh families on every scrape
            if family.type in _WITH_CREATED:
                family.samples = [s for s in family.samples if not s.name.endswith("_created")]
            yield family


class Metrics(Hook):
    """Every GoQueue series, plus one small method per event that moves them (the jobs'
    events are its `Hook` methods)."""

    def __init__(self, depth_queues: int = DEFAULT_DEPTH_QUEUES) -> None:
        self.depth_queues = depth_queues  # queues with depth series of their own
        self.registry = CollectorRegistry()
        reg = self.registry
        self.exposed = CollectorRegistry(auto_describe=True)  # what GET /metrics shows
        self.exposed.register(WithoutCreated(reg))
        # Series that move with every job or request are tallies: plain counts, turned
        # into Prometheus families only when scraped.
        self.jobs = Tally("goqueue_jobs", "Jobs reaching a terminal status.", ["type", "status"])
        self.retries = Tally("goqueue_job_retries", "Retries scheduled.", ["type"])
        self.attempts = Tally(
            "goqueue_job_attempts", "Attempts finished, by outcome.", ["type", "outcome"]
        )
        self.attempt_seconds = TallyHistogram(
            "goqueue_attempt_duration_seconds",
            "Wall time of one attempt.",
            ["type"],
            ATTEMPT_BUCKETS,
        )
        self.enqueued_jobs = Tally("goqueue_enqueued", "Jobs enqueued.", ["type"])
        self.http_requests = Tally(
            "goqueue_http_requests", "HTTP requests answered.", ["route", "method", "status"]
        )
        self.http_seconds = TallyHistogram(
            "goqueue_http_request_duration_seconds",
            "Time to answer an HTTP request.",
            ["route"],
            HTTP_BUCKETS,
        )
        # the supervisor's loop: its lag and where its time goes
        self.loop_lag = TallyHistogram(
            "goqueue_loop_lag_seconds",
            "How late the supervisor's event loop ran a timer due every 0.1 s.",
            [],
            LAG_BUCKETS,
        )
        self.loop_busy = Tally(
            "goqueue_loop_busy_seconds",
            "Seconds the supervisor's event loop spent in each kind of work (HTTP: wall time "
            "of request handlers, which may include waits on the store).",
            ["work"],
        )
        for work in Work:
            self.loop_busy.declare((work,))
        self.loop_lag.declare(())
        self.loop = LoopWatch(partial(self.loop_lag.observe, ()), self.loop_busy.inc)
        for tally in (
            self.jobs,
            self.retries,
            self.attempts,
            self.attempt_seconds,
            self.enqueued_jobs,
            self.http_requests,
            self.http_seconds,
            self.loop_lag,
            self.loop_busy,
        ):
            reg.register(tally)
        self.queue_depth = Gauge(
            "goqueue_queue_depth",
            f'Pending jobs of the deepest queues; the rest summed under queue="{OTHER_QUEUES}".',
            ["queue", "priority"],
            registry=reg,
        )
        self.queues = Gauge("goqueue_queues", "Queues holding pending jobs.", registry=reg)
        self.oldest_pending = Gauge(
            "goqueue_queue_oldest_pending_seconds",
            "How long the longest-waiting due job of a queue has waited (0 with none due), "
            f'for the deepest queues; the longest of the rest under queue="{OTHER_QUEUES}".',
            ["queue"],
            registry=reg,
        )
        self.dead_letters = Gauge(
            "goqueue_dead_letters", "Dead letters in the store.", registry=reg
        )
        self.dead_rows = Gauge(
            "goqueue_store_dead_rows",
            "Dead row versions in the jobs table, as PostgreSQL counts them (0 elsewhere).",
            registry=reg,
        )
        self.oldest_snapshot = Gauge(
            "goqueue_store_oldest_snapshot_seconds",
            "Age of the oldest open transaction holding a snapshot in the database: VACUUM "
            "cannot remove row versions newer than it (0 with none, and off PostgreSQL).",
            registry=reg,
        )
        self.vacuums = Counter(
            "goqueue_store_vacuums", "VACUUMs of the jobs table this node ran.", registry=reg
        )
        self._vacuums_seen = 0
        self.open_api = Gauge(
            "goqueue_api_open",
            "1 when the API listens beyond loopback with no API key: anyone reaching the port "
            "may enqueue, cancel and replay.",
            registry=reg,
        )
        self.running = Gauge("goqueue_jobs_running", "Attempts running now.", registry=reg)
        self.workflows = Gauge(
            "goqueue_workflows", "Workflows in the store, by status.", ["status"], registry=reg
        )
        self.steps_waiting = Gauge(
            "goqueue_workflow_steps_waiting",
            "Workflow steps waiting for their parents.",
            registry=reg,
        )
        self.workers = Gauge(
            "goqueue_workers", "Worker processes by state.", ["state"], registry=reg
        )
        self.worker_bounds = Gauge(
            "goqueue_worker_bounds",
            "Worker processes aimed for now (target) and the bounds, min and max.",
            ["bound"],
            registry=reg,
        )
        self.restarts = Counter(
            "goqueue_worker_restarts_total",
            "Workers replaced, by reason.",
            ["reason"],
            registry=reg,
        )
        self.webhooks = Counter(
            "goqueue_webhook_deliveries_total",
            "Webhook delivery outcomes.",
            ["outcome"],
            registry=reg,
        )
        self.connections = Gauge(
            "goqueue_http_connections", "HTTP connections open now.", registry=reg
        )
        self.connections_closed = Counter(
            "goqueue_http_connections_closed_total",
            "HTTP connections the node closed itself, by reason.",
            ["reason"],
            registry=reg,
        )
        self.schedule_fires = Counter(
            "goqueue_schedule_fires_total",
            "Jobs this node enqueued for a schedule's tick (with PostgreSQL, a tick fires "
            "on one node only: sum over nodes).",
            ["schedule"],
            registry=reg,
        )
        self.rate_limit_waits = Counter(
            "goqueue_rate_limit_waits_total",
            "Dispatch passes that held a type's jobs back because none of its rate-limited "
            "starts was due.",
            ["type"],
            registry=reg,
        )
        self.key_limit_waits = Counter(
            "goqueue_key_limit_waits_total",
            "Claims that came back short while they held some of a type's due jobs back "
            "because their concurrency_key was at its key_concurrency or its pace not due "
            "(no key label: keys are unbounded).",
            ["type"],
            registry=reg,
        )
        self._depth_keys: set[tuple[str, str]] = set()
        self._waiting_keys: set[str] = set()
        self._children: dict[tuple[object, ...], Any] = {}
        self._start_at_zero()

    def _labels(self, metric: Any, *values: str) -> Any:
        """`metric.labels(*values)`, cached: prometheus-client's lookup is slow on hot paths
        (one per request and per attempt); label sets are bounded, so is the cache."""
        key = (metric, *values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*values)
        return child

    def _start_at_zero(self) -> None:
        """Export fixed-label series from the start so rate() and alerts see a 0, not a gap."""
        for state in WorkerState:
            self.workers.labels(state)
        for reason in RestartReason:
            self.restarts.labels(reason)
        for outcome in WebhookOutcome:
            self.webhooks.labels(outcome)
        for closed in ConnectionClose:
            self.connections_closed.labels(closed)

    def declare_types(self, job_types: Iterable[str]) -> None:
        """Create the per-type series of the registered actors at zero."""
        for job_type in job_types:
            self.enqueued_jobs.declare((job_type,))
            self.retries.declare((job_type,))
            self.attempt_seconds.declare((job_type,))
            for status in TERMINAL_STATUSES:
                self.jobs.declare((job_type, status))
            for outcome in AttemptOutcome:
                self.attempts.declare((job_type, outcome))

    def after_enqueue(self, job: Job) -> None:
        self.enqueued_jobs.inc((job.type,))

    def after_attempt(self, job_type: str, outcome: AttemptOutcome, duration: float) -> None:
        self.attempts.inc((job_type, outcome))
        self.attempt_seconds.observe((job_type,), duration)

    def after_outcome(self, outcome: Outcome) -> None:
        job = outcome.job
        if job.status == Status.PENDING:
            self.retries.inc((job.type,))
        elif job.status in TERMINAL:
            self.jobs.inc((job.type, job.status))

    def after_cancel(self, job: Job, force: bool) -> None:
        self.jobs.inc((job.type, Status.CANCELLED))

    def finished(self) -> tuple[int, int]:
        """Jobs done and attempts failed (retried or dead-lettered) since the node started."""
        done = failed = 0
        for (_type, status), count in list(self.jobs.counts.items()):
            if status == Status.DONE:
                done += int(count)
            elif status == Status.FAILED:
                failed += int(count)
        return done, failed + int(sum(list(self.retries.counts.values())))

    def worker_restart(self, reason: RestartReason) -> None:
        """A worker process was replaced."""
        self.restarts.labels(reason).inc()

    def webhook(self, outcome: WebhookOutcome) -> None:
        """A webhook delivery outcome (fits `WebhookSender`'s `on_outcome` hook)."""
        self.webhooks.labels(outcome).inc()

    def http(self, route: str, method: str, status: int, duration: float) -> None:
        """An answered request; `route` must be the route template, never the raw path."""
        self.http_requests.inc((route, method, str(status)))
        self.http_seconds.observe((route,), duration)
        self.loop_busy.inc(_HTTP_WORK, duration)

    def rate_limit_wait(self, job_type: str) -> None:
        """A dispatch pass held `job_type` back: its window's starts were used up."""
        self._labels(self.rate_limit_waits, job_type).inc()

    def key_limit_wait(self, job_type: str) -> None:
        """A claim came back short holding `job_type`'s jobs back by key."""
        self._labels(self.key_limit_waits, job_type).inc()

    def declare_schedules(self, names: Iterable[str]) -> None:
        """Create the series of the node's schedules at zero."""
        for name in names:
            self.schedule_fires.labels(name)

    def schedule_fired(self, name: str) -> None:
        """This node enqueued the job of one of `name`'s ticks."""
        self._labels(self.schedule_fires, name).inc()

    def set_running(self, count: int) -> None:
        """How many attempts run now."""
        self.running.set(count)

    def set_workers(self, counts: Mapping[str, int]) -> None:
        """Workers by state; known states missing from `counts` are set to 0."""
        for state in {*WorkerState, *counts}:
            self.workers.labels(state).set(counts.get(state, 0))

    def set_worker_bounds(self, target: int, minimum: int, maximum: int) -> None:
        """The worker count aimed for and its bounds (`--workers MIN:MAX`, TTIN/TTOU)."""
        for bound, value in (("target", target), ("min", minimum), ("max", maximum)):
            self.worker_bounds.labels(bound).set(value)

    def set_upkeep(self, upkeep: Upkeep) -> None:
        """The store's own upkeep, as of its last look (`Store.upkeep`)."""
        self.dead_rows.set(upkeep.dead_rows or 0)
        self.oldest_snapshot.set(upkeep.oldest_snapshot_seconds or 0)
        self.vacuums.inc(max(0, upkeep.vacuums - self._vacuums_seen))
        self._vacuums_seen = max(self._vacuums_seen, upkeep.vacuums)

    def set_depth(self, depths: QueueDepths) -> None:
        """Pending jobs by priority of the deepest queues, the rest summed under
        `OTHER_QUEUES`, their longest waits the same way, and the dead letters. A series
        that is no longer among them is removed, not left at 0: the page stays small
        however many queues came and went."""
        current = {(q, p): n for q, by in depths.top.items() for p, n in by.items()}
        current.update(((OTHER_QUEUES, p), n) for p, n in depths.other.items())
        for key in self._depth_keys - current.keys():
            self.queue_depth.remove(*key)
        for key, count in current.items():
            self.queue_depth.labels(*key).set(count)
        self._depth_keys = set(current)
        self.queues.set(depths.queues)
        for queue in self._waiting_keys - depths.waiting.keys():
            self.oldest_pending.remove(queue)
        for queue, seconds in depths.waiting.items():
            self.oldest_pending.labels(queue).set(seconds)
        self._waiting_keys = set(depths.waiting)
        self.dead_letters.set(depths.dead_letters)

    def set_workflows(self, by_status: Mapping[str, int], steps_waiting: int) -> None:
        """Workflows by status, and steps waiting (read from the store at a scrape)."""
        for status, count in by_status.items():
            self.workflows.labels(status).set(count)
        self.steps_waiting.set(steps_waiting)

    def set_connections(self, count: int) -> None:
        """HTTP connections open now."""
        self.connections.set(count)

    def connection_closed(self, reason: ConnectionClose) -> None:
        """The node closed an HTTP connection (a slow client, or to make room)."""
        self._labels(self.connections_closed, reason).inc()

    def set_open_api(self, is_open: bool) -> None:
        """Whether the API listens beyond loopback with no key (an alertable 1)."""
        self.open_api.set(1 if is_open else 0)

    def render(self) -> tuple[bytes, str]:
        """The exposition body and its content type, for GET /metrics."""
        return generate_latest(self.exposed), CONTENT_TYPE_LATEST
