"""Structured logging: one JSON object a line on the root logger.

Context travels as `extra=`: `log.info("attempt failed", extra={"job_id": ..., "attempt": 2})`
becomes `{"ts": ..., "level": "info", "logger": ..., "msg": ..., "job_id": ..., "attempt": 2}`.
The line's format lives in `goqueue.actors.logs`, which worker processes share (they may
not import the supervisor), so a handler's log lines read exactly as the node's own.
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO

from goqueue.actors.logs import JsonFormatter, rfc3339
from goqueue.supervisor.errors import ConfigError

__all__ = ["LEVELS", "JsonFormatter", "configure", "rfc3339"]

LEVELS = ("debug", "info", "warning", "error", "critical")


class _Handler(logging.StreamHandler[TextIO]):
    """The handler `configure` installs; its type marks it for replacement on the next call."""


def configure(level: str, stream: TextIO | None = None, *, access_log: bool = False) -> None:
    """Send every log record to `stream` (default stderr) as JSON lines, at `level` and above.

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
    handler = _Handler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter())
    root.addHandler(handler)
    root.setLevel(name.upper())
    logging.getLogger("aiohttp.access").setLevel(logging.NOTSET if access_log else logging.WARNING)
