"""With tracing off nothing of OpenTelemetry is imported: not by the node, its workers'
modules or the Python client (checked in a fresh interpreter)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from goqueue.supervisor.observe.tracing_requires import missing_packages

pytestmark = pytest.mark.timeout(60)

MODULES = (
    "goqueue",
    "goqueue.client",
    "goqueue.api.cli.main",
    "goqueue.api.cli.serve",
    "goqueue.api.http.app",
    "goqueue.actors.child",
    "goqueue.supervisor.arbiter",
    "goqueue.supervisor.workers.child_enqueues",
)


def test_nothing_of_opentelemetry_is_imported_without_otel() -> None:
    code = (
        "import importlib, sys\n"
        f"for name in {MODULES!r}: importlib.import_module(name)\n"
        "from goqueue.client import calls\n"
        "calls.headers(None, calls.Call('GET', '/x', lambda s, b: None))\n"
        "print([m for m in sys.modules if m.startswith('opentelemetry')])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=50)
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode().strip() == "[]"


def test_the_packages_otel_needs_are_found_here() -> None:
    assert missing_packages() == []  # the test extra installs goqueue[otel]


def test_the_client_sends_the_current_span_as_traceparent() -> None:
    code = (
        "from opentelemetry.sdk.trace import TracerProvider\n"
        "from goqueue.client import calls\n"
        "tracer = TracerProvider().get_tracer('app')\n"
        "call = calls.Call('POST', '/jobs', lambda s, b: None, b'{}')\n"
        "print(calls.headers(None, call).get('traceparent'))\n"
        "with tracer.start_as_current_span('request') as span:\n"
        "    sent = calls.headers(None, call)['traceparent']\n"
        "    print(sent.split('-')[1] == format(span.get_span_context().trace_id, '032x'))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=50)
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode().split() == ["None", "True"]
