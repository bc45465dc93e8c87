"""`goqueue.Client`: a blocking client over keep-alive connections, safe to share between
threads.

HTTP goes through the standard library's `http.client`; a small pool keeps idle
connections (one request at a time on each), so a thread never waits for another's
request and a busy program reuses sockets instead of opening one per call.
"""

from __future__ import annotations

import builtins
import http.client
import select
import socket
import threading
import time
import weakref
from collections.abc import Iterable, Iterator, Mapping
from types import TracebackType
from typing import Any, TypeVar, Unpack, cast, overload

from goqueue.api.wire import (
    BulkCancelled,
    BulkPurged,
    BulkReplayed,
    DeadLetterList,
    DeadLetterOut,
    JobList,
    JobOut,
    ScheduleOut,
    WorkflowOut,
)
from goqueue.api.wire import QueueStats as QueueStats
from goqueue.api.wire import StatsOut as StatsOut
from goqueue.client import calls, core, flows
from goqueue.client import workflows as wf_calls
from goqueue.client.calls import DEFAULT_TIMEOUT, BaseClient, Call, Endpoint, Retries
from goqueue.client.core import PAGE_SIZE, JobOptions, Submitted
from goqueue.client.errors import ClientError, ConnectionFailed, RequestError
from goqueue.client.workflows import Submittable
from goqueue.supervisor.common.jobs import Event, JobSpec

T = TypeVar("T")

POOL_SIZE = 8  # idle connections kept; busy ones are not limited


class _Pool:
    """Idle keep-alive connections to one node, shared by threads under a lock."""

    def __init__(self, endpoint: Endpoint, timeout: float, size: int) -> None:
        self.endpoint = endpoint
        self.timeout = timeout
        self.size = size
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()
        self._closed = False

    def take(self) -> http.client.HTTPConnection:
        """An idle connection still open, or a new (unconnected) one."""
        with self._lock:
            while self._idle:
                conn = self._idle.pop()
                if _still_open(conn):
                    return conn
                conn.close()
        cls: type[http.client.HTTPConnection] = http.client.HTTPConnection
        if self.endpoint.scheme == "https":
            cls = http.client.HTTPSConnection
        return cls(self.endpoint.host, self.endpoint.port, timeout=self.timeout)

    def give(self, conn: http.client.HTTPConnection) -> None:
        """Keep a connection whose answer was read whole, for the next request."""
        with self._lock:
            if not self._closed and len(self._idle) < self.size:
                self._idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        """Close every idle connection; later ones are closed when given back."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


def _still_open(conn: http.client.HTTPConnection) -> bool:
    """False when the node closed an idle connection (its socket reads EOF): reusing it
    would fail the next request for nothing."""
    sock = conn.sock
    if sock is None:
        return False
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return False
    return not readable


class Client(BaseClient):
    """A GoQueue node's API from blocking code: `Client().enqueue("email", {...})`.

    `url` defaults to $GOQUEUE_URL (else http://127.0.0.1:8080) and `api_key` to
    $GOQUEUE_API_KEY (else $API_KEY); `timeout` bounds each request in seconds; `retries`
    says how a 503, a 504 or a dropped connection is retried (only requests that are safe to
    send again: reads, pause and resume, and enqueues, which carry an Idempotency-Key).
    One client can serve every thread of a program; `close()` it (or use `with`) when done.
    """

    def __init__(
        self,
        url: str | None = None,
        api_key: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        *,
        retries: Retries | None = None,
        pool_size: int = POOL_SIZE,
    ) -> None:
        super().__init__(url, api_key, timeout, retries)
        self._pool = _Pool(self.endpoint, timeout, pool_size)
        # A client left open closes its idle connections when it is collected, or at exit,
        # so it never leaves a socket for Python to warn about (`ResourceWarning`).
        weakref.finalize(self, self._pool.close)
        self.dlq = DeadLetters(self)
        self.schedules = Schedules(self)

    def close(self) -> None:
        """Close the idle connections."""
        self._pool.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- enqueue ---------------------------------------------------------------------------

    def enqueue(self, type: str, payload: Any = None, **options: Unpack[JobOptions]) -> JobOut:
        """Enqueue one job of `type` (an actor's name) and return it. The job is checked
        here first as the node would (BadRequest naming the field); a 503, a 504 or a
        dropped connection is retried with the same Idempotency-Key, so never twice
        enqueued."""
        return self.submit(type, payload, **options).job

    @overload
    def submit(
        self, type: Submittable, payload: None = None, *, idempotency_key: str | None = None
    ) -> WorkflowOut: ...

    @overload
    def submit(
        self, type: str, payload: Any = None, **options: Unpack[JobOptions]
    ) -> Submitted: ...

    def submit(
        self, type: str | Submittable, payload: Any = None, **options: Any
    ) -> Submitted | WorkflowOut:
        """`enqueue`, also saying whether this call created the job (False: its
        `idempotency_key` names a job enqueued before); given a `Workflow` (or a chain or
        a group), `submit_workflow`."""
        if not isinstance(type, str):
            return self.submit_workflow(type, idempotency_key=options.get("idempotency_key"))
        return self.execute(core.submission(type, payload, cast("JobOptions", options)))

    # -- workflows -------------------------------------------------------------------------

    def submit_workflow(
        self, workflow: Submittable, *, idempotency_key: str | None = None
    ) -> WorkflowOut:
        """Create a workflow (a `Workflow`, `chain(...)` or `group(...)`), every step at
        once; checked here first as the node would. Retried with one Idempotency-Key."""
        return self.execute(wf_calls.create(workflow, idempotency_key))

    def get_workflow(self, workflow_id: str) -> WorkflowOut:
        """One workflow with its steps' live statuses (NotFound if there is none)."""
        return self.execute(wf_calls.get(workflow_id))

    def wait_workflow(self, workflow_id: str, timeout: float | None = None) -> WorkflowOut:
        """Wait for a workflow to be done, failed or cancelled and return it (look at its
        `status`). Raises WorkflowTimeout (a TimeoutError) after `timeout` seconds."""
        wait = wf_calls.WorkflowWait(timeout, time.monotonic)
        while (pause := wait.pause(seen := self.get_workflow(workflow_id))) is not None:
            time.sleep(pause)
        return seen

    def cancel_workflow(self, workflow_id: str) -> WorkflowOut:
        """Cancel a workflow: its unfinished steps end cancelled, running ones killed."""
        return self.execute(wf_calls.cancel(workflow_id))

    def enqueue_many(
        self, jobs: Iterable[JobSpec | Mapping[str, Any]], *, strict: bool = True
    ) -> builtins.list[JobOut | RequestError]:
        """Enqueue several jobs (each a mapping of job fields, `type` required, or a
        `JobSpec`) through the batch route, 1,000 a request. Each is answered on its own,
        in order: the job, or the error refusing it (BadRequest, Conflict...). Not retried:
        the batch route takes no Idempotency-Key."""
        batch = flows.Batch(jobs, strict=strict)
        return batch.answers([a for call in batch.calls() for a in self.execute(call)])

    # -- jobs ------------------------------------------------------------------------------

    def get(self, job_id: str) -> JobOut:
        """One job (NotFound if no job has that id)."""
        return self.execute(core.get(job_id))

    def wait(self, job_id: str, timeout: float | None = None) -> JobOut:
        """Wait for a job to finish and return it, `result` included. Raises JobFailed
        (its `error` and `attempts`) if it failed for good, JobCancelled if it was
        cancelled, WaitTimeout (a TimeoutError) if it is still unfinished after `timeout`
        seconds (None: wait as long as it takes). The node answers as soon as the job
        finishes: nothing polls."""
        wait = flows.Wait(job_id, timeout, time.monotonic)
        while (job := wait.finished(self.execute(wait.call()))) is None:
            if pause := wait.pause():
                time.sleep(pause)
        return job

    def list(
        self,
        *,
        type: str | None = None,
        status: str | None = None,
        queue: str | None = None,
        concurrency_key: str | None = None,
        page_size: int = PAGE_SIZE,
    ) -> Iterator[JobOut]:
        """Jobs newest first, filtered, fetched a page at a time as you iterate."""
        pages: flows.Pages[JobOut] = flows.Pages()
        while not pages.done:
            page = self.jobs_page(
                type=type,
                status=status,
                queue=queue,
                concurrency_key=concurrency_key,
                limit=page_size,
                offset=pages.offset,
            )
            yield from pages.take(page.jobs, page.total)

    def jobs_page(
        self,
        *,
        type: str | None = None,
        status: str | None = None,
        queue: str | None = None,
        limit: int | None = None,
        offset: int | None = None,
        concurrency_key: str | None = None,
    ) -> JobList:
        """One page of jobs, newest first, with the total matching."""
        return self.execute(core.jobs_page(type, status, queue, limit, offset, concurrency_key))

    def events(self, job_id: str) -> builtins.list[Event]:
        """A job's audit trail, oldest first."""
        return self.execute(core.events(job_id))

    def cancel(self, job_id: str, force: bool = False) -> JobOut:
        """Cancel a pending job; with `force` a running one too (its worker is killed).
        Conflict if it has finished, or is running and `force` is not given."""
        return self.execute(core.cancel(job_id, force))

    def cancel_many(self, **filters: Unpack[core.CancelFilters]) -> BulkCancelled:
        """Cancel the unfinished jobs `filters` select, oldest first (at most `limit`,
        100 unless given): `queue`, `type`, `status="pending"`, `created_before`, or
        `all=True`. Running jobs are left alone (counted) unless `force=True`."""
        return self.execute(core.cancel_many(filters))

    # -- queues and stats ------------------------------------------------------------------

    def stats(self) -> StatsOut:
        """Counts by status, pending depth by queue and priority, dead letters, workers."""
        return self.execute(core.stats())

    def queue_stats(self, queue: str) -> QueueStats:
        """One queue's counts, depth by priority, and whether it is paused."""
        return self.execute(core.queue_stats(queue))

    def pause(self, queue: str) -> QueueStats:
        """Stop dispatching from a queue (enqueueing still works)."""
        return self.execute(core.set_paused(queue, True))

    def resume(self, queue: str) -> QueueStats:
        """Dispatch from a paused queue again."""
        return self.execute(core.set_paused(queue, False))

    # -- sending ---------------------------------------------------------------------------

    def execute(self, call: Call[T]) -> T:
        """Send one call, retried as `retries` allows; its result, or its typed error."""
        retry = 0
        while True:
            try:
                return self._send(call)
            except ClientError as exc:
                retry += 1
                if (pause := self.retries.pause(call, exc, retry)) is None:
                    raise
                time.sleep(pause)

    def _send(self, call: Call[T]) -> T:
        timeout = self.timeout + call.wait
        conn = self._pool.take()
        try:
            if conn.sock is None:
                conn.timeout = timeout
                try:
                    conn.connect()
                except OSError as exc:
                    raise self._unreachable(exc, sent=False) from None
            assert conn.sock is not None
            conn.sock.settimeout(timeout)
            path = self.endpoint.path + call.path
            conn.request(call.method, path, call.body, calls.headers(self.api_key, call))
            resp = conn.getresponse()
            body = resp.read()
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise self._unreachable(exc, sent=True, timeout=timeout) from None
        except BaseException:
            conn.close()
            raise
        if resp.will_close:
            conn.close()
        else:
            self._pool.give(conn)
        return calls.answer(call, resp.status, body, resp.getheader("Retry-After"))

    def _unreachable(
        self, exc: BaseException, *, sent: bool, timeout: float | None = None
    ) -> ConnectionFailed:
        """One line saying why the node did not answer."""
        where = self.url
        if isinstance(exc, ConnectionFailed):
            return exc
        if isinstance(exc, TimeoutError):
            seconds = timeout if timeout is not None else self.timeout
            return ConnectionFailed(
                f"no answer from {where} within {seconds:g} s", sent=sent, timed_out=True
            )
        if isinstance(exc, ConnectionRefusedError):
            message = f"cannot connect to {where}: connection refused (is `goqueue serve` running?)"
        elif isinstance(exc, socket.gaierror):
            message = f"cannot resolve the host in {where}: {exc.strerror}"
        elif isinstance(exc, http.client.HTTPException | ConnectionError):
            message = f"the connection to {where} was dropped ({type(exc).__name__})"
        else:
            message = f"cannot reach {where}: {getattr(exc, 'strerror', None) or exc}"
        return ConnectionFailed(message, sent=sent)


class DeadLetters:
    """`client.dlq`: the dead-letter queue."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def list(
        self, *, page_size: int = PAGE_SIZE, **filters: Unpack[core.DeadSelection]
    ) -> Iterator[DeadLetterOut]:
        """Dead letters newest first (those passing the filters), a page at a time as
        you iterate."""
        pages: flows.Pages[DeadLetterOut] = flows.Pages()
        while not pages.done:
            page = self.page(limit=page_size, offset=pages.offset, **filters)
            yield from pages.take(page.dead_letters, page.total)

    def page(
        self,
        *,
        limit: int | None = None,
        offset: int | None = None,
        **filters: Unpack[core.DeadSelection],
    ) -> DeadLetterList:
        """One page of dead letters, newest first, with the total (of those passing the
        filters: `type`, `queue`, `error`, `before`, `after`)."""
        return self._client.execute(core.dead_page(limit, offset, filters))

    def get(self, dead_id: str) -> DeadLetterOut:
        """One dead letter: every attempt's error and the job's last state."""
        return self._client.execute(core.dead(dead_id))

    def replay(self, dead_id: str) -> JobOut:
        """A fresh job from the letter (the letter goes once the job is stored)."""
        return self._client.execute(core.replay(dead_id))

    def purge(self, dead_id: str) -> str:
        """Delete a dead letter; returns its id."""
        return self._client.execute(core.purge(dead_id))

    def replay_many(
        self, *, limit: int | None = None, **filters: Unpack[core.DeadFilters]
    ) -> BulkReplayed:
        """Replay the dead letters the filters select, oldest first, each as a fresh job:
        every match (as many requests as it takes) or, with `limit`, at most that many in
        one request. `remaining` says how many matching are left."""
        sweep = flows.Sweep(limit)
        while (n := sweep.next_limit()) is not None:
            answer = self._client.execute(core.replay_matching(filters, n))
            sweep.note(answer.replayed, answer.remaining)
        return BulkReplayed(sweep.done, sweep.remaining)

    def purge_many(
        self, *, limit: int | None = None, **filters: Unpack[core.DeadFilters]
    ) -> BulkPurged:
        """Delete the dead letters the filters select, oldest first (as `replay_many`)."""
        sweep = flows.Sweep(limit)
        while (n := sweep.next_limit()) is not None:
            answer = self._client.execute(core.purge_matching(filters, n))
            sweep.note(answer.purged, answer.remaining)
        return BulkPurged(sweep.done, sweep.remaining)


class Schedules:
    """`client.schedules`: the node's periodic jobs."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def list(self) -> builtins.list[ScheduleOut]:
        """Every schedule: next fire, last fire and its job, enabled or not."""
        return self._client.execute(core.schedules())

    def enable(self, name: str) -> ScheduleOut:
        """Enable a schedule (with PostgreSQL for every node, across restarts)."""
        return self._client.execute(core.set_schedule_enabled(name, True))

    def disable(self, name: str) -> ScheduleOut:
        """Disable a schedule: its ticks enqueue nothing until it is enabled again."""
        return self._client.execute(core.set_schedule_enabled(name, False))
