"""The hooks that count and log what happens to jobs (Prometheus counters, log lines)."""

from __future__ import annotations

import logging

from goqueue.supervisor.common.enums import TERMINAL, AttemptOutcome, Status
from goqueue.supervisor.common.hooks import Hook
from goqueue.supervisor.common.jobs import Job, Outcome
from goqueue.supervisor.observe.metrics import Metrics


class MetricsHook(Hook):
    """The Prometheus counters that move with jobs."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def after_enqueue(self, job: Job) -> None:
        self.metrics.enqueued(job.type)

    def after_attempt(self, job_type: str, outcome: AttemptOutcome, duration: float) -> None:
        self.metrics.attempt(job_type, outcome, duration)

    def after_outcome(self, outcome: Outcome) -> None:
        job = outcome.job
        if job.status == Status.PENDING:
            self.metrics.retry(job.type)
        elif job.status in TERMINAL:
            self.metrics.job_finished(job.type, job.status)

    def after_cancel(self, job: Job, force: bool) -> None:
        self.metrics.job_finished(job.type, Status.CANCELLED)


class LogHook(Hook):
    """The log lines about jobs (faults of the machinery are logged where they happen)."""

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self.log = logger or logging.getLogger("goqueue.jobs")

    def after_start(self, job: Job) -> None:
        if self.log.isEnabledFor(logging.DEBUG):  # per job: no fields built unless shown
            self.log.debug("attempt started", extra=_fields(job))

    def after_error(self, job: Job, error: str, traceback: str) -> None:
        if traceback:
            extra = {**_fields(job), "error": error, "exc": traceback}
            self.log.info("attempt failed", extra=extra)
        else:
            self.log.warning(error, extra=_fields(job))

    def after_outcome(self, outcome: Outcome) -> None:
        job = outcome.job
        if job.status == Status.FAILED:
            self.log.warning("job dead-lettered", extra={**_fields(job), "error": job.last_error})
        elif job.status in TERMINAL and self.log.isEnabledFor(logging.DEBUG):
            self.log.debug(f"job {job.status}", extra=_fields(job))

    def after_cancel(self, job: Job, force: bool) -> None:
        self.log.info("job cancelled", extra={**_fields(job), "force": force})


def _fields(job: Job) -> dict[str, object]:
    return {"job_id": job.id, "type": job.type, "attempt": job.attempts}
