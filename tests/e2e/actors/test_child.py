"""The worker loop, driven over a real socket pair in this process: outcomes, the result
limit, `ctx.enqueue`, `ctx.progress`, and the protocol."""

from __future__ import annotations

import time
from collections.abc import Iterator

import msgspec
import pytest
from goqueue.actors import Context, EnqueueError, Fail, Retry, actor
from goqueue.actors.protocol import (
    ActorInfo,
    Boot,
    BootFailed,
    Dropped,
    EnqueueReply,
    EnqueueRequest,
    Extend,
    Go,
    JobDone,
    JobFailed,
    Progress,
    Ready,
    Refusal,
    RunJob,
    RunJobs,
    Shutdown,
    Started,
    SupervisorCodec,
    Withdraw,
    WorkerCodec,
)

from tests.e2e.actors.harness import Harness

pytestmark = pytest.mark.timeout(20)


@actor("ok")
def ok(payload, ctx: Context):
    return {"got": payload, "attempt": ctx.attempt, "type": ctx.type}


@actor("later")
def later(payload, ctx):
    raise Retry("busy", delay=7)


@actor("never")
def never(payload, ctx):
    raise Fail("bad input")


@actor("boom")
def boom(payload, ctx):
    raise KeyError("missing")


@actor("unjson")
def unjson(payload, ctx):
    return object()


@actor("async_ok")
async def async_ok(payload, ctx):
    return payload * 2


@actor("sized")
def sized(payload, ctx):
    return "x" * payload


@actor("spawner")
def spawner(payload, ctx: Context):
    try:
        return {"id": ctx.enqueue("child", {"n": 1}, priority=9, queue="q2")}
    except EnqueueError as exc:
        return {"refusal": exc.refusal, "error": str(exc), "existing": exc.existing_id}


@actor("misuse")
def misuse(payload, ctx: Context):
    return ctx.enqueue("child", None, type="other")


@actor("chatty")
def chatty(payload, ctx: Context):
    for step in range(101):
        ctx.progress(step / 100)
    time.sleep(0.5)
    return "done"


@actor("bad_progress")
def bad_progress(payload, ctx: Context):
    seen = []
    for value in (1.5, -0.1, float("nan"), "half", True, [0.5], {"blob": "x" * 5000}):
        try:
            ctx.progress(value)
            seen.append("accepted")
        except (TypeError, ValueError) as exc:
            seen.append(type(exc).__name__)
    return seen


@pytest.fixture
def harness() -> Iterator[Harness]:
    made = Harness(
        ok, later, never, boom, unjson, async_ok, spawner, misuse, chatty, bad_progress, sized,
        max_result_bytes=1000,
    )  # fmt: skip
    yield made
    made.close()


def run(harness: Harness, job_type: str, payload: object = None) -> JobDone | JobFailed:
    harness.send(RunJobs([RunJob("j1", job_type, 3, "q", msgspec.json.encode(payload))]))
    message = harness.recv()
    assert isinstance(message, JobDone | JobFailed), message
    return message


def test_success_carries_the_json_result_and_context(harness: Harness) -> None:
    done = run(harness, "ok", [1, "x"])
    assert isinstance(done, JobDone)
    assert msgspec.json.decode(done.result) == {"got": [1, "x"], "attempt": 3, "type": "ok"}
    assert done.rss_kb > 0


def test_async_handlers_run(harness: Harness) -> None:
    done = run(harness, "async_ok", 21)
    assert isinstance(done, JobDone) and msgspec.json.decode(done.result) == 42


def test_retry_fail_and_exceptions_map_to_failures(harness: Harness) -> None:
    retry = run(harness, "later")
    assert isinstance(retry, JobFailed) and retry.retry and retry.delay == 7
    fail = run(harness, "never")
    assert isinstance(fail, JobFailed) and not fail.retry and fail.error == "Fail: bad input"
    crash = run(harness, "boom")
    assert isinstance(crash, JobFailed) and crash.retry
    assert crash.error == "KeyError: 'missing'" and "Traceback" in crash.traceback


def test_a_result_that_is_not_json_fails_without_retry(harness: Harness) -> None:
    failed = run(harness, "unjson")
    assert isinstance(failed, JobFailed) and not failed.retry
    assert failed.error.startswith("result is not JSON")


def test_a_result_over_the_limit_fails_without_retry(harness: Harness) -> None:
    assert isinstance(run(harness, "sized", 998), JobDone)  # 1000 bytes with the quotes
    failed = run(harness, "sized", 999)
    assert isinstance(failed, JobFailed) and not failed.retry
    assert failed.error == "result is 1001 bytes, over the limit of 1000"


def test_an_unknown_type_fails_without_retry(harness: Harness) -> None:
    failed = run(harness, "nope")
    assert isinstance(failed, JobFailed) and not failed.retry and "no actor named" in failed.error


def test_ctx_enqueue_asks_the_supervisor_and_returns_the_new_id(harness: Harness) -> None:
    harness.send(RunJobs([RunJob("parent-1", "spawner", 1, "q", b"null")]))
    request = harness.recv()
    assert isinstance(request, EnqueueRequest) and request.job_id == "parent-1"
    spec = msgspec.json.decode(request.spec)
    assert spec == {"type": "child", "payload": {"n": 1}, "priority": 9, "queue": "q2"}
    harness.send(EnqueueReply(request.request_id, job_id="child-7"))
    done = harness.recv()
    assert isinstance(done, JobDone) and msgspec.json.decode(done.result) == {"id": "child-7"}


def test_a_refused_ctx_enqueue_raises_enqueue_error_in_the_handler(harness: Harness) -> None:
    harness.send(RunJobs([RunJob("parent-1", "spawner", 1, "q", b"null")]))
    request = harness.recv()
    assert isinstance(request, EnqueueRequest)
    refusal = EnqueueReply(
        request.request_id,
        refusal=Refusal.DUPLICATE,
        error="duplicate of job abc",
        existing_id="abc",
    )
    harness.send(refusal)
    done = harness.recv()
    assert isinstance(done, JobDone)
    assert msgspec.json.decode(done.result) == {
        "refusal": "duplicate",
        "error": "duplicate of job abc",
        "existing": "abc",
    }


def test_ctx_enqueue_takes_the_type_positionally_only(harness: Harness) -> None:
    failed = run(harness, "misuse")
    assert isinstance(failed, JobFailed) and failed.error.startswith("TypeError: ctx.enqueue")


def test_progress_is_throttled_and_the_last_value_arrives(harness: Harness) -> None:
    harness.send(RunJobs([RunJob("j1", "chatty", 1, "q", b"null")]))
    _done, before = harness.recv_until(JobDone)
    reports = [msgspec.json.decode(m.value) for m in before if isinstance(m, Progress)]
    assert reports and reports[-1] == 1.0  # the last value wins
    assert len(reports) <= 3  # 101 calls within a few ms, then 0.5 s of quiet
    assert reports == sorted(reports)
    assert all(isinstance(m, Progress) and m.job_id == "j1" for m in before)


def test_progress_values_are_checked_in_the_handler(harness: Harness) -> None:
    done = run(harness, "bad_progress")
    assert isinstance(done, JobDone)
    assert msgspec.json.decode(done.result) == [
        "ValueError",  # 1.5
        "ValueError",  # -0.1
        "ValueError",  # nan
        "TypeError",  # a string
        "TypeError",  # a boolean
        "TypeError",  # a list
        "ValueError",  # over 4 KiB
    ]


def test_a_context_outside_a_worker_has_no_line_to_a_supervisor() -> None:
    ctx = Context("j", 1, "t", "q")
    with pytest.raises(RuntimeError, match="only inside a worker"):
        ctx.progress(0.5)
    with pytest.raises(RuntimeError, match="only inside a worker"):
        ctx.enqueue("t")


def test_protocol_round_trips_every_message() -> None:
    sup, wrk = SupervisorCodec(), WorkerCodec()
    for message in (
        Boot(["m"], ["/p"], 10),
        RunJobs([RunJob("id", "t", 1, "q", b"{}", 2.5), RunJob("i2", "t", 1, "q", b"1", go=False)]),
        Go(["i2"]),
        Withdraw(["i2"]),
        Extend(1.5),
        Shutdown(),
        EnqueueReply(3, refusal=Refusal.INVALID, error="no"),
    ):
        assert wrk.decode(sup.encode(message)) == message
    for message in (
        Ready(1, [ActorInfo("a", 1.0, 2, 3)]),
        BootFailed("e", "tb", "m", "f.py:3"),
        JobDone("id", b"1", 0.5, 10),
        JobFailed("id", "e", 0.1),
        Started("id"),
        Dropped(["i2"]),
        Progress("id", b"0.5"),
        EnqueueRequest(3, "id", b"{}"),
    ):
        assert sup.decode(wrk.encode(message)) == message
