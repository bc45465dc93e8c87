"""Prometheus series for one node, on a registry of its own (no default REGISTRY).

Workers report their outcomes to the supervisor over the pipe and only the supervisor
records them, so plain single-process collectors suffice (no multiprocess mode).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Iterator, Mapping
from enum import StrEnum
from typing import Any

from goqueue.supervisor.jobs import QueueDepths
from goqueue.supervisor.vocab import (
    TERMINAL,
    AttemptOutcome,
    RestartReason,
    Status,
    WebhookOutcome,
    WorkerState,
)
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

TERMINAL_STATUSES: tuple[Status, ...] = tuple(s for s in Status if s in TERMINAL)
# The queue label of the pending jobs of every queue beyond the deepest ones: parentheses
# are not allowed in a queue name, so no real queue can take this series over.
OTHER_QUEUES = "(other)"
DEFAULT_DEPTH_QUEUES = 100

ATTEMPT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
HTTP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1)


class ConnectionClose(StrEnum):
    """Why the node closed an HTTP connection itself."""

    HEADER_TIMEOUT = "header_timeout"  # no complete request headers in time (slowloris)
    EVICTED = "evicted"  # idle the longest when a new connection needed its place
    REFUSED = "refused"  # over the cap with every connection busy: answered 503


class HttpTally:
    """Requests by route, method and status, and their durations by route, as plain
    counts: a request costs two dict updates and a bisect, and the Prometheus families
    are built only when scraped (`HttpRequests`, `HttpSeconds`)."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, str, int], int] = {}
        self.buckets: dict[str, list[int]] = {}  # per route: one count per bucket, then +Inf
        self.sums: dict[str, float] = {}

    def add(self, route: str, method: str, status: int, duration: float) -> None:
        """One answered request."""
        counts = self.counts
        key = (route, method, status)
        counts[key] = counts.get(key, 0) + 1
        buckets = self.buckets.get(route)
        if buckets is None:
            buckets = self.buckets[route] = [0] * (len(HTTP_BUCKETS) + 1)
            self.sums[route] = 0.0
        buckets[bisect_left(HTTP_BUCKETS, duration)] += 1
        self.sums[route] += duration


class HttpRequests:
    """`goqueue_http_requests_total`, from the tally (a custom collector)."""

    def __init__(self, tally: HttpTally) -> None:
        self.tally = tally

    def describe(self) -> list[Metric]:
        """The family, without samples (for the registry's name check)."""
        return [self._family()]

    def collect(self) -> Iterator[Metric]:
        """The family with one sample per route, method and status seen."""
        family = self._family()
        for (route, method, status), count in list(self.tally.counts.items()):
            family.add_metric([route, method, str(status)], count)
        yield family

    @staticmethod
    def _family() -> CounterMetricFamily:
        return CounterMetricFamily(
            "goqueue_http_requests", "HTTP requests answered.", labels=["route", "method", "status"]
        )


class HttpSeconds:
    """`goqueue_http_request_duration_seconds`, from the tally (a custom collector)."""

    def __init__(self, tally: HttpTally) -> None:
        self.tally = tally

    def describe(self) -> list[Metric]:
        """The family, without samples (for the registry's name check)."""
        return [self._family()]

    def collect(self) -> Iterator[Metric]:
        """The family with cumulative buckets per route."""
        family = self._family()
        bounds = [*map(floatToGoString, HTTP_BUCKETS), "+Inf"]
        for route, counts in list(self.tally.buckets.items()):
            cumulative, total = [], 0
            for bound, count in zip(bounds, counts, strict=True):
                total += count
                cumulative.append((bound, total))
            family.add_metric([route], cumulative, self.tally.sums[route])
        yield family

    @staticmethod
    def _family() -> HistogramMetricFamily:
        return HistogramMetricFamily(
            "goqueue_http_request_duration_seconds",
            "Time to answer an HTTP request.",
            labels=["route"],
        )


class Metrics:
    """Every GoQueue series, plus one small method per event that moves them."""

    def __init__(self, depth_queues: int = DEFAULT_DEPTH_QUEUES) -> None:
        self.depth_queues = depth_queues  # queues with depth series of their own
        self.registry = CollectorRegistry()
        reg = self.registry
        self.jobs = Counter(
            "goqueue_jobs_total",
            "Jobs reaching a terminal status.",
            ["type", "status"],
            registry=reg,
        )
        self.retries = Counter(
            "goqueue_job_retries_total", "Retries scheduled.", ["type"], registry=reg
        )
        self.attempts = Counter(
            "goqueue_job_attempts_total",
            "Attempts finished, by outcome.",
            ["type", "outcome"],
            registry=reg,
        )
        self.attempt_seconds = Histogram(
            "goqueue_attempt_duration_seconds",
            "Wall time of one attempt.",
            ["type"],
            buckets=ATTEMPT_BUCKETS,
            registry=reg,
        )
        self.queue_depth = Gauge(
            "goqueue_queue_depth",
            f'Pending jobs of the deepest queues; the rest summed under queue="{OTHER_QUEUES}".',
            ["queue", "priority"],
            registry=reg,
        )
        self.queues = Gauge("goqueue_queues", "Queues holding pending jobs.", registry=reg)
        self.open_api = Gauge(
            "goqueue_api_open",
            "1 when the API listens beyond loopback with no API key: anyone reaching the port "
            "may enqueue, cancel and replay.",
            registry=reg,
        )
        self.running = Gauge("goqueue_jobs_running", "Attempts running now.", registry=reg)
        self.workers = Gauge(
            "goqueue_workers", "Worker processes by state.", ["state"], registry=reg
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
        # counted per request in plain dicts, turned into series only when scraped
        self.http_tally = tally = HttpTally()
        self.http = tally.add  # http(route, method, status, seconds): `route` is a template
        self.http_requests = HttpRequests(tally)
        self.http_seconds = HttpSeconds(tally)
        reg.register(self.http_requests)
        reg.register(self.http_seconds)
        self.connections = Gauge(
            "goqueue_http_connections", "HTTP connections open now.", registry=reg
        )
        self.connections_closed = Counter(
            "goqueue_http_connections_closed_total",
            "HTTP connections the node closed itself, by reason.",
            ["reason"],
            registry=reg,
        )
        self.enqueued_jobs = Counter(
            "goqueue_enqueued_total", "Jobs enqueued.", ["type"], registry=reg
        )
        self._depth_keys: set[tuple[str, str]] = set()
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
            self.enqueued_jobs.labels(job_type)
            self.retries.labels(job_type)
            self.attempt_seconds.labels(job_type)
            for status in TERMINAL_STATUSES:
                self.jobs.labels(job_type, status)
            for outcome in AttemptOutcome:
                self.attempts.labels(job_type, outcome)

    def job_finished(self, job_type: str, status: Status) -> None:
        """A job reached done, failed or cancelled."""
        self._labels(self.jobs, job_type, status).inc()

    def attempt(self, job_type: str, outcome: AttemptOutcome, duration: float) -> None:
        """An attempt ended; `duration` in seconds."""
        self._labels(self.attempts, job_type, outcome).inc()
        self._labels(self.attempt_seconds, job_type).observe(duration)

    def retry(self, job_type: str) -> None:
        """A failed attempt was scheduled to run again."""
        self._labels(self.retries, job_type).inc()

    def worker_restart(self, reason: RestartReason) -> None:
        """A worker process was replaced."""
        self.restarts.labels(reason).inc()

    def webhook(self, outcome: WebhookOutcome) -> None:
        """A webhook delivery outcome (fits `WebhookSender`'s `on_outcome` hook)."""
        self.webhooks.labels(outcome).inc()

    def enqueued(self, job_type: str, n: int = 1) -> None:
        """`n` jobs of `job_type` were stored."""
        self._labels(self.enqueued_jobs, job_type).inc(n)

    def set_running(self, count: int) -> None:
        """How many attempts run now."""
        self.running.set(count)

    def set_workers(self, counts: Mapping[str, int]) -> None:
        """Workers by state; known states missing from `counts` are set to 0."""
        for state in {*WorkerState, *counts}:
            self.workers.labels(state).set(counts.get(state, 0))

    def set_depth(self, depths: QueueDepths) -> None:
        """Pending jobs by priority of the deepest queues, the rest summed under
        `OTHER_QUEUES`. A series that is no longer among them is removed, not left at 0:
        the page stays small however many queues came and went."""
        current = {(q, p): n for q, by in depths.top.items() for p, n in by.items()}
        current.update(((OTHER_QUEUES, p), n) for p, n in depths.other.items())
        for key in self._depth_keys - current.keys():
            self.queue_depth.remove(*key)
        for key, count in current.items():
            self.queue_depth.labels(*key).set(count)
        self._depth_keys = set(current)
        self.queues.set(depths.queues)

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
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
