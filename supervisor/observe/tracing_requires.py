"""What `--otel` needs installed, checked before the node starts and without importing
OpenTelemetry (a node without tracing never loads it)."""

from __future__ import annotations

import importlib.util

REQUIRED = (
    ("opentelemetry.sdk", "opentelemetry-sdk"),
    ("opentelemetry.exporter.otlp.proto.http", "opentelemetry-exporter-otlp-proto-http"),
)
INSTALL = "pip install 'goqueue[otel]'"


def missing_packages() -> list[str]:
    """The distributions `--otel` needs that are not installed."""
    missing = []
    for module, package in REQUIRED:
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:  # its parent package is absent
            found = False
        if not found:
            missing.append(package)
    return missing
