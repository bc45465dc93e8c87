"""`goqueue.AsyncClient`: the client for asyncio code, over one aiohttp session.

Every call is a `core.Call`, as in the blocking `Client`; only the transport differs.
The session (its keep-alive connection pool) is made on first use, on the running loop,
and is safe to share between the tasks of that loop; one client serves one loop.
"""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import AsyncIterator, Iterable, Mapping
from types import TracebackType
from typing import Any, TypeVar, Unpack

import aiohttp
import yarl
from goqueue.api.wire import (
    MAX_WAIT_SECONDS,
    BulkPurged,
    BulkReplayed,
    DeadLetterList,
    DeadLetterOut,
    JobList,
    JobOut,
    QueueStats,
    ScheduleOut,
    StatsOut,
)
from goqueue.client import core
from goqueue.client.core import (
    DEFAULT_TIMEOUT,
    PAGE_SIZE,
    Call,
    Endpoint,
    JobOptions,
    Retries,
    Submitted,
)
from goqueue.client.errors import ClientError, ConnectionFailed, RequestError, WaitTimeout
from goqueue.supervisor.jobs import Event, JobSpec

T = TypeVar("T")

MAX_CONNECTIONS = 32
RESUBMIT_PAUSE = 0.5


class AsyncClient:
    """A GoQueue node's API from asyncio code: `await client.enqueue("email", {...})`.

    The same arguments, defaults and retries as `Client`. Use it as `async with
    AsyncClient() as client:`, or `await client.close()` when done.
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
        self.endpoint = Endpoint.parse(core.url_from(url))
        self.api_key = core.key_from(api_key)
        self.timeout = timeout
        self.retries = retries or Retries()
        self.max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None
        self.dlq = AsyncDeadLetters(self)
        self.schedules = AsyncSchedules(self)

    @property
    def url(self) -> str:
        """The node's base URL."""
        return self.endpoint.url

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

    def __repr__(self) -> str:
        return f"AsyncClient({self.url!r})"

    # -- enqueue ---------------------------------------------------------------------------

    async def enqueue(
        self, type: str, payload: Any = None, **options: Unpack[JobOptions]
    ) -> JobOut:
        """Enqueue one job (see `Client.enqueue`)."""
        return (await self.submit(type, payload, **options)).job

    async def submit(
        self, type: str, payload: Any = None, **options: Unpack[JobOptions]
    ) -> Submitted:
        """`enqueue`, also saying whether this call created the job."""
        _, body = core.job_request(type, payload, options)
        given = options.get("idempotency_key")
        key = given or core.new_key()
        call = core.enqueue(body, key, made_key=not given, strict=options.get("strict", True))
        return await self.execute(call)

    async def enqueue_many(
        self, jobs: Iterable[JobSpec | Mapping[str, Any]], *, strict: bool = True
    ) -> builtins.list[JobOut | RequestError]:
        """Enqueue several jobs through the batch route (see `Client.enqueue_many`)."""
        checked = core.batch_bodies(jobs)
        bodies = [b for b in checked if isinstance(b, bytes)]
        answers: builtins.list[JobOut | RequestError] = []
        for chunk in core.chunks(bodies):
            got = await self.execute(core.batch(chunk, strict=strict))
            answers.extend(got)
        stored = iter(answers)
        return [next(stored) if isinstance(c, bytes) else c for c in checked]

    # -- jobs ------------------------------------------------------------------------------

    async def get(self, job_id: str) -> JobOut:
        """One job (NotFound if no job has that id)."""
        return await self.execute(core.get(job_id))

    async def wait(self, job_id: str, timeout: float | None = None) -> JobOut:
        """Wait for a job to finish (see `Client.wait`)."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            left = MAX_WAIT_SECONDS if deadline is None else deadline - loop.time()
            asked = min(max(left, 0.0), MAX_WAIT_SECONDS)
            started = loop.time()
            job = await self.execute(core.get(job_id, asked))
            if job.finished:
                return core.outcome(job)
            if deadline is not None and loop.time() >= deadline:
                raise WaitTimeout(job, timeout or 0.0)
            if loop.time() - started < asked / 2:  # the node ended the wait early
                await asyncio.sleep(RESUBMIT_PAUSE)

    async def list(
        self,
        *,
        type: str | None = None,
        status: str | None = None,
        queue: str | None = None,
        page_size: int = PAGE_SIZE,
    ) -> AsyncIterator[JobOut]:
        """Jobs newest first, filtered, fetched a page at a time: `async for job in ...`."""
        seen = core.Seen()
        offset = 0
        while True:
            page = await self.jobs_page(
                type=type, status=status, queue=queue, limit=page_size, offset=offset
            )
            for job in page.jobs:
                if seen.fresh(job.id):
                    yield job
            offset += len(page.jobs)
            if not page.jobs or offset >= page.total:
                return

    async def jobs_page(
        self,
        *,
        type: str | None = None,
        status: str | None = None,
        queue: str | None = None,
        limit: int | None = None,
        offset: int | None = None,
    ) -> JobList:
        """One page of jobs, newest first, with the total matching."""
        return await self.execute(core.jobs_page(type, status, queue, limit, offset))

    async def events(self, job_id: str) -> builtins.list[Event]:
        """A job's audit trail, oldest first."""
        return await self.execute(core.events(job_id))

    async def cancel(self, job_id: str, force: bool = False) -> JobOut:
        """Cancel a job (see `Client.cancel`)."""
        return await self.execute(core.cancel(job_id, force))

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
                if retry >= self.retries.attempts or not core.may_retry(call, exc):
                    raise
                retry += 1
                await asyncio.sleep(self.retries.delay(retry, exc))

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
                headers=core.headers(self.api_key, call),
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
        return core.answer(call, resp.status, body, resp.headers.get("Retry-After"))

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
        seen = core.Seen()
        offset = 0
        while True:
            page = await self.page(limit=page_size, offset=offset, **filters)
            for dead in page.dead_letters:
                if seen.fresh(dead.id):
                    yield dead
            offset += len(page.dead_letters)
            if not page.dead_letters or offset >= page.total:
                return

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
        sweep = core.Sweep(limit)
        while (n := sweep.next_limit()) is not None:
            answer = await self._client.execute(core.replay_matching(filters, n))
            sweep.note(answer.replayed, answer.remaining)
        return BulkReplayed(sweep.done, sweep.remaining)

    async def purge_many(
        self, *, limit: int | None = None, **filters: Unpack[core.DeadFilters]
    ) -> BulkPurged:
        """Delete the matching dead letters, oldest first (as `Client.dlq.purge_many`)."""
        sweep = core.Sweep(limit)
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
