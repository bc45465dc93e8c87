"""`ctx.enqueue` and `ctx.progress` inside a worker: requests over the pipe, answered by
the supervisor, and progress reports throttled here so a chatty handler costs the
supervisor at most a few frames a second."""

from __future__ import annotations

import itertools
import math
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import msgspec
from goqueue.actors.errors import EnqueueError
from goqueue.actors.inbox import Inbox
from goqueue.actors.pipe import Pipe
from goqueue.actors.protocol import MAX_PROGRESS_BYTES, EnqueueRequest, Progress, Refusal

PROGRESS_INTERVAL = 0.2  # seconds between two reports on the pipe (about 5 a second)
REPLY_TIMEOUT = 60.0  # seconds ctx.enqueue waits for the supervisor's answer


def encode_progress(value: object) -> bytes:
    """A progress value as JSON: a number from 0 to 1, or an object of at most 4 KiB.
    Raises TypeError or ValueError naming what is wrong."""
    if isinstance(value, bool) or not isinstance(value, int | float | Mapping):
        raise TypeError(
            f"progress must be a number from 0 to 1 or a JSON object, got {type(value).__name__}"
        )
    if isinstance(value, int | float):
        if not (math.isfinite(value) and 0 <= value <= 1):
            raise ValueError(f"progress must be a number from 0 to 1, got {value!r}")
        return msgspec.json.encode(value)
    try:
        encoded = msgspec.json.encode(value)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"progress is not JSON: {exc}") from None
    if len(encoded) > MAX_PROGRESS_BYTES:
        raise ValueError(
            f"progress is {len(encoded)} bytes of JSON, over the limit of {MAX_PROGRESS_BYTES}"
        )
    return encoded


class Courier(threading.Thread):
    """Sends the latest progress report at most once per `interval`: a report offered
    sooner waits (and is replaced by any later one), so the last value always arrives."""

    def __init__(
        self,
        send: Callable[[Progress], None],
        interval: float = PROGRESS_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(name="goqueue-progress", daemon=True)
        self.send = send
        self.interval = interval
        self.clock = clock
        self._pending: Progress | None = None
        self._last = -math.inf
        self._changed = threading.Condition()

    def offer(self, report: Progress) -> None:
        """The newest report; replaces one not sent yet."""
        with self._changed:
            self._pending = report
            self._changed.notify()

    def drop(self) -> None:
        """Forget a report not sent yet (its job ended)."""
        with self._changed:
            self._pending = None

    def run(self) -> None:
        while True:
            with self._changed:
                while self._pending is None or self.clock() < self._last + self.interval:
                    wait = None if self._pending is None else self._last + self.interval
                    self._changed.wait(None if wait is None else max(0.0, wait - self.clock()))
                report, self._pending = self._pending, None
                self._last = self.clock()
            try:
                self.send(report)
            except OSError:
                return  # the pipe is gone; the inbox ends the process


class PipeLink:
    """The `Link` of every context in this worker."""

    def __init__(self, pipe: Pipe, inbox: Inbox, reply_timeout: float = REPLY_TIMEOUT) -> None:
        self.pipe = pipe
        self.inbox = inbox
        self.reply_timeout = reply_timeout
        self._ids = itertools.count(1)
        self._courier: Courier | None = None
        self._starting = threading.Lock()

    def enqueue(self, parent_id: str, spec: dict[str, Any]) -> str:
        """Ask the supervisor for a child job; its id, or EnqueueError."""
        try:
            body = msgspec.json.encode(spec)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"ctx.enqueue: the job is not JSON: {exc}") from None
        request_id = next(self._ids)
        reply = self.inbox.expect(request_id)
        self.pipe.send(EnqueueRequest(request_id, parent_id, body, _trace_context()))
        answer = reply.wait(self.reply_timeout)
        if answer is None:
            self.inbox.forget(request_id)
            raise EnqueueError(
                f"the supervisor did not answer within {self.reply_timeout:g}s",
                refusal=Refusal.UNAVAILABLE,
            )
        if answer.job_id is not None:
            return answer.job_id
        raise EnqueueError(
            answer.error,
            refusal=answer.refusal or Refusal.INVALID,
            existing_id=answer.existing_id,
        )

    def progress(self, job_id: str, value: float | Mapping[str, Any]) -> None:
        """Validate, then hand the report to the courier (started on first use)."""
        report = Progress(job_id, encode_progress(value))
        with self._starting:
            if self._courier is None:
                self._courier = Courier(self.pipe.send)
                self._courier.start()
        self._courier.offer(report)

    def job_ended(self) -> None:
        """The job's outcome goes next: a report still waiting is moot."""
        if self._courier is not None:
            self._courier.drop()


def _trace_context() -> dict[str, str] | None:
    """The current span's context, when this worker traces (`--otel`): a child job's
    enqueue then joins the attempt's trace."""
    propagate = sys.modules.get("opentelemetry.propagate")
    if propagate is None:
        return None
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier or None
