"""Prometheus series for one node, on a registry of its own (no default REGISTRY).

Workers report their outcomes to the supervisor over the pipe and only the supervisor
records them, so plain single-process collectors suffice (no multiprocess mode).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

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

TERMINAL_STATUSES: tuple[Status, ...] = tuple(s for s in Status if s in TERMINAL)

ATTEMPT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
HTTP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1)


class Metrics:
    """Every GoQueue series, plus one small method per event that moves them."""

    def __init__(self) -> None:
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
            "goqueue_queue_depth", "Pending jobs.", ["queue", "priority"], registry=reg
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
        self.http_requests = Counter(
            "goqueue_http_requests_total",
            "HTTP requests answered.",
            ["route", "method", "status"],
            registry=reg,
        )
        self.http_seconds = Histogram(
            "goqueue_http_request_duration_seconds",
            "Time to answer an HTTP request.",
            ["route"],
            buckets=HTTP_BUCKETS,
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

    def http(self, route: str, method: str, status: int, duration: float) -> None:
        """An answered request; `route` must be the route template, never the raw path."""
        self._labels(self.http_requests, route, method, str(status)).inc()
        self._labels(self.http_seconds, route).observe(duration)

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

    def set_depth(self, queues: Mapping[str, Mapping[str, int]]) -> None:
        """Pending jobs by queue and priority (store stats); series that vanished go to 0."""
        seen: set[tuple[str, str]] = set()
        for queue, by_priority in queues.items():
            for priority, count in by_priority.items():
                key = (queue, str(priority))
                seen.add(key)
                self.queue_depth.labels(*key).set(count)
        for key in self._depth_keys - seen:
            self.queue_depth.labels(*key).set(0)
        self._depth_keys |= seen

    def render(self) -> tuple[bytes, str]:
        """The exposition body and its content type, for GET /metrics."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
