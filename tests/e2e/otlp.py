"""A tiny OTLP/HTTP receiver on loopback: what a node exports lands here, decoded from
protobuf with `opentelemetry-proto` (no in-process exporter stands in for the real one)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan

KINDS = {ProtoSpan.SPAN_KIND_PRODUCER: "producer", ProtoSpan.SPAN_KIND_CONSUMER: "consumer"}


@dataclass
class Span:
    """One received span, with ids as hex."""

    name: str
    kind: str
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict[str, Any]
    status: str  # "unset", "ok" or "error"
    status_message: str
    events: list[str]
    links: list[str]  # span ids
    service: dict[str, Any] = field(default_factory=dict)
    start_ns: int = 0
    end_ns: int = 0


def _value(v: Any) -> Any:
    which = v.WhichOneof("value")
    return getattr(v, which) if which else None


def _decode(body: bytes) -> list[Span]:
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    spans = []
    for resource_spans in request.resource_spans:
        service = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
        for scope in resource_spans.scope_spans:
            for s in scope.spans:
                spans.append(
                    Span(
                        name=s.name,
                        kind=KINDS.get(s.kind, str(s.kind)),
                        trace_id=s.trace_id.hex(),
                        span_id=s.span_id.hex(),
                        parent_id=s.parent_span_id.hex(),
                        attributes={a.key: _value(a.value) for a in s.attributes},
                        status={0: "unset", 1: "ok", 2: "error"}[s.status.code],
                        status_message=s.status.message,
                        events=[e.name for e in s.events],
                        links=[link.span_id.hex() for link in s.links],
                        service=service,
                        start_ns=s.start_time_unix_nano,
                        end_ns=s.end_time_unix_nano,
                    )
                )
    return spans


class Receiver:
    """Collects the spans POSTed to /v1/traces."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                ok = self.path == "/v1/traces"
                if ok:
                    spans = _decode(body)
                    with receiver.lock:
                        receiver.spans.extend(spans)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200 if ok else 404)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def of_trace(self, trace_id: str) -> list[Span]:
        with self.lock:
            return [s for s in self.spans if s.trace_id == trace_id]

    def named(self, name: str) -> list[Span]:
        with self.lock:
            return [s for s in self.spans if s.name == name]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def tree(spans: list[Span]) -> str:
    """The spans of one trace as an indented tree, for a human."""
    children: dict[str, list[Span]] = {}
    ids = {s.span_id for s in spans}
    for s in sorted(spans, key=lambda s: s.start_ns):
        children.setdefault(s.parent_id if s.parent_id in ids else "", []).append(s)

    def lines(parent: str, depth: int) -> Iterator[str]:
        for s in children.get(parent, []):
            ms = (s.end_ns - s.start_ns) / 1e6
            attrs = ", ".join(f"{k}={v}" for k, v in sorted(s.attributes.items()))
            status = f" [{s.status}: {s.status_message}]" if s.status == "error" else ""
            yield f"{'  ' * depth}{s.name} ({s.kind}, {ms:.1f} ms){status} {{{attrs}}}"
            yield from lines(s.span_id, depth + 1)

    return "\n".join(lines("", 0))
