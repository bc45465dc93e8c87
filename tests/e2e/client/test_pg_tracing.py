"""`goqueue.pg.enqueue` in an application that traces: the enqueue is a PRODUCER span of
the application's trace, and the attempt a node with --otel runs joins it."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator

import pytest

from tests.conftest import Node, wait_for
from tests.e2e.client.conftest import Database
from tests.e2e.otlp import Receiver, tree

pytestmark = [pytest.mark.timeout(90), pytest.mark.postgres]

# The application: its own tracer provider exporting to the receiver, one span around
# a transaction that enqueues; prints the job id and its trace id.
APP = """
import sys
import psycopg
import goqueue.pg
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

endpoint, dsn, schema = sys.argv[1:4]
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint + "/v1/traces")))
trace.set_tracer_provider(provider)
with trace.get_tracer("app").start_as_current_span("checkout") as span:
    with psycopg.connect(dsn) as conn:
        job = goqueue.pg.enqueue(conn, "noop", 5, schema=schema)
print(job.id, format(span.get_span_context().trace_id, "032x"))
provider.shutdown()
"""


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def test_a_job_enqueued_in_a_traced_transaction_runs_in_that_trace(
    pg_node: Callable[..., Node], database: Database, receiver: Receiver
) -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_BSP_SCHEDULE_DELAY": "100"}
    node = pg_node("--otel", env=env)
    app = [sys.executable, "-c", APP, receiver.url, database.dsn, database.schema]
    done = subprocess.run(app, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr.decode()
    job_id, trace_id = done.stdout.decode().split()
    node.wait_status(job_id, "done")

    def whole() -> list | None:
        spans = receiver.of_trace(trace_id)
        return spans if len(spans) >= 3 else None

    spans = wait_for(whole, what="the request, the enqueue and the attempt")
    print("\n" + tree(spans))
    by_name = {s.name: s for s in spans}
    checkout, send, process = by_name["checkout"], by_name["send default"], by_name["process noop"]
    assert send.kind == "producer" and send.parent_id == checkout.span_id
    assert process.kind == "consumer" and process.parent_id == send.span_id
    assert process.attributes["messaging.message.id"] == job_id
