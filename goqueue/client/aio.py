"""`goqueue.AsyncClient`: the client for asyncio code, over one aiohttp session.

Every call is built by `core` and `flows`, as in the blocking `Client`; only the
transport differs. The session (its keep-alive connection pool) is made on first use, on
the running loop, and is safe to share between the tasks of that loop; one client serves
one loop.
"""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import AsyncIterator, Iterable, Mapping
from types import TracebackType
from typing import Any, TypeVar, Unpack, cast, overload

import aiohttp
import yarl
from goqueue.api.wire import (
    BulkCancelled,
    BulkPurged,
    BulkReplayed,
    DeadLetterList,
    DeadLetterOut,
    JobList,
    JobOut,
    QueueStats,
    ScheduleOut,
    StatsOut,
    WorkflowOut,
)
from goqueue.client import calls, core, flows
from goqueue.client import workflows as wf_calls
from goqueue.client.calls import DEFAULT_TIMEOUT, BaseClient, Call, Retries
from goqueue.client.core import PAGE_SIZE, JobOptions, Submitted
from goqueue.client.errors import ClientError, ConnectionFailed, RequestError
from goqueue.client.workflows import Submittable
from goqueue.supervisor.common.jobs import Event, JobSpec

T = TypeVar("T")

MAX_CONNECTIONS = 32


class AsyncClient(BaseClient):
    """A GoQueue node's API from asyncio code: `await client.enqueue("email", {...})`.

    The same arguments, defaults and retries as `Client`. Close it: use it as `async with
    AsyncClient() as client:`, or `await client.close()` when done. It holds an aiohttp
    session with open connections, and one left unclosed makes Python warn
    `ResourceWarning: Unclosed client session` (and `Unclosed connector`) at exit.
    """

    def __init__(
        self,
        url: str | None = None,
        api_key: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        *,
        retries: Retries | None = None,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        super().__init__(url, api_key, timeout, retries)
        self.max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None
        self.dlq = AsyncDeadLetters(self)
        self.schedules = AsyncSchedules(self)

    async def close(self) -> None:
        """Close the session and its connections."""
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    # -- enqueue ---------------------------------------------------------------------------

    async def enqueue(
        self, type: str, payload: Any = None, **options: Unpack[JobOptions]
    ) -> JobOut:
        """Enqueue one job (see `Client.enqueue`)."""
        return (await self.submit(type, payload, **options)).job

    @overload
    async def submit(
        self, type: Submittable, payload: None = None, *, idempotency_key: str | None = None
    ) -> WorkflowOut: ...

    @overload
    async def submit(
        self, type: str, payload: Any = None, **options: Unpack[JobOptions]
    ) -> Submitted: ...

    async def submit(
        self, type: str | Submittable, payload: Any = None, **options: Any
    ) -> Submitted | WorkflowOut:
        """`enqueue`, also saying whether this call created the job (False: its
        `idempotency_key` names a job enqueued before); given a `Workflow` (or a chain or
        a group), `submit_workflow`."""
        if not isinstance(type, str):
            return await self.submit_workflow(type, idempotency_key=options.get("idempotency_key"))
        return await self.execute(core.submission(type, payload, cast("JobOptions", options)))

    # -- workflows -------------------------------------------------------------------------

    async def submit_workflow(
        self, workflow: Submittable, *, idempotency_key: str | None = None
    ) -> WorkflowOut:
        """Create a workflow (a `Workflow`, `chain(...)` or `group(...)`), every step at
        once; checked here first as the node would. Retried with one Idempotency-Key."""
        return await self.execute(wf_calls.create(workflow, idempotency_key))

    async def get_workflow(self, workflow_id: str) -> WorkflowOut:
        """One workflow with its steps' live statuses (NotFound if there is none)."""
        return await self.execute(wf_calls.get(workflow_id))

    async def wait_workflow(self, workflow_id: str, timeout: float | None = None) -> WorkflowOut:
        """Wait for a workflow to be done, failed or cancelled and return it (look at its
        `status`). Raises WorkflowTimeout (a TimeoutError) after `timeout` seconds."""
        wait = wf_calls.WorkflowWait(timeout, asyncio.get_running_loop().time)
        while (pause := wait.pause(seen := await self.get_workflow(workflow_id))) is not None:
            await asyncio.sleep(pause)
        return seen

    async def cancel_workflow(self, workflow_id: str) -> WorkflowOut:
        """Cancel a workflow: its unfinished steps end cancelled, running ones killed."""
        return await self.execute(wf_calls.cancel(workflow_id))

    async def enqueue_many(
        self, jobs: Iterable[JobSpec | Mapping[str, Any]], *, strict: bool = True
    ) -> builtins.list[JobOut | RequestError]:
        """Enqueue several jobs through the batch route (see `Client.enqueue_many`)."""
        batch = flows.Batch(jobs, strict=strict)
        answers: builtins.list[JobOut | RequestError] = []
        for call in batch.calls():
            got = await self.execute(call)
            answers.extend(got)
        return batch.answers(answers)

    # -- jobs ------------------------------------------------------------------------------

    async def get(self, job_id: str) -> JobOut:
        """One job (NotFound if no job has that id)."""
        return await self.execute(core.get(job_id))

    async def wait(self, job_id: str, timeout: float | None = None) -> JobOut:
        """Wait for a job to finish (see `Client.wait`)."""
        wait = flows.Wait(job_id, timeout, asyncio.get_running_loop().time)
        while (job := wait.finished(await self.execute(wait.call()))) is None:
            if pause := wait.pause():
                await asyncio.sleep(pause)
        return job

    async def list(
        self,
        *,
        type: str | None = None,
        status: str | None = None,
        queue: str | None = None,
        concurrency_key: str | None = None,
        page_size: int = PAGE_SIZE,
    ) -> AsyncIterator[JobOut]:
        """Jobs newest first, filtered, fetched a page at a time: `async for job in ...`."""
        pages: flows.Pages[JobOut] = flows.Pages()
        while not pages.done:
            page = await self.jobs_page(
                type=type,
                status=status,
                queue=queue,
                concurrency_key=concurrency_key,
                limit=page_size,
                offset=pages.offset,
            )
            for job in pages.take(page.jobs, page.total):
                yield job

    async def jobs_page(
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
        return await self.execute(
            core.jobs_page(type, status, queue, limit, offset, concurrency_key)
        )

    async def events(self, job_id: str) -> builtins.list[Event]:
        """A job's audit trail, oldest first."""
        return await self.execute(core.events(job_id))

    async def cancel(self, job_id: str, force: bool = False) -> JobOut:
        """Cancel a job (see `Client.cancel`)."""
        return await self.execute(core.cancel(job_id, force))

    async def cancel_many(self, **filters: Unpack[core.CancelFilters]) -> BulkCancelled:
        """Cancel the jobs `filters` select (see `Client.cancel_many`)."""
        return await self.execute(core.cancel_many(filters))

    # -- queues and stats ------------------------------------------------------------------

    async def stats(self) -> StatsOut:
        """Counts by status, pending depth by queue and priority, dead letters, workers."""
        return await self.execute(core.stats())

    async def queue_stats(self, queue: str) -> QueueStats:
        """One queue's counts, depth by priority, and whether it is paused."""
        return await self.execute(core.queue_stats(queue))

    async def pause(self, queue: str) -> QueueStats:
        """Stop dispatching from a queue (enqueueing still works)."""
        return await self.execute(core.set_paused(queue, True))

    async def resume(self, queue: str) -> QueueStats:
        """Dispatch from a paused queue again."""
        return await self.execute(core.set_paused(queue, False))

    # -- sending ---------------------------------------------------------------------------

    async def execute(self, call: Call[T]) -> T:
        """Send one call, retried as `retries` allows; its result, or its typed error."""
        retry = 0
        while True:
            try:
                return await self._send(call)
            except ClientError as exc:
                retry += 1
                if (pause := self.retries.pause(call, exc, retry)) is None:
                    raise
                await asyncio.sleep(pause)

    def _open(self) -> aiohttp.ClientSession:
        """The session, made on first use (on the running loop)."""
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.max_connections)
            )
        return self._session

    async def _send(self, call: Call[T]) -> T:
        timeout = self.timeout + call.wait
        url = yarl.URL(self.endpoint.url + call.path, encoded=True)  # quoted already
        try:
            async with self._open().request(
                call.method,
                url,
                data=call.body,
                headers=calls.headers(self.api_key, call),
                timeout=aiohttp.ClientTimeout(total=timeout),
            ) as resp:
                body = await resp.read()
        except TimeoutError:
            raise ConnectionFailed(
                f"no answer from {self.url} within {timeout:g} s", sent=True, timed_out=True
            ) from None
        except aiohttp.ClientConnectorError as exc:
            raise ConnectionFailed(self._refused(exc), sent=False) from None
        except (aiohttp.ClientError, OSError) as exc:
            raise ConnectionFailed(
                f"the connection to {self.url} was dropped ({type(exc).__name__})", sent=True
            ) from None
        return calls.answer(call, resp.status, body, resp.headers.get("Retry-After"))

    def _refused(self, exc: aiohttp.ClientConnectorError) -> str:
        if isinstance(exc.os_error, ConnectionRefusedError):
            return f"cannot connect to {self.url}: connection refused (is `goqueue serve` running?)"
        return f"cannot reach {self.url}: {exc.os_error.strerror or exc}"


class AsyncDeadLetters:
    """`client.dlq` of an `AsyncClient`: the dead-letter queue."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    async def list(
        self, *, page_size: int = PAGE_SIZE, **filters: Unpack[core.DeadSelection]
    ) -> AsyncIterator[DeadLetterOut]:
        """Dead letters newest first: `async for dead in client.dlq.list()`."""
        pages: flows.Pages[DeadLetterOut] = flows.Pages()
        while not pages.done:
            page = await self.page(limit=page_size, offset=pages.offset, **filters)
            for dead in pages.take(page.dead_letters, page.total):
                yield dead

    async def page(
        self,
        *,
        limit: int | None = None,
        offset: int | None = None,
        **filters: Unpack[core.DeadSelection],
    ) -> DeadLetterList:
        """One page of dead letters, newest first, with the total (of those passing the
        filters)."""
        return await self._client.execute(core.dead_page(limit, offset, filters))

    async def get(self, dead_id: str) -> DeadLetterOut:
        """One dead letter."""
        return await self._client.execute(core.dead(dead_id))

    async def replay(self, dead_id: str) -> JobOut:
        """A fresh job from the letter."""
        return await self._client.execute(core.replay(dead_id))

    async def purge(self, dead_id: str) -> str:
        """Delete a dead letter; returns its id."""
        return await self._client.execute(core.purge(dead_id))

    async def replay_many(
        self, *, limit: int | None = None, **filters: Unpack[core.DeadFilters]
    ) -> BulkReplayed:
        """Replay the matching dead letters, oldest first (as `Client.dlq.replay_many`)."""
        sweep = flows.Sweep(limit)
        while (n := sweep.next_limit()) is not None:
            answer = await self._client.execute(core.replay_matching(filters, n))
            sweep.note(answer.replayed, answer.remaining)
        return BulkReplayed(sweep.done, sweep.remaining)

    async def purge_many(
        self, *, limit: int | None = None, **filters: Unpack[core.DeadFilters]
    ) -> BulkPurged:
        """Delete the matching dead letters, oldest first (as `Client.dlq.purge_many`)."""
        sweep = flows.Sweep(limit)
        while (n := sweep.next_limit()) is not None:
            answer = await self._client.execute(core.purge_matching(filters, n))
            sweep.note(answer.purged, answer.remaining)
        return BulkPurged(sweep.done, sweep.remaining)


class AsyncSchedules:
    """`client.schedules` of an `AsyncClient`: the node's periodic jobs."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    async def list(self) -> builtins.list[ScheduleOut]:
        """Every schedule: next fire, last fire and its job, enabled or not."""
        return await self._client.execute(core.schedules())

    async def enable(self, name: str) -> ScheduleOut:
        """Enable a schedule (with PostgreSQL for every node, across restarts)."""
        return await self._client.execute(core.set_schedule_enabled(name, True))

    async def disable(self, name: str) -> ScheduleOut:
        """Disable a schedule: its ticks enqueue nothing until it is enabled again."""
        return await self._client.execute(core.set_schedule_enabled(name, False))
