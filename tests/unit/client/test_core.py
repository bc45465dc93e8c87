"""The client's calls and answers without any I/O: what is sent, how answers and
refusals are read, which failures may be retried, and the job checks done before
anything is sent."""

from __future__ import annotations

import random
from datetime import UTC, datetime

import msgspec
import pytest
from goqueue.client import calls, core
from goqueue.client.errors import (
    BadRequest,
    Conflict,
    ConnectionFailed,
    IdempotencyMismatch,
    InvalidJob,
    JobCancelled,
    JobFailed,
    NotFound,
    OutcomeUnknown,
    PayloadTooLarge,
    RequestError,
    Unauthorized,
    Unavailable,
    UnexpectedAnswer,
)
from goqueue.supervisor.common.backoff import backoff

from tests.e2e.api.test_client_cli import job as job_json

pytestmark = pytest.mark.timeout(10)


def test_endpoint_keeps_a_path_prefix_and_refuses_what_is_not_a_url() -> None:
    plain = calls.Endpoint.parse("http://127.0.0.1:9000/")
    assert (plain.scheme, plain.host, plain.port, plain.path) == ("http", "127.0.0.1", 9000, "")
    behind = calls.Endpoint.parse("https://[::1]/goqueue/")
    assert (behind.host, behind.port, behind.path) == ("::1", 443, "/goqueue")
    for bad in ("127.0.0.1:8080", "ftp://127.0.0.1", "http://", "http://127.0.0.1:99999"):
        with pytest.raises(ValueError, match="invalid URL"):
            calls.Endpoint.parse(bad)


def test_url_and_key_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("GOQUEUE_URL", "GOQUEUE_API_KEY", "API_KEY"):
        monkeypatch.delenv(name, raising=False)
    assert calls.url_from(None) == "http://127.0.0.1:8080"
    assert calls.key_from(None) is None
    monkeypatch.setenv("GOQUEUE_URL", "http://127.0.0.1:1234")
    monkeypatch.setenv("API_KEY", "plain")
    assert calls.url_from(None) == "http://127.0.0.1:1234"
    assert calls.key_from(None) == "plain"
    monkeypatch.setenv("GOQUEUE_API_KEY", "prefixed")
    assert calls.key_from(None) == "prefixed"
    assert calls.key_from("given") == "given"


def test_a_job_is_checked_as_the_node_checks_it() -> None:
    spec, body = core.job_request("email", {"to": "a"}, {"priority": 9, "queue": "mail"})
    assert (spec.type, spec.priority, spec.queue) == ("email", 9, "mail")
    assert msgspec.json.decode(body) == {
        "type": "email",
        "payload": {"to": "a"},
        "queue": "mail",
        "priority": 9,
    }
    with pytest.raises(InvalidJob) as out_of_range:
        core.job_request("email", None, {"priority": 11})
    assert out_of_range.value.field == "priority" and out_of_range.value.status == 400
    with pytest.raises(InvalidJob) as both:
        core.job_request("email", None, {"delay_seconds": 5, "run_at": datetime.now(UTC)})
    assert both.value.field == "delay_seconds"
    with pytest.raises(InvalidJob) as template:
        core.job_request("email", None, {"on_success": {"type": "x y"}})
    assert template.value.field == "on_success.type"
    with pytest.raises(InvalidJob, match="timezone"):  # a naive time is refused, not guessed
        core.job_request("email", None, {"run_at": datetime(2030, 1, 1)})
    with pytest.raises(TypeError, match="priorty"):
        core.job_request("email", None, {"priorty": 1})


def test_enqueue_carries_its_key_and_reports_a_repeat_of_its_own_key_as_created() -> None:
    raw = msgspec.json.encode(job_json())
    mine = core.enqueue(b"{}", "k1", made_key=True, strict=True)
    assert mine.headers == {"Idempotency-Key": "k1"} and mine.safe and mine.path == "/jobs"
    assert mine.read(200, raw).created  # our own earlier attempt made it
    given = core.enqueue(b"{}", "k2", made_key=False, strict=False)
    assert given.path == "/jobs?strict=false"
    assert not given.read(200, raw).created and given.read(201, raw).created


@pytest.mark.parametrize(
    ("status", "cls"),
    [
        (400, BadRequest),
        (401, Unauthorized),
        (404, NotFound),
        (409, Conflict),
        (413, PayloadTooLarge),
        (422, IdempotencyMismatch),
        (503, Unavailable),
        (504, OutcomeUnknown),
    ],
)
def test_each_refusal_has_its_class(status: int, cls: type[RequestError]) -> None:
    body = msgspec.json.encode({"error": "no", "details": {"field": "type"}})
    error = calls.refusal(status, body)
    assert type(error) is cls and error.status == status
    assert str(error) == "no" and error.field == "type"


def test_refusals_carry_the_existing_job_and_retry_after() -> None:
    body = b'{"error": "duplicate", "details": {"existing_id": "abc"}, "existing_id": "abc"}'
    conflict = calls.refusal(409, body)
    assert isinstance(conflict, Conflict) and conflict.existing_id == "abc"
    mismatch = calls.refusal(422, b'{"error": "reused", "details": {"existing_id": "j"}}')
    assert isinstance(mismatch, IdempotencyMismatch) and mismatch.existing_id == "j"
    full = calls.refusal(503, b'{"error": "full"}', "5")
    assert isinstance(full, Unavailable) and full.retry_after == 5.0
    odd = calls.refusal(418, b"<html>teapot</html>")
    assert type(odd) is RequestError and odd.status == 418 and "teapot" in str(odd)


def test_an_answer_that_is_not_the_api_is_unexpected() -> None:
    call = core.get("00000000-0000-4000-8000-000000000000")
    with pytest.raises(UnexpectedAnswer):
        calls.answer(call, 200, b'{"id": 1}', None)
    with pytest.raises(NotFound):
        calls.answer(call, 404, b'{"error": "job not found"}', None)


def test_only_what_is_safe_to_send_twice_is_retried() -> None:
    enqueue = core.enqueue(b"{}", "k", made_key=True, strict=True)
    cancel = core.cancel("j", force=False)
    refused = ConnectionFailed("refused", sent=False)
    dropped = ConnectionFailed("dropped", sent=True)
    slow = ConnectionFailed("slow", sent=True, timed_out=True)
    busy = Unavailable("busy")
    assert calls.may_retry(enqueue, dropped) and calls.may_retry(enqueue, busy)
    assert calls.may_retry(cancel, refused)  # never reached the node
    assert not calls.may_retry(cancel, dropped) and not calls.may_retry(cancel, busy)
    assert not calls.may_retry(enqueue, slow)  # the caller's timeout is a bound
    assert not calls.may_retry(enqueue, NotFound("gone"))
    assert not calls.may_retry(core.batch([b"{}"], strict=True), busy)  # no key on batches
    assert calls.may_retry(core.set_paused("q", True), busy)


def test_an_unknown_outcome_is_retried_only_where_a_repeat_cannot_do_it_twice() -> None:
    unknown = OutcomeUnknown("the outcome is unknown")
    keyed = core.enqueue(b"{}", "k", made_key=True, strict=True)
    assert keyed.headers["Idempotency-Key"] == "k"
    assert calls.may_retry(keyed, unknown)  # sent again with the same key: found, not redone
    assert not calls.may_retry(core.cancel("j", force=False), unknown)
    assert not calls.may_retry(core.batch([b"{}"], strict=True), unknown)  # no key on batches


def test_retries_wait_the_projects_backoff_or_retry_after_within_the_cap() -> None:
    retries = calls.Retries(attempts=5, base=0.2, cap=2.0, rng=random.Random(7))
    expected = backoff(3, 0.2, 2.0, random.Random(7))
    assert retries.delay(3, ConnectionFailed("x", sent=False)) == expected
    assert calls.Retries(base=0.2, cap=2.0).delay(1, Unavailable("x", retry_after=5)) == 2.0
    assert 0.15 <= calls.Retries(base=0.2, cap=2.0).delay(1, Unavailable("x")) <= 0.25


def test_a_batch_answer_becomes_jobs_and_errors_in_order() -> None:
    answer = {
        "results": [
            {"status": 201, "job": job_json()},
            {"status": 409, "error": "duplicate", "existing_id": "e1"},
            {"status": 400, "error": "unknown type", "details": {"field": "jobs[2].type"}},
        ]
    }
    call = core.batch([b'{"type":"a"}', b'{"type":"b"}'], strict=True)
    assert call.body == b'{"jobs":[{"type":"a"},{"type":"b"}]}' and not call.safe
    job, duplicate, bad = call.read(200, msgspec.json.encode(answer))
    assert job.id == job_json()["id"] and job.payload == {"to": "a@example.com"}
    assert isinstance(duplicate, Conflict) and duplicate.existing_id == "e1"
    assert isinstance(bad, BadRequest) and bad.field == "jobs[2].type"


def test_paths_quote_ids_and_queue_names() -> None:
    assert core.get("../stats").path == "/jobs/..%2Fstats"
    assert core.set_paused("a/b", True).path == "/queues/a%2Fb/pause"
    assert core.get("j", wait=2.5).path == "/jobs/j?wait=2.500"
    assert core.get("j", wait=2.5).wait == 2.5


def test_outcome_of_a_finished_job() -> None:
    decode = msgspec.json.Decoder(core.JobOut).decode
    done = decode(msgspec.json.encode(job_json(status="done", result=[1])))
    assert core.outcome(done).result == [1]
    failed = decode(msgspec.json.encode(job_json(status="failed", attempts=4, last_error="x")))
    with pytest.raises(JobFailed) as info:
        core.outcome(failed)
    assert (info.value.error, info.value.attempts) == ("x", 4)
    with pytest.raises(JobCancelled):
        core.outcome(decode(msgspec.json.encode(job_json(status="cancelled"))))
