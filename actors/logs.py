"""Log lines as JSON objects, and a worker's log lines tagged with the job it is running.

`JsonFormatter` is the one line format of a node: the supervisor's logger uses it, and so
does every worker process, which may import nothing from the supervisor. In a worker,
`JobLog.install` puts a handler on the root logger and replaces `sys.stdout` and
`sys.stderr`, so a `logging` call or a `print()` inside a handler becomes one JSON line
carrying the running job's `job_id`, `type`, `attempt` and `queue`.

The worker writes those lines itself, to the descriptor it inherited as stderr (where the
supervisor's own log goes), one `os.write` per line: nothing goes through the pipe or the
supervisor's event loop, a line is out even if the worker is killed the next moment or
the supervisor is frozen, and one write per line (atomic on a pipe up to PIPE_BUF, 4 KiB
on Linux; serialized on a file) keeps workers from interleaving mid-line.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
import threading
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import msgspec

# Every attribute a bare LogRecord carries; whatever else a record holds came from `extra=`.
_RECORD_FIELDS = frozenset(
    {*vars(logging.LogRecord("", 0, "", 0, "", None, None)), "message", "asctime", "taskName"}
)
_BASE_KEYS = ("ts", "level", "logger", "msg")
STDOUT_FD, STDERR_FD = 1, 2


def _to_str(value: object) -> str:
    """msgspec's fallback for values it cannot encode (exceptions, paths, custom objects)."""
    return str(value)


class JsonFormatter(logging.Formatter):
    """Formats a record as one line of JSON: ts, level, logger, msg, extras, and exc if any."""

    def __init__(self) -> None:
        super().__init__()
        self._encoder = msgspec.json.Encoder(enc_hook=_to_str)

    def format(self, record: logging.LogRecord) -> str:
        entry = self._fields(record)
        try:
            return self._encoder.encode(entry).decode()
        except (TypeError, ValueError, OverflowError, RecursionError):
            # e.g. a self-referencing extra: degrade to str() values rather than lose the line
            return self._encoder.encode(
                {key: _plain(value) for key, value in entry.items()}
            ).decode()

    def _fields(self, record: logging.LogRecord) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "ts": rfc3339(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": _message(record),
        }
        for key, value in vars(record).items():
            if key not in _RECORD_FIELDS and not key.startswith("_"):
                entry[f"extra_{key}" if key in _BASE_KEYS else key] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exc"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return entry


def rfc3339(timestamp: float) -> str:
    """A POSIX timestamp as RFC 3339 UTC with milliseconds: `2024-05-01T12:00:00.123Z`."""
    moment = datetime.fromtimestamp(timestamp, UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _message(record: logging.LogRecord) -> str:
    try:
        return record.getMessage()
    except (TypeError, ValueError):
        # a %-format that does not match its args: keep both rather than lose the record
        return f"{record.msg!r} % {record.args!r}"


def _plain(value: object) -> object:
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)


# -- the worker's side ---------------------------------------------------------------------


class LineHandler(logging.Handler):
    """Writes each record as one JSON line to a descriptor, in one `os.write`, with the
    fields of the running job (`tags`) added to it."""

    def __init__(self, fd: int = STDERR_FD) -> None:
        super().__init__()
        self.fd = fd
        self.tags: Mapping[str, object] = {}  # replaced whole, never mutated: no lock
        self.setFormatter(JsonFormatter())

    def emit(self, record: logging.LogRecord) -> None:
        for key, value in self.tags.items():
            if key not in record.__dict__:  # the caller's own `extra=` wins
                record.__dict__[key] = value
        # logging must never fail a job, and the stock fallback (print to sys.stderr)
        # would come back into this handler, captured
        with contextlib.suppress(Exception):
            self._write((self.format(record) + "\n").encode(errors="replace"))

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:  # one write unless the descriptor takes less (a full pipe, a signal)
            view = view[os.write(self.fd, view) :]


class LineCapture(io.TextIOBase):
    """Stands in for `sys.stdout` or `sys.stderr`: every whole line written becomes one
    record through `handler`, as logger `name` (a partial line waits for its end, or for
    `flush`, which the worker calls as each job ends)."""

    def __init__(self, handler: LineHandler, name: str, level: int, fd: int) -> None:
        super().__init__()
        self.handler = handler
        self.name = name
        self.level = level
        self.fd = fd
        self._pending = ""
        self._lock = threading.Lock()

    # typeshed declares `encoding` a plain attribute, but the C base class makes it
    # read-only: a property is the only way to give one
    @property
    def encoding(self) -> str:  # type: ignore[override]
        return "utf-8"

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return self.fd  # the real descriptor, for code that writes below Python

    def write(self, text: str) -> int:
        with self._lock:
            *lines, self._pending = (self._pending + text).split("\n")
        for line in lines:
            self._emit(line)
        return len(text)

    def flush(self) -> None:
        with self._lock:
            line, self._pending = self._pending, ""
        if line:
            self._emit(line)

    def _emit(self, line: str) -> None:
        # straight to the handler: printed output is kept whatever the log level
        record = logging.LogRecord(self.name, self.level, "", 0, line.rstrip("\r"), None, None)
        self.handler.handle(record)


class JobLog:
    """A worker's log: JSON lines on its stderr, tagged with the job running now."""

    def __init__(self, handler: LineHandler, captures: tuple[LineCapture, ...] = ()) -> None:
        self.handler = handler
        self.captures = captures

    @classmethod
    def install(cls, level: str, *, capture: bool = True) -> JobLog:
        """Route the root logger (at `level`) and, if `capture`, `print()` output to
        JSON lines on stderr. Called once, as the worker boots."""
        handler = LineHandler(STDERR_FD)
        handler.tags = {"worker_pid": os.getpid()}
        root = logging.getLogger()
        for old in root.handlers[:]:
            root.removeHandler(old)
        root.addHandler(handler)
        root.setLevel(level.strip().upper() or "INFO")
        captures: tuple[LineCapture, ...] = ()
        if capture:
            out = LineCapture(handler, "stdout", logging.INFO, STDOUT_FD)
            err = LineCapture(handler, "stderr", logging.WARNING, STDERR_FD)
            sys.stdout, sys.stderr = out, err
            captures = (out, err)
        return cls(handler, captures)

    def begin(self, job_id: str, type: str, attempt: int, queue: str) -> None:
        """Tag every line from now on with this job (until `end`)."""
        self.handler.tags = {
            "worker_pid": os.getpid(),
            "job_id": job_id,
            "type": type,
            "attempt": attempt,
            "queue": queue,
        }

    def tag(self, **fields: object) -> None:
        """Add fields to the running job's lines (the trace and span ids)."""
        self.handler.tags = {**self.handler.tags, **fields}

    def end(self) -> None:
        """The job is over: its partial lines go out tagged with it, then tags are dropped."""
        for capture in self.captures:
            capture.flush()
        self.handler.tags = {"worker_pid": os.getpid()}
