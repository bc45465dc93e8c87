"""Metrics: events recorded through `Metrics` show up in the Prometheus exposition."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from goqueue.supervisor.common.enums import (
    AttemptOutcome,
    RestartReason,
    Status,
    WebhookOutcome,
    WorkerState,
)
from goqueue.supervisor.common.jobs import Job, JobSpec, Outcome
from goqueue.supervisor.common.reads import QueueDepths
from goqueue.supervisor.observe.metrics import OTHER_QUEUES, Metrics
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.timeout(30)


def samples(metrics: Metrics) -> dict[tuple[str, frozenset], float]:
    """Every sample of `render()`, keyed by sample name and label set."""
    body, content_type = metrics.render()
    assert content_type.startswith("text/plain")
    out: dict[tuple[str, frozenset], float] = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            out[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return out


def key(name: str, **labels: str) -> tuple[str, frozenset]:
    return name, frozenset(labels.items())


def job(status: Status, job_type: str = "email") -> Job:
    made = Job.from_spec(JobSpec(type=job_type), now=datetime.now(UTC), max_retries=3)
    made.status = status
    return made


def test_counters_and_histogram_buckets() -> None:
    metrics = Metrics()
    for _ in range(4):
        metrics.after_enqueue(job(Status.PENDING))
    for duration in (0.002, 0.02, 0.7):
        metrics.after_attempt("email", AttemptOutcome.SUCCEEDED, duration)
    metrics.after_attempt("email", AttemptOutcome.TIMEOUT, 31.0)
    metrics.after_outcome(Outcome(job(Status.PENDING), []))  # a retry scheduled
    metrics.after_outcome(Outcome(job(Status.DONE), []))
    metrics.after_outcome(Outcome(job(Status.DONE), []))
    metrics.after_outcome(Outcome(job(Status.FAILED), []))
    metrics.after_cancel(job(Status.CANCELLED), force=True)
    metrics.worker_restart("timeout")
    metrics.webhook("delivered")
    metrics.webhook("retried")
    metrics.http("/jobs/{id}", "GET", 200, 0.0007)
    metrics.http("/jobs/{id}", "GET", 404, 0.003)

    got = samples(metrics)
    assert got[key("goqueue_enqueued_total", type="email")] == 4
    assert got[key("goqueue_job_attempts_total", type="email", outcome="succeeded")] == 3
    assert got[key("goqueue_job_attempts_total", type="email", outcome="timeout")] == 1
    assert got[key("goqueue_job_retries_total", type="email")] == 1
    assert got[key("goqueue_jobs_total", type="email", status="done")] == 2
    assert got[key("goqueue_jobs_total", type="email", status="failed")] == 1
    assert got[key("goqueue_jobs_total", type="email", status="cancelled")] == 1
    assert key("goqueue_jobs_total", type="email", status="pending") not in got
    assert got[key("goqueue_worker_restarts_total", reason="timeout")] == 1
    assert got[key("goqueue_worker_restarts_total", reason="crash")] == 0  # exported at zero
    assert got[key("goqueue_webhook_deliveries_total", outcome="delivered")] == 1
    assert got[key("goqueue_webhook_deliveries_total", outcome="failed")] == 0
    assert (
        got[key("goqueue_http_requests_total", route="/jobs/{id}", method="GET", status="404")] == 1
    )

    bucket = "goqueue_attempt_duration_seconds_bucket"
    expected = {"0.001": 0, "0.005": 1, "0.025": 2, "0.5": 2, "1.0": 3, "30.0": 3, "60.0": 4}
    for le, count in expected.items():
        assert got[key(bucket, type="email", le=le)] == count, le
    assert got[key(bucket, type="email", le="+Inf")] == 4
    assert got[key("goqueue_attempt_duration_seconds_count", type="email")] == 4
    assert got[key("goqueue_attempt_duration_seconds_sum", type="email")] == pytest.approx(31.722)

    http_bucket = "goqueue_http_request_duration_seconds_bucket"
    assert got[key(http_bucket, route="/jobs/{id}", le="0.0005")] == 0
    assert got[key(http_bucket, route="/jobs/{id}", le="0.001")] == 1
    assert got[key(http_bucket, route="/jobs/{id}", le="0.005")] == 2


def test_gauges_and_vanished_depth_series_are_removed() -> None:
    metrics = Metrics()
    metrics.set_running(3)
    metrics.set_workers({"busy": 3, "idle": 1})
    metrics.set_depth(QueueDepths({"default": {"5": 7, "10": 2}, "bulk": {"0": 4}}, {}, 2, 13))
    got = samples(metrics)
    assert got[key("goqueue_jobs_running")] == 3
    assert got[key("goqueue_workers", state="busy")] == 3
    assert got[key("goqueue_workers", state="booting")] == 0
    assert got[key("goqueue_queue_depth", queue="default", priority="10")] == 2
    assert got[key("goqueue_queues")] == 2

    metrics.set_workers({"idle": 4})
    metrics.set_depth(QueueDepths({"default": {"5": 1}}, {}, 1, 1))
    got = samples(metrics)
    assert got[key("goqueue_workers", state="busy")] == 0
    assert got[key("goqueue_workers", state="idle")] == 4
    assert got[key("goqueue_queue_depth", queue="default", priority="5")] == 1
    depth = {k for k in got if k[0] == "goqueue_queue_depth"}
    assert depth == {key("goqueue_queue_depth", queue="default", priority="5")}


def test_depth_series_are_capped_with_the_rest_summed() -> None:
    metrics = Metrics(depth_queues=2)
    top = {"a": {"5": 9}, "b": {"5": 5, "0": 1}}
    metrics.set_depth(QueueDepths(top, {"5": 3, "10": 1}, 40, 19))
    got = samples(metrics)
    depth = {k: v for k, v in got.items() if k[0] == "goqueue_queue_depth"}
    assert len(depth) == 5
    assert got[key("goqueue_queue_depth", queue=OTHER_QUEUES, priority="5")] == 3
    assert got[key("goqueue_queue_depth", queue=OTHER_QUEUES, priority="10")] == 1
    assert got[key("goqueue_queues")] == 40
    metrics.set_depth(QueueDepths({}, {}, 0, 0))
    assert not [k for k in samples(metrics) if k[0] == "goqueue_queue_depth"]


def test_oldest_wait_follows_the_depth_queues_and_dead_letters_are_counted() -> None:
    metrics = Metrics(depth_queues=2)
    waiting = {"a": 12.5, "b": 0.0, OTHER_QUEUES: 40.0}
    metrics.set_depth(QueueDepths({"a": {"5": 1}, "b": {"5": 1}}, {"5": 1}, 3, 3, waiting, 7))
    got = samples(metrics)
    assert got[key("goqueue_queue_oldest_pending_seconds", queue="a")] == 12.5
    assert got[key("goqueue_queue_oldest_pending_seconds", queue="b")] == 0
    assert got[key("goqueue_queue_oldest_pending_seconds", queue=OTHER_QUEUES)] == 40
    assert got[key("goqueue_dead_letters")] == 7
    metrics.set_depth(QueueDepths({"a": {"5": 1}}, {}, 1, 1, {"a": 13.0}, 0))
    got = samples(metrics)
    oldest = {k for k in got if k[0] == "goqueue_queue_oldest_pending_seconds"}
    assert oldest == {key("goqueue_queue_oldest_pending_seconds", queue="a")}  # the rest gone
    assert got[key("goqueue_dead_letters")] == 0


def test_declared_types_start_at_zero() -> None:
    metrics = Metrics()
    metrics.declare_types(["report"])
    got = samples(metrics)
    assert got[key("goqueue_jobs_total", type="report", status="cancelled")] == 0
    assert got[key("goqueue_job_attempts_total", type="report", outcome="crashed")] == 0
    assert got[key("goqueue_attempt_duration_seconds_count", type="report")] == 0


def test_two_instances_are_independent() -> None:
    first, second = Metrics(), Metrics()  # would raise "Duplicated timeseries" on one registry
    first.after_outcome(Outcome(job(Status.DONE), []))
    first.after_enqueue(job(Status.PENDING))
    assert first.registry is not second.registry
    assert samples(first)[key("goqueue_enqueued_total", type="email")] == 1
    assert key("goqueue_enqueued_total", type="email") not in samples(second)
    assert key("goqueue_jobs_total", type="email", status="done") not in samples(second)


def test_every_restart_reason_is_exported_at_zero_from_the_start() -> None:
    got = samples(Metrics())
    for reason in RestartReason:
        assert got[key("goqueue_worker_restarts_total", reason=reason.value)] == 0
    assert got[key("goqueue_worker_restarts_total", reason="lease_lost")] == 0
    for state in WorkerState:
        assert got[key("goqueue_workers", state=state.value)] == 0
    for outcome in WebhookOutcome:
        assert got[key("goqueue_webhook_deliveries_total", outcome=outcome.value)] == 0
