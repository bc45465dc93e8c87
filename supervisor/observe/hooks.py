"""The hook that logs what happens to jobs (faults of the machinery are logged where they
happen; the counters are `Metrics`' own hook methods)."""

from __future__ import annotations

import logging

from goqueue.supervisor.common.enums import TERMINAL, Status
from goqueue.supervisor.common.hooks import Hook
from goqueue.supervisor.common.jobs import Job, Outcome


class LogHook(Hook):
    """The log lines about jobs at info and above: attempts that failed, jobs dead-lettered
    and cancelled. A job with no error has no such line, so its outcome costs no call
    (`needs`). `job_logs` gives the debug variant when debug lines are shown."""

    needs: str | None = "last_error"  # every failed job has one

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self.log = logger or logging.getLogger("goqueue.jobs")

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

    def after_cancel(self, job: Job, force: bool) -> None:
        self.log.info("job cancelled", extra={**_fields(job), "force": force})


class DebugLogHook(LogHook):
    """`LogHook`, with a debug line for every attempt started and every job finished."""

    needs = None

    def after_start(self, job: Job) -> None:
        self.log.debug("attempt started", extra=_fields(job))

    def after_outcome(self, outcome: Outcome) -> None:
        super().after_outcome(outcome)
        job = outcome.job
        if job.status in TERMINAL and job.status != Status.FAILED:
            self.log.debug(f"job {job.status}", extra=_fields(job))


def job_logs(logger: logging.Logger | None = None) -> LogHook:
    """The log hook for the level the node logs at (set once, at start)."""
    hook = LogHook(logger)
    return DebugLogHook(logger) if hook.log.isEnabledFor(logging.DEBUG) else hook


def _fields(job: Job) -> dict[str, object]:
    return {"job_id": job.id, "type": job.type, "attempt": job.attempts}
