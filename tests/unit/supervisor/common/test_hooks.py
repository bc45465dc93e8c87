"""The after-outcome hooks: the fan-out's order and isolation, and what each concrete hook
does with an outcome (metrics counted, lines logged, webhooks submitted)."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

import pytest
from goqueue.supervisor.common.deliveries import event_of
from goqueue.supervisor.common.enums import AttemptOutcome, Status
from goqueue.supervisor.common.hooks import Hook
from goqueue.supervisor.common.jobs import Job, JobSpec, Outcome
from goqueue.supervisor.dispatch.outcomes import Hooks
from goqueue.supervisor.observe.hooks import DebugLogHook, LogHook, job_logs
from goqueue.supervisor.webhooks.hook import WebhookHook

pytestmark = pytest.mark.timeout(10)


def job(status: Status, *, webhook_url: str | None = None, error: str | None = None) -> Job:
    spec = JobSpec(type="email", webhook_url=webhook_url)
    made = Job.from_spec(spec, now=datetime.now(UTC), max_retries=3)
    made.status, made.attempts, made.last_error = status, 2, error
    return made


class Calls(Hook):
    def __init__(self, name: str, log: list[str]) -> None:
        self.name, self.log = name, log

    def after_enqueue(self, job: Job) -> None:
        self.log.append(f"{self.name}.after_enqueue")

    def after_cancel(self, job: Job, force: bool) -> None:
        self.log.append(f"{self.name}.after_cancel")


class Raises(Hook):
    def after_enqueue(self, job: Job) -> None:
        raise ValueError("broken hook")


def test_hooks_run_in_order_and_one_that_raises_is_logged_not_fatal(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log: list[str] = []
    hooks = Hooks([Calls("one", log), Raises(), Calls("two", log)])
    with caplog.at_level(logging.ERROR, logger="goqueue.hooks"):
        hooks.after_enqueue(job(Status.PENDING))
    hooks.after_cancel(job(Status.CANCELLED), force=False)
    hooks.after_attempt("email", AttemptOutcome.SUCCEEDED, 0.1)  # no hook cares: a no-op
    assert log == ["one.after_enqueue", "two.after_enqueue", "one.after_cancel", "two.after_cancel"]
    [record] = caplog.records
    assert record.getMessage() == "hook failed" and record.__dict__["hook"] == "Raises"
    assert record.exc_info is not None


class FakeWebhooks:
    def __init__(self) -> None:
        self.told: list[Job] = []

    def notify(self, job: Job) -> None:
        self.told.append(job)


def test_webhook_hook_tells_the_webhooks_of_outcomes_and_cancels() -> None:
    webhooks = FakeWebhooks()
    hook = WebhookHook(webhooks)  # type: ignore[arg-type]
    url = "http://127.0.0.1:9/hook"
    pending = job(Status.PENDING, webhook_url=url)
    done = job(Status.DONE, webhook_url=url)
    cancelled = job(Status.CANCELLED, webhook_url=url)
    hook.after_outcome(Outcome(pending, []))
    hook.after_outcome(Outcome(done, []))
    hook.after_cancel(cancelled, force=False)
    # which of them fire (terminal, with a URL) is the webhooks' rule: `event_of`
    assert webhooks.told == [pending, done, cancelled]


def test_outcomes_reach_a_hook_only_with_the_field_it_needs_and_while_it_listens() -> None:
    webhooks = FakeWebhooks()
    waiter = Calls("waiter", [])
    waiter.quiet = True  # nobody waits
    hooks = Hooks([WebhookHook(webhooks), waiter])  # type: ignore[arg-type]
    plain, hooked = job(Status.DONE), job(Status.DONE, webhook_url="http://127.0.0.1:9/h")
    for made in (plain, hooked):
        hooks.after_outcome(Outcome(made, []))
    assert webhooks.told == [hooked]  # no call for a job without a URL
    for made in (plain, hooked):
        hooks.after_cancel(made, force=False)
    assert webhooks.told == [hooked, plain, hooked]  # every cancel: an operator's, rare
    assert waiter.log == []
    waiter.quiet = False
    hooks.after_cancel(plain, force=False)
    assert waiter.log == ["waiter.after_cancel"]


@pytest.mark.parametrize(
    ("status", "url", "event"),
    [
        (Status.DONE, "http://h/x", "job.done"),
        (Status.FAILED, "http://h/x", "job.failed"),
        (Status.CANCELLED, "http://h/x", "job.cancelled"),
        (Status.PENDING, "http://h/x", None),
        (Status.RUNNING, "http://h/x", None),
        (Status.DONE, None, None),
    ],
)
def test_terminal_jobs_with_a_url_fire_their_event(
    status: Status, url: str | None, event: str | None
) -> None:
    assert event_of(job(status, webhook_url=url)) == event


def test_log_hook_lines(caplog: pytest.LogCaptureFixture) -> None:
    hook = LogHook()
    with caplog.at_level(logging.DEBUG, logger="goqueue.jobs"):
        hook.after_error(job(Status.RUNNING), "ValueError: bad", "Traceback (most recent...")
        hook.after_error(job(Status.RUNNING), "worker 7 killed by SIGKILL while running", "")
        hook.after_outcome(Outcome(job(Status.FAILED, error="boom"), []))
        hook.after_outcome(Outcome(job(Status.PENDING), []))  # a retry: nothing to say
    lines = [(r.levelname, r.getMessage(), r.__dict__.get("error")) for r in caplog.records]
    assert lines == [
        ("INFO", "attempt failed", "ValueError: bad"),
        ("WARNING", "worker 7 killed by SIGKILL while running", None),
        ("WARNING", "job dead-lettered", "boom"),
    ]
    assert all(r.__dict__["type"] == "email" and r.__dict__["attempt"] == 2 for r in caplog.records)


def test_the_log_hook_hears_only_the_jobs_it_has_a_line_for(
    caplog: pytest.LogCaptureFixture,
) -> None:
    logger = logging.getLogger("goqueue.jobs")
    with caplog.at_level(logging.INFO, logger="goqueue.jobs"):
        quiet = job_logs(logger)
        assert type(quiet) is LogHook
        hooks = Hooks([quiet])
        assert hooks._start == []  # no debug line: a start costs it no call
        hooks.after_outcome(Outcome(job(Status.DONE), []))  # no error: not even called
        hooks.after_outcome(Outcome(job(Status.FAILED, error="boom"), []))
        hooks.after_cancel(job(Status.CANCELLED), force=False)  # every cancel is a line
    assert [r.getMessage() for r in caplog.records] == ["job dead-lettered", "job cancelled"]
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="goqueue.jobs"):
        hooks = Hooks([job_logs(logger)])
        assert isinstance(hooks.hooks[0], DebugLogHook)
        hooks.after_start(job(Status.RUNNING))
        hooks.after_outcome(Outcome(job(Status.DONE), []))
        hooks.after_outcome(Outcome(job(Status.FAILED, error="boom"), []))
    assert [r.getMessage() for r in caplog.records] == [
        "attempt started",
        "job done",
        "job dead-lettered",
    ]
