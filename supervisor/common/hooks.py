"""After-outcome hooks, in the manner of dramatiq's middleware: the `Hook` interface
and the `Hooks` fan-out.

Two places report what happened to jobs through one `Hooks` fan-out: the engine (jobs
enqueued, by a client or a schedule, and cancelled) and the dispatcher's `Outcomes`
(attempts started and ended, outcomes recorded). Each concern (`observe/metrics.py`'s
`Metrics`, the job logs in `observe/hooks.py`, webhooks in `webhooks/hook.py`,
waiters) is a `Hook` that overrides the methods it cares about. Hooks run in list order;
one that raises is logged and the others still run. There are only "after" hooks: should
"before" hooks be added, they run in list order and the "after" ones in reverse, as
dramatiq does. Chaining and the audit trail are not hooks: the store writes them inside
the outcome's own transaction.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from goqueue.supervisor.common.enums import AttemptOutcome
from goqueue.supervisor.common.jobs import Job, Outcome

log = logging.getLogger("goqueue.hooks")


class Hook:
    """One concern's view of jobs; every method is a no-op until overridden.

    Outcomes and cancels reach a hook only while it is not `quiet` (one with nothing
    to do for now, such as waiters with nobody waiting). Outcomes reach it only for jobs
    whose field named by `needs` is set (None: every job), so most jobs cost it no call;
    cancels, an operator's and rare, reach it for every job."""

    needs: str | None = None
    quiet = False

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
    """Every hook of a node, called in a fixed order; a hook that raises is logged.

    Each event is fanned out only to the hooks that override its method: the calls sit
    on every job's path, and most hooks care about few events."""

    def __init__(self, hooks: Sequence[Hook]) -> None:
        self.hooks = tuple(hooks)
        hs = self.hooks
        self._enqueue = [h for h in hs if type(h).after_enqueue is not Hook.after_enqueue]
        self._start = [h for h in hs if type(h).after_start is not Hook.after_start]
        self._attempt = [h for h in hs if type(h).after_attempt is not Hook.after_attempt]
        self._error = [h for h in hs if type(h).after_error is not Hook.after_error]
        self._outcome = [h for h in hs if type(h).after_outcome is not Hook.after_outcome]
        self._cancel = [h for h in hs if type(h).after_cancel is not Hook.after_cancel]

    def after_enqueue(self, job: Job) -> None:
        for hook in self._enqueue:
            try:
                hook.after_enqueue(job)
            except Exception:
                _failed(hook, "after_enqueue")

    def after_start(self, job: Job) -> None:
        for hook in self._start:
            try:
                hook.after_start(job)
            except Exception:
                _failed(hook, "after_start")

    def after_attempt(self, job_type: str, outcome: AttemptOutcome, duration: float) -> None:
        for hook in self._attempt:
            try:
                hook.after_attempt(job_type, outcome, duration)
            except Exception:
                _failed(hook, "after_attempt")

    def after_error(self, job: Job, error: str, traceback: str) -> None:
        for hook in self._error:
            try:
                hook.after_error(job, error, traceback)
            except Exception:
                _failed(hook, "after_error")

    def after_outcome(self, outcome: Outcome) -> None:
        job = outcome.job
        for hook in self._outcome:
            if hook.quiet or (hook.needs is not None and not getattr(job, hook.needs)):
                continue
            try:
                hook.after_outcome(outcome)
            except Exception:
                _failed(hook, "after_outcome")

    def after_cancel(self, job: Job, force: bool) -> None:
        for hook in self._cancel:
            if hook.quiet:
                continue
            try:
                hook.after_cancel(job, force)
            except Exception:
                _failed(hook, "after_cancel")


def _failed(hook: Hook, event: str) -> None:
    log.exception("hook failed", extra={"hook": type(hook).__name__, "event": event})
