"""The worker loop, driven over a real pipe in this process: outcomes and the protocol."""

from __future__ import annotations

import multiprocessing
import threading

import msgspec
import pytest
from goqueue.actors import Context, Fail, Retry, actor
from goqueue.actors.child import Worker
from goqueue.actors.protocol import (
    JobDone,
    JobFailed,
    Ready,
    RunJob,
    Shutdown,
    SupervisorCodec,
    WorkerCodec,
)
from goqueue.actors.registry import Registry

pytestmark = pytest.mark.timeout(10)


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


def run(job_type: str, payload: object = None) -> JobDone | JobFailed:
    registry = Registry({a.name: a for a in (ok, later, never, boom, unjson, async_ok)})
    ours, theirs = multiprocessing.Pipe()
    worker = Worker(theirs, WorkerCodec(), registry)
    thread = threading.Thread(target=worker.serve)
    thread.start()
    codec = SupervisorCodec()
    ours.send_bytes(codec.encode(RunJob("j1", job_type, 3, "q", msgspec.json.encode(payload))))
    answer = codec.decode(ours.recv_bytes())
    ours.send_bytes(codec.encode(Shutdown()))
    thread.join(5)
    assert not thread.is_alive()
    return answer


def test_success_carries_the_json_result_and_context() -> None:
    done = run("ok", [1, "x"])
    assert isinstance(done, JobDone)
    assert msgspec.json.decode(done.result) == {"got": [1, "x"], "attempt": 3, "type": "ok"}
    assert done.rss_kb > 0


def test_async_handlers_run() -> None:
    done = run("async_ok", 21)
    assert isinstance(done, JobDone) and msgspec.json.decode(done.result) == 42


def test_retry_fail_and_exceptions_map_to_failures() -> None:
    retry = run("later")
    assert isinstance(retry, JobFailed) and retry.retry and retry.delay == 7
    fail = run("never")
    assert isinstance(fail, JobFailed) and not fail.retry and fail.error == "Fail: bad input"
    crash = run("boom")
    assert isinstance(crash, JobFailed) and crash.retry
    assert crash.error == "KeyError: 'missing'" and "Traceback" in crash.traceback


def test_a_result_that_is_not_json_fails_without_retry() -> None:
    failed = run("unjson")
    assert isinstance(failed, JobFailed) and not failed.retry
    assert failed.error.startswith("result is not JSON")


def test_an_unknown_type_fails_without_retry() -> None:
    failed = run("nope")
    assert isinstance(failed, JobFailed) and not failed.retry and "no actor named" in failed.error


def test_protocol_round_trips_every_message() -> None:
    sup, wrk = SupervisorCodec(), WorkerCodec()
    for message in (RunJob("id", "t", 1, "q", b"{}"), Shutdown()):
        assert wrk.decode(sup.encode(message)) == message
    for message in (Ready(1, []), JobDone("id", b"1", 0.5, 10), JobFailed("id", "e", 0.1)):
        assert sup.decode(wrk.encode(message)) == message
