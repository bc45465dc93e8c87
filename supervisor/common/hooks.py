"""After-outcome hooks, in the manner of dramatiq's middleware: the `Hook` interface.

Two places report what happened to jobs through one `Hooks` fan-out (in
`dispatch/outcomes.py`, on the outcome path): the engine (jobs enqueued, by a client or
a schedule, and cancelled) and the dispatcher's `Outcomes` (attempts started and ended,
outcomes recorded). Each concern (`observe/metrics.py`'s
`Metrics`, the job logs in `observe/hooks.py`, webhooks in `webhooks/hook.py`,
waiters) is a `Hook` that overrides the methods it cares about. Hooks run in list order;
one that raises is logged and the others still run. There are only "after" hooks: should
"before" hooks be added, they run in list order and the "after" ones in reverse, as
dramatiq does. Chaining and the audit trail are not hooks: the store writes them inside
the outcome's own transaction.
"""

from __future__ import annotations

from goqueue.supervisor.common.enums import AttemptOutcome
from goqueue.supervisor.common.jobs import Job, Outcome


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
