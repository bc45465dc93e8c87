"""OpenTelemetry in a worker process: one CONSUMER span, `process {type}`, per attempt,
a child of the context the enqueue stored with the job, so enqueue and attempts share
one trace; the handler's own instrumented calls (an HTTP client, a database driver) nest
under it, since it is the current span while the handler runs.

Imported only when the node runs with `--otel` (`Boot.otel`). The worker's provider is
the process's global one, so instrumentation libraries in the handler find it; spans
leave through a BatchSpanProcessor (its own thread, a bounded buffer that drops when
full), so a slow or unreachable collector never holds up a job.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from goqueue.actors.protocol import JobDone, JobFailed, RunJob
from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.trace import Link, Span, SpanContext, SpanKind, Status, StatusCode, TraceFlags

SYSTEM = "goqueue"
SERVICE = "goqueue"
FLUSH_MS = 1000  # what a stopping worker gives the exporter, at most


def attempt_span_id(job_id: str, attempt: int) -> int:
    """The span id of attempt `attempt` of a job: derived from both, so the next attempt,
    in another worker, can link to it without anything more being stored."""
    digest = hashlib.blake2b(f"{job_id}:{attempt}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") or 1


class AttemptIds(RandomIdGenerator):
    """Random ids, except the next span started after `attempt_next`: the attempt's own."""

    def __init__(self) -> None:
        self._next: int | None = None

    def attempt_next(self, job_id: str, attempt: int) -> None:
        self._next = attempt_span_id(job_id, attempt)

    def generate_span_id(self) -> int:
        chosen, self._next = self._next, None
        return chosen if chosen is not None else super().generate_span_id()


def previous_attempt(parent: Context | None, job_id: str, attempt: int) -> list[Link]:
    """A link to the attempt before this one, in the same trace (none for the first, or
    without a stored context: its trace is not known)."""
    if parent is None or attempt <= 1:
        return []
    trace_id = trace.get_current_span(parent).get_span_context().trace_id
    before = SpanContext(
        trace_id, attempt_span_id(job_id, attempt - 1), True, TraceFlags(TraceFlags.SAMPLED)
    )
    return [Link(before, {"goqueue.attempt": attempt - 1})]


def resource(node: str, extra: dict[str, str | int] | None = None) -> Resource:
    """Who emits the spans: the node, and service `goqueue` unless OTEL_SERVICE_NAME or
    OTEL_RESOURCE_ATTRIBUTES name another."""
    made = Resource.create({"service.instance.id": node, **(extra or {})})
    if str(made.attributes.get("service.name", "")).startswith("unknown_service"):
        made = made.merge(Resource({"service.name": SERVICE}))
    return made


class AttemptTracer:
    """Spans of the attempts this worker runs."""

    def __init__(self, node: str) -> None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        self.ids = AttemptIds()
        self.provider = TracerProvider(
            resource=resource(node, {"process.pid": os.getpid()}), id_generator=self.ids
        )
        self.exporter = OTLPSpanExporter()
        self.provider.add_span_processor(BatchSpanProcessor(self.exporter))
        trace.set_tracer_provider(self.provider)  # for the handler's instrumented calls
        self.tracer = self.provider.get_tracer("goqueue")
        self.node = node

    @contextmanager
    def attempt(self, job: RunJob) -> Iterator[Span]:
        """The span of one attempt, current while it runs."""
        parent = propagate.extract(job.trace_context) if job.trace_context else None
        attributes: dict[str, str | int] = {
            "messaging.system": SYSTEM,
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            "messaging.destination.name": job.queue,
            "messaging.message.id": job.job_id,
            "goqueue.job.type": job.type,
            "goqueue.attempt": job.attempt,
            "goqueue.node": self.node,
        }
        self.ids.attempt_next(job.job_id, job.attempt)
        with self.tracer.start_as_current_span(
            f"process {job.type}",
            context=parent,
            kind=SpanKind.CONSUMER,
            attributes=attributes,
            links=previous_attempt(parent, job.job_id, job.attempt),
            record_exception=False,  # the worker catches what a handler raises
            set_status_on_exception=False,
        ) as span:
            yield span

    def close(self) -> None:
        """Export what is buffered, within FLUSH_MS (a stopping worker must not hang)."""
        stop_exporting(self.provider, self.exporter, FLUSH_MS)


def stop_exporting(provider: TracerProvider, exporter: SpanExporter, flush_ms: int) -> None:
    """Send what is buffered for at most `flush_ms`, then stop. The flush runs on a thread
    of its own, waited for that long at most: an export retrying against an unreachable
    collector holds the SDK's flush for the exporter's whole timeout (10 s by default).
    Then the exporter stops first, which ends such a retry at once, and the provider."""
    flushing = threading.Thread(target=provider.force_flush, args=(flush_ms,), daemon=True)
    flushing.start()
    flushing.join(flush_ms / 1000)
    exporter.shutdown()
    provider.shutdown()


def ended(span: Span, outcome: JobDone | JobFailed, error: BaseException | None) -> None:
    """Mark the span with the attempt's outcome: an error status and the exception."""
    if isinstance(outcome, JobDone):
        span.set_status(Status(StatusCode.OK))
        return
    span.set_attribute("goqueue.retry", outcome.retry)
    if error is not None:
        span.record_exception(error)
    span.set_status(Status(StatusCode.ERROR, outcome.error))


def ids(span: Span) -> dict[str, str]:
    """The trace and span ids for log lines, as hex (as collectors show them)."""
    ctx = span.get_span_context()
    return {"trace_id": f"{ctx.trace_id:032x}", "span_id": f"{ctx.span_id:016x}"}
