"""Structured logging on the root logger: one JSON object a line, or for a person at a
terminal one readable line (`--log-format text`, the default on a TTY).

Context travels as `extra=`: `log.info("attempt failed", extra={"job_id": ..., "attempt": 2})`
becomes `{"ts": ..., "level": "info", "logger": ..., "msg": ..., "job_id": ..., "attempt": 2}`,
or `2024-05-01T12:00:00.123Z info  goqueue.jobs: attempt failed  job_id=... attempt=2`.
The line's format lives in `goqueue.actors.logs`, which worker processes share (they may
not import the supervisor), so a handler's log lines read exactly as the node's own.
"""

from __future__ import annotations

import logging
import sys
from enum import StrEnum
from typing import TextIO

from goqueue.actors.logs import JsonFormatter, rfc3339
from goqueue.supervisor.common.errors import ConfigError

__all__ = ["LEVELS", "JsonFormatter", "configure", "rfc3339"]

LEVELS = ("debug", "info", "warning", "error", "critical")


class LogFormat(StrEnum):
    """How log records are written."""

    JSON = "json"  # one object a line: for collectors (the default off a terminal)
    TEXT = "text"  # one readable line: for a person at a terminal


class TextFormatter(JsonFormatter):
    """One line a record: time, level, logger, message, then the extras as `key=value`
    (JSON for values with spaces or quotes); a traceback follows on its own lines."""

    def format(self, record: logging.LogRecord) -> str:
        entry = self._fields(record)
        head = f"{entry.pop('ts')} {entry.pop('level'):<7} {entry.pop('logger')}: "
        line = head + str(entry.pop("msg"))
        trace = [str(entry.pop(k)) for k in ("exc", "stack") if k in entry]
        pairs = [f"{key}={self._value(value)}" for key, value in entry.items()]
        if pairs:
            line += "  " + " ".join(pairs)
        return "\n".join([line, *trace])

    def _value(self, value: object) -> str:
        if isinstance(value, str) and value and not any(c in value for c in ' "=\n\t'):
            return value
        try:
            return self._encoder.encode(value).decode()
        except (TypeError, ValueError, OverflowError, RecursionError):
            return repr(value)


class _Handler(logging.StreamHandler[TextIO]):
    """The handler `configure` installs; its type marks it for replacement on the next call."""


def configure(
    level: str,
    stream: TextIO | None = None,
    *,
    access_log: bool = False,
    format: str | None = None,
) -> None:
    """Send every log record to `stream` (default stderr), at `level` and above, in
    `format` (`json` or `text`; None: text when `stream` is a terminal, else json).

    Calling it again replaces the handler it installed before; other handlers are left alone.
    aiohttp's per-request access log is held at warning unless `access_log` is true.
    """
    name = level.strip().lower()
    if name not in LEVELS:
        raise ConfigError(f"log_level: must be one of {', '.join(LEVELS)}, got {level!r}")
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _Handler)]:
        root.removeHandler(old)
        old.close()
    target = stream if stream is not None else sys.stderr
    handler = _Handler(target)
    handler.setFormatter(
        TextFormatter() if _format(format, target) == LogFormat.TEXT else JsonFormatter()
    )
    root.addHandler(handler)
    root.setLevel(name.upper())
    logging.getLogger("aiohttp.access").setLevel(logging.NOTSET if access_log else logging.WARNING)


def _format(name: str | None, stream: TextIO) -> LogFormat:
    """The format asked for, else text on a terminal and JSON elsewhere."""
    if name is not None:
        try:
            return LogFormat(name.strip().lower())
        except ValueError:
            formats = ", ".join(LogFormat)
            raise ConfigError(f"log_format: must be one of {formats}, got {name!r}") from None
    try:
        return LogFormat.TEXT if stream.isatty() else LogFormat.JSON
    except (AttributeError, ValueError):  # a closed or odd stream: the collector's format
        return LogFormat.JSON
