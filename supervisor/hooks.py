"""After-outcome hooks, in the manner of dramatiq's middleware.

The dispatcher and the engine report what happened to jobs through one `Hooks` fan-out;
each concern (metrics, logs, webhooks) is a small `Hook` that overrides the methods it
cares about. Hooks run in list order; one that raises is logged and the others still run.
There are only "after" hooks: should "before" hooks be added, they run in list order and
the "after" ones in reverse, as dramatiq does. Chaining and the audit trail are not hooks:
the store writes them inside the outcome's own transaction.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import msgspec
from goqueue.supervisor.jobs import Job, Outcome
from goqueue.supervisor.metrics import Metrics
from goqueue.supervisor.vocab import TERMINAL, AttemptOutcome, Status
from goqueue.supervisor.webhooks import WebhookSender

log = logging.getLogger("goqueue.hooks")


class Hook:
    """One concern's view of jobs; every method is a no-op until overridden."""

    def after_enqueue(self, job: Job) -> None:
        """A job was stored by a client's request (enqueue or replay), not by chaining."""

    def after_start(self, job: Job) -> None:
        """An attempt of `job` was handed to a worker."""

    def after_attempt(self, job_type: str, outcome: AttemptOutcome, duration: float) -> None:
        """An attempt ended; `duration` in seconds. Attempts ended on purpose (cancel,
        lost lease, shutdown) are not reported."""

    def after_error(self, job: Job, error: str, traceback: str) -> None:
        """An attempt ended in an unexpected error: the handler raised something other
        than Retry or Fail (`traceback` set), or its worker died (timeout or crash)."""

    def after_outcome(self, outcome: Outcome) -> None:
        """An attempt's outcome was recorded: the job is pending again, done or failed."""

    def after_cancel(self, job: Job, force: bool) -> None:
        """A job was cancelled (`force`: it may have been running)."""


class Hooks(Hook):
    """Every hook of a node, called in a fixed order; a hook that raises is logged."""

    def __init__(self, hooks: Sequence[Hook]) -> None:
        self.hooks = tuple(hooks)

    def _each(self, event: str, call: Callable[[Hook], None]) -> None:
        for hook in self.hooks:
            try:
                call(hook)
            except Exception:
                log.exception("hook failed", extra={"hook": type(hook).__name__, "event": event})

    def after_enqueue(self, job: Job) -> None:
        self._each("after_enqueue", lambda hook: hook.after_enqueue(job))

    def after_start(self, job: Job) -> None:
        self._each("after_start", lambda hook: hook.after_start(job))

    def after_attempt(self, job_type: str, outcome: AttemptOutcome, duration: float) -> None:
        self._each("after_attempt", lambda hook: hook.after_attempt(job_type, outcome, duration))

    def after_error(self, job: Job, error: str, traceback: str) -> None:
        self._each("after_error", lambda hook: hook.after_error(job, error, traceback))

    def after_outcome(self, outcome: Outcome) -> None:
        self._each("after_outcome", lambda hook: hook.after_outcome(outcome))

    def after_cancel(self, job: Job, force: bool) -> None:
        self._each("after_cancel", lambda hook: hook.after_cancel(job, force))


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
        elif job.status in TERMINAL:
            self.log.debug(f"job {job.status}", extra=_fields(job))

    def after_cancel(self, job: Job, force: bool) -> None:
        self.log.info("job cancelled", extra={**_fields(job), "force": force})


class WebhookHook(Hook):
    """POSTs a finished job to its `webhook_url` (delivery is the sender's business)."""

    def __init__(self, sender: WebhookSender) -> None:
        self.sender = sender
        self._encode = msgspec.json.Encoder().encode

    def after_outcome(self, outcome: Outcome) -> None:
        self._notify(outcome.job)

    def after_cancel(self, job: Job, force: bool) -> None:
        self._notify(job)

    def _notify(self, job: Job) -> None:
        if job.webhook_url and job.status in TERMINAL:
            self.sender.submit(job.webhook_url, self._encode(job), job_id=job.id)


def _fields(job: Job) -> dict[str, object]:
    return {"job_id": job.id, "type": job.type, "attempt": job.attempts}
