"""The client's operations that take several requests, without I/O.

Waiting for a job (long polls until it finishes), paging newest first, batches of
enqueues and bulk dead-letter actions each keep their state here and say which call to
send next; `Client` and `AsyncClient` only send them (and sleep), so the two cannot
disagree on when to stop.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Generic, Protocol, TypeVar

from goqueue.api.wire import MAX_WAIT_SECONDS, JobOut
from goqueue.client.calls import Call
from goqueue.client.core import batch, batch_bodies, chunks, get, outcome
from goqueue.client.errors import RequestError, WaitTimeout
from goqueue.supervisor.common.jobs import JobSpec

RESUBMIT_PAUSE = 0.5  # a wait the node ended early (draining) is asked again after this
SWEEP_LIMIT = 500  # letters per request when a bulk action takes every match


class Wait:
    """A wait for job `job_id` to finish: long polls of at most `MAX_WAIT_SECONDS` each,
    for `timeout` seconds in all (None: as long as it takes), timed by `clock`. The node
    answers as soon as the job finishes: nothing polls."""

    def __init__(self, job_id: str, timeout: float | None, clock: Callable[[], float]) -> None:
        self.job_id = job_id
        self.timeout = timeout
        self.clock = clock
        self.deadline = None if timeout is None else clock() + timeout
        self._asked = 0.0
        self._started = 0.0

    def call(self) -> Call[JobOut]:
        """The next long poll."""
        left = MAX_WAIT_SECONDS if self.deadline is None else self.deadline - self.clock()
        self._asked = min(max(left, 0.0), MAX_WAIT_SECONDS)
        self._started = self.clock()
        return get(self.job_id, self._asked)

    def finished(self, job: JobOut) -> JobOut | None:
        """The job once finished (JobFailed or JobCancelled if it did not succeed), or
        None to ask again; WaitTimeout once `timeout` has run out."""
        if job.finished:
            return outcome(job)
        if self.deadline is not None and self.clock() >= self.deadline:
            raise WaitTimeout(job, self.timeout or 0.0)
        return None

    def pause(self) -> float:
        """Seconds to wait before asking again: a moment if the node ended the wait
        early (it is draining), else none."""
        return RESUBMIT_PAUSE if self.clock() - self._started < self._asked / 2 else 0.0


class _Identified(Protocol):
    @property
    def id(self) -> str: ...


Item = TypeVar("Item", bound=_Identified)


class Pages(Generic[Item]):
    """Paging newest first: the offset of the next page, and the items not met before.
    A job enqueued meanwhile shifts the pages, so a page may start with items already
    seen; they are skipped."""

    def __init__(self) -> None:
        self.offset = 0
        self.done = False
        self._seen: set[str] = set()

    def take(self, items: Sequence[Item], total: int) -> list[Item]:
        """A page's items not seen before; `done` once the pages are exhausted."""
        fresh = []
        for item in items:
            if item.id not in self._seen:
                self._seen.add(item.id)
                fresh.append(item)
        self.offset += len(items)
        self.done = not items or self.offset >= total
        return fresh


class Batch:
    """Several jobs through the batch route: each checked on its own (an invalid one is
    its own error), the valid ones sent `MAX_BATCH` a request, the answers given back in
    the jobs' order."""

    def __init__(self, jobs: Iterable[JobSpec | Mapping[str, Any]], *, strict: bool) -> None:
        self.checked = batch_bodies(jobs)
        self.strict = strict

    def calls(self) -> list[Call[list[JobOut | RequestError]]]:
        """The requests to send, in order."""
        bodies = [b for b in self.checked if isinstance(b, bytes)]
        return [batch(chunk, strict=self.strict) for chunk in chunks(bodies)]

    def answers(self, sent: Iterable[JobOut | RequestError]) -> list[JobOut | RequestError]:
        """Every job's answer, in order, from the answers of `calls()` (in their order)."""
        stored = iter(sent)
        return [next(stored) if isinstance(c, bytes) else c for c in self.checked]


class Sweep:
    """A bulk action over every matching letter, as many requests as it takes (sans I/O).
    It stops when nothing matches any more, or after as many letters as matched at the
    first request: letters that die meanwhile (a replayed job failing again) are not
    chased forever."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit  # None: every match; N: one request of at most N
        self.done = 0
        self.remaining = 0
        self._cap: int | None = None

    def next_limit(self) -> int | None:
        """The limit of the next request, or None when finished."""
        if self.limit is not None:
            return self.limit if self._cap is None else None
        if self._cap is None:
            return SWEEP_LIMIT
        left = self._cap - self.done
        return min(SWEEP_LIMIT, left) if left > 0 and self.remaining > 0 else None

    def note(self, count: int, remaining: int) -> None:
        """A request's answer."""
        if self._cap is None:
            self._cap = count + remaining
        elif count == 0:
            self._cap = self.done  # taken by someone else meanwhile: stop
        self.done += count
        self.remaining = remaining
