"""OpenTelemetry in the supervisor: a PRODUCER span for every enqueue, whose context is
stored with the job so each attempt's CONSUMER span (made in the worker, see
`goqueue.actors.tracing`) joins the same trace.

Imported only when `--otel` is on: with tracing off nothing of OpenTelemetry is loaded.
The SDK is configured from the standard variables (OTEL_EXPORTER_OTLP_ENDPOINT,
OTEL_SERVICE_NAME, OTEL_TRACES_SAMPLER, ...). Spans leave through a BatchSpanProcessor:
exported in batches from its own thread, dropped when its buffer is full, so a slow or
unreachable collector never holds up an enqueue.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING

from goqueue.actors.tracing import AttemptIds, previous_attempt, resource, stop_exporting
from opentelemetry import context, propagate
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode

if TYPE_CHECKING:
    from aiohttp import web
    from goqueue.supervisor.common.jobs import Job
    from goqueue.supervisor.store.base import NewJob

SYSTEM = "goqueue"
FLUSH_MS = 2000  # what a stopping node gives the exporter, at most


def provider(node: str, ids: AttemptIds) -> tuple[TracerProvider, SpanExporter]:
    """A tracer provider exporting over OTLP/HTTP in batches, as the OTEL_* variables say,
    and its exporter."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    made, exporter = TracerProvider(resource=resource(node), id_generator=ids), OTLPSpanExporter()
    made.add_span_processor(BatchSpanProcessor(exporter))
    return made, exporter


class Tracing:
    """The supervisor's spans: `send {queue}` for each enqueue, the stored context."""

    def __init__(self, node: str) -> None:
        self.node = node
        self.ids = AttemptIds()  # a killed attempt's span gets the id its retry links to
        self.provider, self.exporter = provider(node, self.ids)
        self.tracer = self.provider.get_tracer("goqueue")

    def produced(self, new: NewJob) -> None:
        """Record the enqueue of `new` as a PRODUCER span, a child of the current context
        (the request's `traceparent`), and keep the span's context with the job."""
        spec = new.spec
        queue = spec.queue_name
        attributes = {
            "messaging.system": SYSTEM,
            "messaging.operation.type": "send",
            "messaging.operation.name": "send",
            "messaging.destination.name": queue,
            "goqueue.job.type": spec.type,
            "goqueue.node": self.node,
        }
        if new.parent_id is not None:
            attributes["goqueue.job.parent_id"] = new.parent_id
        with self.tracer.start_as_current_span(
            f"send {queue}", kind=SpanKind.PRODUCER, attributes=attributes
        ):
            carrier: dict[str, str] = {}
            propagate.inject(carrier)
        new.trace_context = carrier or None

    def killed(self, job: Job, reason: str | None, ran: float) -> None:
        """An attempt whose worker died under it (killed: timeout, cancel, lost lease,
        memory; or crashed) never ends its own span: record one here, saying why."""
        parent = propagate.extract(job.trace_context) if job.trace_context else None
        end = time.time_ns()
        why = f"the attempt was killed: {reason}" if reason else "the worker crashed"
        self.ids.attempt_next(job.id, job.attempts)
        span = self.tracer.start_span(
            f"process {job.type}",
            context=parent,
            kind=SpanKind.CONSUMER,
            attributes={
                "messaging.system": SYSTEM,
                "messaging.operation.type": "process",
                "messaging.operation.name": "process",
                "messaging.destination.name": job.queue,
                "messaging.message.id": job.id,
                "goqueue.job.type": job.type,
                "goqueue.attempt": job.attempts,
                "goqueue.node": self.node,
                "goqueue.killed": reason or "crash",
            },
            links=previous_attempt(parent, job.id, job.attempts),
            start_time=end - int(ran * 1e9),
        )
        span.set_status(Status(StatusCode.ERROR, why))
        span.end(end_time=end)

    def middleware(self) -> Callable[..., Awaitable[web.StreamResponse]]:
        """An aiohttp middleware making a request's `traceparent` the current context."""
        from aiohttp import web

        @web.middleware
        async def traced(
            request: web.Request,
            handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
        ) -> web.StreamResponse:
            if "traceparent" not in request.headers:
                return await handler(request)
            token = context.attach(propagate.extract(_headers(request.headers)))
            try:
                return await handler(request)
            finally:
                context.detach(token)

        return traced

    def close(self) -> None:
        """Send what is buffered, for at most `FLUSH_MS`, then stop (`stop_exporting`)."""
        stop_exporting(self.provider, self.exporter, FLUSH_MS)


@contextmanager
def joined(carrier: Mapping[str, str]) -> Iterator[None]:
    """Make the context in `carrier` (W3C trace context) the current one meanwhile."""
    token = context.attach(propagate.extract(carrier))
    try:
        yield
    finally:
        context.detach(token)


def _headers(headers: Mapping[str, str]) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items() if k.lower() in ("traceparent", "tracestate")}
