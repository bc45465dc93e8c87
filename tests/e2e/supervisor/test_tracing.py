"""`--otel`: a real node exports OpenTelemetry spans over OTLP/HTTP to a receiver on
loopback; an enqueue's PRODUCER span and each attempt's CONSUMER span share one trace."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, free_port, postgres_dsn, stop_node, wait_for
from tests.e2e.otlp import Receiver, Span, tree

pytestmark = pytest.mark.timeout(90)

FAST_EXPORT = {"OTEL_BSP_SCHEDULE_DELAY": "100", "OTEL_SERVICE_NAME": "goqueue-test"}


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def otel_env(endpoint: str) -> dict[str, str]:
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, **FAST_EXPORT}


def traceparent() -> tuple[str, str, str]:
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


def spans_of(receiver: Receiver, trace_id: str, at_least: int, what: str) -> list[Span]:
    """The spans of `trace_id` once at least `at_least` have arrived."""

    def enough() -> list[Span] | None:
        spans = receiver.of_trace(trace_id)
        return spans if len(spans) >= at_least else None

    return wait_for(enough, what=what)


def one(spans: list[Span], name: str) -> Span:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, [s.name for s in spans]
    return found[0]


def test_an_enqueue_and_its_attempt_are_one_trace(make_node: Any, receiver: Receiver) -> None:
    node = make_node("--otel", env=otel_env(receiver.url))
    header, trace_id, caller = traceparent()
    resp = node.post(
        "/jobs", {"type": "noop", "payload": 7, "queue": "default"}, headers={"traceparent": header}
    )
    assert resp.status == 201, resp
    job_id = resp.body["id"]
    node.wait_status(job_id, "done")
    spans = spans_of(receiver, trace_id, 2, "the enqueue's and the attempt's spans")
    send, process = one(spans, "send default"), one(spans, "process noop")
    print("\n" + tree(spans))
    assert send.kind == "producer" and send.parent_id == caller
    assert send.attributes["messaging.system"] == "goqueue"
    assert send.attributes["messaging.destination.name"] == "default"
    assert process.kind == "consumer" and process.parent_id == send.span_id
    assert process.attributes == {
        "messaging.system": "goqueue",
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": "default",
        "messaging.message.id": job_id,
        "goqueue.job.type": "noop",
        "goqueue.attempt": 1,
        "goqueue.node": process.attributes["goqueue.node"],
    }
    assert process.attributes["goqueue.node"] and process.status == "ok"
    assert process.service["service.name"] == "goqueue-test"


def test_a_failed_attempt_has_an_error_status_and_its_logs_the_trace(
    make_node: Any, receiver: Receiver
) -> None:
    node = make_node("--otel", env=otel_env(receiver.url))
    header, trace_id, _ = traceparent()
    resp = node.post(
        "/jobs",
        {"type": "chatty", "payload": {"fail_first": True}},
        headers={"traceparent": header},
    )
    job_id = resp.body["id"]
    node.wait_status(job_id, "done")
    spans = spans_of(receiver, trace_id, 3, "the enqueue and both attempts")
    print("\n" + tree(spans))
    attempts = sorted(
        (s for s in spans if s.name == "process chatty"),
        key=lambda s: s.attributes["goqueue.attempt"],
    )
    assert [s.status for s in attempts] == ["error", "ok"]
    assert attempts[0].links == [] and attempts[1].links == [attempts[0].span_id]
    assert "first attempt fails" in attempts[0].status_message
    assert attempts[0].events == ["exception"]
    # the handler's log line names the attempt's span
    logged = wait_for(
        lambda: [
            line for line in node.logs().splitlines() if job_id in line and "chatty says" in line
        ],
        what="the handler's log lines",
    )
    assert f'"trace_id":"{trace_id}"' in logged[0]
    assert f'"span_id":"{attempts[0].span_id}"' in logged[0]


def test_an_unreachable_or_silent_collector_never_slows_jobs(make_node: Any) -> None:
    """A collector that accepts connections but never answers: exports hang until their
    own timeout, in the exporter's thread; jobs run at their usual pace."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(1000)  # never accepted: every export waits out its timeout
    try:
        endpoint = f"http://127.0.0.1:{silent.getsockname()[1]}"
        traced = make_node("--otel", env=otel_env(endpoint))
        plain = make_node()

        def run(node: Any) -> float:
            started = time.monotonic()
            jobs = [node.enqueue(type="noop", payload=i) for i in range(150)]
            for job in jobs:
                node.wait_status(job["id"], "done", timeout=30)
            return time.monotonic() - started

        run(traced), run(plain)  # warm both
        with_otel, without = run(traced), run(plain)
        assert with_otel < max(3 * without, without + 2.0), (with_otel, without)
    finally:
        silent.close()
    # the collector is gone now (refused): the node still stops at once, its last spans
    # given up on within the flush bound, not retried for the exporter's whole timeout
    started = time.monotonic()
    traced.signal(signal.SIGTERM)
    traced.proc.wait(timeout=15)
    assert time.monotonic() - started < 5.0


def test_otel_without_the_packages_stops_the_node_with_one_line(tmp_path: Path) -> None:
    # a site directory that hides opentelemetry: a module named like it that fails
    hide = tmp_path / "hide"
    (hide / "opentelemetry").mkdir(parents=True)
    (hide / "opentelemetry" / "__init__.py").write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GOQUEUE_")}
    env["PYTHONPATH"] = f"{hide}{os.pathsep}{ROOT / 'tests' / 'fixtures'}"
    cmd = [sys.executable, "-m", "goqueue.api.cli.main", "serve", "--otel", "--port"]
    done = subprocess.run(
        [*cmd, str(free_port()), "--actors", "testactors"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        timeout=30,
    )
    assert done.returncode == 3, done
    lines = done.stderr.decode().strip().splitlines()
    assert len(lines) == 1, lines
    assert "pip install 'goqueue[otel]'" in lines[0] and "opentelemetry-sdk" in lines[0]


def test_a_job_a_handler_enqueues_is_in_the_handlers_trace(
    make_node: Any, receiver: Receiver
) -> None:
    node = make_node("--otel", env=otel_env(receiver.url))
    header, trace_id, _ = traceparent()
    children = [{"type": "noop", "payload": 1}]
    resp = node.post(
        "/jobs",
        {"type": "parent", "payload": {"children": children}},
        headers={"traceparent": header},
    )
    parent = node.wait_status(resp.body["id"], "done")
    node.wait_status(parent["result"][0]["id"], "done")
    spans = spans_of(receiver, trace_id, 4, "parent's and child's enqueues and attempts")
    print("\n" + tree(spans))
    process_parent, process_child = one(spans, "process parent"), one(spans, "process noop")
    sends = {s.span_id: s for s in spans if s.name == "send default"}
    assert len(sends) == 2
    child_send = sends[process_child.parent_id]
    assert child_send.parent_id == process_parent.span_id
    assert child_send.attributes["goqueue.job.parent_id"] == parent["id"]


@pytest.mark.postgres
def test_with_postgresql_the_attempt_joins_the_enqueues_trace(
    make_node: Any, receiver: Receiver
) -> None:
    import uuid

    import psycopg

    dsn, schema = postgres_dsn(), f"gq_otel_{uuid.uuid4().hex[:10]}"
    node = None
    try:
        node = make_node(
            "--otel", "--database-url", dsn, "--database-schema", schema, env=otel_env(receiver.url)
        )
        header, trace_id, _ = traceparent()
        chained = {"type": "noop", "on_success": {"type": "noop", "payload": 2}}
        for body in ({"type": "noop", "payload": 1}, {"type": "noop", "unique_key": "u1"}, chained):
            resp = node.post("/jobs", body, headers={"traceparent": header})
            assert resp.status == 201, resp
            node.wait_status(resp.body["id"], "done")
        batch = node.post(
            "/jobs/batch",
            {"jobs": [{"type": "noop"}, {"type": "noop"}]},
            headers={"traceparent": header},
        )
        assert batch.status in (200, 201, 207), batch
        spans = spans_of(receiver, trace_id, 11, "five enqueues and six attempts")
        print("\n" + tree(spans))
        sends = {s.span_id for s in spans if s.kind == "producer"}
        processes = [s for s in spans if s.kind == "consumer"]
        assert len(sends) == 5 and len(processes) == 6  # the chained job's too
        assert all(p.parent_id in sends for p in processes)
    finally:
        if node is not None:
            stop_node(node)  # before its schema goes
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def test_a_killed_or_crashed_attempt_has_a_span_saying_why(
    make_node: Any, receiver: Receiver, tmp_path: Path
) -> None:
    node = make_node("--otel", env=otel_env(receiver.url))
    header, trace_id, _ = traceparent()
    hung = {"type": "spin", "payload": {"dir": str(tmp_path)}, "timeout_seconds": 1}
    for body in (hung, {"type": "segfault"}):
        resp = node.post("/jobs", body, headers={"traceparent": header})
        node.wait_status(resp.body["id"], "failed", timeout=20)
    spans = spans_of(receiver, trace_id, 4, "two enqueues and two killed attempts")
    print("\n" + tree(spans))
    timed_out, crashed = one(spans, "process spin"), one(spans, "process segfault")
    assert timed_out.status == "error" and timed_out.attributes["goqueue.killed"] == "timeout"
    assert timed_out.status_message == "the attempt was killed: timeout"
    assert (timed_out.end_ns - timed_out.start_ns) / 1e9 >= 0.9  # it ran its second
    assert crashed.status == "error" and crashed.attributes["goqueue.killed"] == "crash"
    sends = {s.span_id for s in spans if s.kind == "producer"}
    assert {timed_out.parent_id, crashed.parent_id} <= sends


def test_a_schedules_tick_is_a_producer_span_its_attempt_joins(
    make_node: Any, receiver: Receiver, tmp_path: Path
) -> None:
    toml = tmp_path / "beat.toml"
    toml.write_text('[[schedules]]\nname = "beat"\ntype = "beat"\nevery_seconds = 1\n')
    node = make_node(
        "--otel", "--actors", "scheduledactors", "--config", str(toml), env=otel_env(receiver.url)
    )

    def a_whole_tick() -> list[Span] | None:
        for send in receiver.named("send default"):
            spans = receiver.of_trace(send.trace_id)
            if any(s.name == "process beat" for s in spans):
                return spans
        return None

    spans = wait_for(a_whole_tick, timeout=20, what="a tick's send and its attempt")
    print("\n" + tree(spans))
    send, process = one(spans, "send default"), one(spans, "process beat")
    assert send.kind == "producer" and send.parent_id == ""  # a tick starts its trace
    assert send.attributes["goqueue.job.type"] == "beat"
    assert process.parent_id == send.span_id
    assert node.get("/schedules").status == 200
