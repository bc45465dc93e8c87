"""The PostgreSQL store: durable, and how several nodes share one queue.

Every claim is a lease (owner, token, expiry) taken with `FOR UPDATE SKIP LOCKED`; every
write about an attempt is fenced by the token. Per-type limits hold across nodes: a claim
of a limited type runs under a per-type advisory lock and counts what is running
everywhere. Dedupe and idempotency are table constraints inside the enqueue transaction.
Enqueues and completes are group-committed: those arriving while one commit is in flight
share the next transaction, each still answered on its own and only once committed.
Work made claimable is announced with NOTIFY on the schema's channel (coalesced, after
the commit); a listening connection on every node wakes its dispatcher. The
audit trail is buffered and written behind in batches. Times come from the database
clock (`now()`) so that nodes agree on leases, due-ness and windows.

This module is the `PostgresStore` itself; its parts live beside it: `pg_schema` (the
migrations and statements), `pg_rows` (adapters, row decoding, NUL cleaning),
`pg_group_commit` (the group commit), `pg_notify` (NOTIFY and LISTEN) and `pg_events`
(the audit trail writer).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager, suppress
from datetime import UTC, datetime
from typing import Any

import msgspec
import psycopg
from goqueue.supervisor.errors import (
    DuplicateJob,
    IdempotencyMismatch,
    InvalidState,
    NotFound,
    StoreFull,
    StoreUnavailable,
)
from goqueue.supervisor.jobs import (
    DEFAULT_MAX_RETRIES,
    STATUSES,
    DeadLetter,
    Enqueued,
    Event,
    Job,
    JobFilter,
    JobSpec,
    Lease,
    Outcome,
    Page,
    QueueStats,
    Stats,
    new_id,
)
from goqueue.supervisor.store import pg_rows, pg_schema
from goqueue.supervisor.store.base import NewJob
from goqueue.supervisor.store.pg_events import EventLog
from goqueue.supervisor.store.pg_group_commit import Batcher, Retry, group_or_each
from goqueue.supervisor.store.pg_notify import Listener, Notifier
from goqueue.supervisor.store.pg_rows import Row
from goqueue.supervisor.store.pg_schema import JOB_COLUMNS, N_JOB_COLUMNS, Queries
from goqueue.supervisor.summaries import (
    DeadBrief,
    DeadFilter,
    JobBrief,
    NodeSummary,
    Preview,
    QueueSummary,
)
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool, PoolClosed

log = logging.getLogger("goqueue.store.postgres")

Done = tuple[Lease, msgspec.Raw | None]  # a complete: the lease and the result


def _is_uuid(value: str) -> bool:
    try:
        uuid.UUID(value)
    except (ValueError, TypeError, AttributeError):
        return False
    return True


def _event(job: Job, kind: str, at: datetime, node: str, detail: str | None = None) -> Event:
    return Event(job_id=job.id, event=kind, at=at, node=node, attempt=job.attempts, detail=detail)


class PostgresStore:
    """The `Store` on PostgreSQL; several instances on one schema act as several nodes."""

    claim_ahead = True  # a claim is a round trip: the dispatcher keeps leases in hand

    def __init__(
        self,
        dsn: str,
        node_id: str,
        *,
        schema: str = "goqueue",
        lease_seconds: float = 30.0,
        idempotency_ttl: float = 86400.0,
        min_pool: int = 4,
        max_pool: int = 10,
        command_timeout: float = 10.0,
        max_pending: int | None = None,
    ) -> None:
        self.dsn = dsn
        self.node_id = node_id
        self.schema = pg_schema.check_schema_name(schema)
        self.lease_seconds = lease_seconds
        self.idempotency_ttl = idempotency_ttl
        self.min_pool = min_pool
        self.max_pool = max_pool
        self.command_timeout = command_timeout
        self.max_pending = max_pending
        self.channel = f"goqueue_{schema}"
        self.q = Queries(schema)
        self._adapters = pg_rows.adapters()
        self._pool: AsyncConnectionPool | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._check_task: asyncio.Task[None] | None = None
        self._log = EventLog(self.q.insert_events, self._connection)
        self._notifier = Notifier(node_id, self._send_notify)
        self._enqueues = Batcher(self._write_enqueues, limit=1000)
        self._completes = Batcher(self._write_completes, limit=1000)
        self._wake: Callable[[], None] = lambda: None
        self._next_due: datetime | None = None
        self._limits: dict[str, int | None] | None = None
        self._known: tuple[float, frozenset[str]] = (0.0, frozenset())
        self._pending_estimate: tuple[float, int] = (0.0, 0)
        self._down = False  # the last operation failed to reach the database
        self._limited: set[str] = set()  # types under a global limit, as of the last claim
        self._serves: frozenset[str] | None = None  # the queues claimed from (None: all)
        self._lanes: dict[str, AsyncConnection] = {}  # connections kept (see _connection)

    # -- lifecycle -------------------------------------------------------------------

    def _connect_kwargs(self) -> dict[str, Any]:
        return {
            "connect_timeout": max(2, round(self.command_timeout)),
            "application_name": f"goqueue/{self.node_id}"[:63],
            "context": self._adapters,
        }

    async def _configure(self, conn: AsyncConnection) -> None:
        """Per-connection settings: UTC times, bounded statements and idle transactions,
        and no JIT (compiling costs more than these short statements ever take)."""
        ms = int(self.command_timeout * 1000)
        await conn.execute(
            f"SET TIME ZONE 'UTC'; SET statement_timeout = {ms}; SET jit = off;"
            f" SET idle_in_transaction_session_timeout = {max(ms * 3, 30_000)}"
        )

    async def open(self) -> None:
        """Migrate the schema, open the pool, start the listener and the event writer."""
        if self._pool is not None:
            return
        try:
            conn = await AsyncConnection.connect(
                self.dsn, autocommit=True, **self._connect_kwargs()
            )
            async with conn:
                await self._configure(conn)
                await pg_schema.migrate(conn, self.schema)
        except psycopg.Error as exc:
            raise StoreUnavailable(f"PostgreSQL unavailable: {exc}") from exc
        pool = AsyncConnectionPool(
            self.dsn,
            min_size=self.min_pool,
            max_size=self.max_pool,
            open=False,
            timeout=self.command_timeout,
            kwargs={"autocommit": True, **self._connect_kwargs()},
            configure=self._configure,
            # Give up on background reconnection soon: the next request that finds the
            # pool short of connections starts a fresh attempt, so recovery after a long
            # outage does not wait out an ever longer backoff.
            reconnect_timeout=max(2.0, self.command_timeout),
            name=f"goqueue-{self.node_id}",
        )
        try:
            await pool.open(wait=True, timeout=self.command_timeout)
        except psycopg.Error as exc:
            await pool.close()
            raise StoreUnavailable(f"PostgreSQL unavailable: {exc}") from exc
        self._pool = pool
        listener = Listener(
            self.dsn, self.channel, self._connect_kwargs(), self._on_note, self._call_waker
        )
        self._tasks = [
            asyncio.create_task(listener.run(), name="goqueue-pg-listen"),
            asyncio.create_task(self._log.run(), name="goqueue-pg-events"),
            asyncio.create_task(self._maintain(), name="goqueue-pg-maintain"),
            asyncio.create_task(self._beat(), name="goqueue-pg-beat"),
        ]
        with suppress(TimeoutError):
            await asyncio.wait_for(listener.listening.wait(), timeout=self.command_timeout)
        with suppress(StoreUnavailable):
            async with self._connection() as conn:
                self._next_due = await self._scalar(conn, self.q.next_due_any, {})

    async def close(self) -> None:
        """Write the remaining events, leave the node table, stop tasks, close the pool."""
        if self._pool is None:
            return
        for batcher in (self._enqueues, self._completes):
            await batcher.idle(self.command_timeout)
        await self._notifier.close()
        with suppress(StoreUnavailable, TimeoutError):
            async with asyncio.timeout(self.command_timeout):
                await self._log.flush()
        if self._limits is not None:
            with suppress(StoreUnavailable):
                await self._execute(self.q.forget_node, {"node": self.node_id})
        self._enqueues.cancel()
        self._completes.cancel()
        for conn in self._lanes.values():
            await self._pool.putconn(conn)
        self._lanes.clear()
        tasks = [t for t in (*self._tasks, self._check_task) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks = []
        pool, self._pool = self._pool, None
        await pool.close()

    async def ping(self) -> bool:
        """True when a trivial query answers."""
        try:
            await self._execute("SELECT 1", {})
        except StoreUnavailable:
            return False
        return True

    async def _beat(self) -> None:
        """Keep this node's row alive while the process is (its limits and types count
        only while its heartbeat is recent); re-creates the row if it was removed."""
        while True:
            await asyncio.sleep(max(0.05, self.lease_seconds / 2))
            if self._limits is None:
                continue
            try:
                await self._execute(
                    self.q.register, {"node": self.node_id, "limits": pg_rows.raw(self._limits)}
                )
            except StoreUnavailable as exc:
                log.warning("node heartbeat failed", extra={"err": str(exc)})

    async def _maintain(self) -> None:
        """Drop expired dedupe / idempotency keys and long-dead nodes, now and then."""
        while True:
            await asyncio.sleep(30.0)
            try:
                await self._execute(self.q.expire_keys, {})
            except StoreUnavailable as exc:
                log.info("key expiry skipped: store unavailable", extra={"err": str(exc)})

    # -- connections and errors ------------------------------------------------------

    @asynccontextmanager
    async def _connection(self, lane: str | None = None) -> AsyncIterator[AsyncConnection]:
        """A pooled connection; every database fault becomes StoreUnavailable, and no
        operation waits longer than `command_timeout` (nor over a second for a connection
        while the database is known to be down, so callers answer 503 promptly).

        With a `lane` (a kind of write done one at a time: a group commit) the connection
        is kept for the lane's next write instead of going back to the pool each time;
        after an error it does go back (and the pool drops it if it is broken)."""
        pool = self._pool
        if pool is None:
            raise StoreUnavailable("the PostgreSQL store is not open")
        wait = min(1.0, self.command_timeout) if self._down else self.command_timeout
        try:
            async with (
                asyncio.timeout(self.command_timeout),
                pool.connection(timeout=wait) if lane is None else self._kept(lane, wait) as conn,
            ):
                yield conn
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            self._fault()
            raise StoreUnavailable(f"PostgreSQL unavailable: {exc}") from exc
        except TimeoutError as exc:
            self._fault()
            raise StoreUnavailable(
                f"PostgreSQL did not answer within {self.command_timeout:g}s"
            ) from exc
        except PoolClosed as exc:
            raise StoreUnavailable("the PostgreSQL store is closed") from exc
        self._down = False

    @asynccontextmanager
    async def _kept(self, lane: str, wait: float) -> AsyncIterator[AsyncConnection]:
        """The lane's connection (see `_connection`)."""
        pool = self._pool
        assert pool is not None
        conn = self._lanes.pop(lane, None) or await pool.getconn(timeout=wait)
        try:
            yield conn
        except BaseException:
            await pool.putconn(conn)
            raise
        idle = conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        if idle and self._pool is pool and lane not in self._lanes:
            self._lanes[lane] = conn
        else:
            await pool.putconn(conn)

    def _fault(self) -> None:
        """After a fault, have the pool test its idle connections (the lanes' kept ones
        too) and replace dead ones, so one outage does not fail one request per stale
        connection afterwards."""
        self._down = True
        if self._pool is None or (self._check_task is not None and not self._check_task.done()):
            return
        self._check_task = asyncio.create_task(self._check(self._pool))

    async def _check(self, pool: AsyncConnectionPool) -> None:
        """Hand the lanes' connections back, then have the pool check the idle ones."""
        kept = list(self._lanes.values())
        self._lanes.clear()
        for conn in kept:
            await pool.putconn(conn)
        await pool.check()

    async def _execute(self, query: str, params: Mapping[str, Any]) -> list[Row]:
        """Run one statement on a pooled connection; return its rows (if any)."""
        async with self._connection() as conn:
            cur = await conn.execute(query, params)
            result = cur.pgresult  # not `description`: it builds a Column per column
            return await cur.fetchall() if result is not None and result.nfields else []

    @staticmethod
    async def _scalar(conn: AsyncConnection, query: str, params: Mapping[str, Any]) -> Any:
        cur = await conn.execute(query, params)
        row = await cur.fetchone()
        return None if row is None else row[0]

    # -- waking ----------------------------------------------------------------------

    def set_waker(self, wake: object) -> None:
        """Remember the dispatcher's zero-argument wake-up callable."""
        self._wake = wake  # type: ignore[assignment]

    def _call_waker(self) -> None:
        try:
            self._wake()
        except Exception:
            log.exception("waker failed")

    def _on_note(self, node: str, due: datetime | None) -> None:
        if node == self.node_id:
            return  # woken already, right after our own commit
        self._saw_due(due)
        self._call_waker()

    def _saw_due(self, due: datetime | None) -> None:
        """Remember a job scheduled for later (one due already needs no timer)."""
        if due is None or due <= datetime.now(UTC):
            return
        if self._next_due is None or due < self._next_due:
            self._next_due = due

    def _enqueued(self, jobs: Sequence[Job], events: Sequence[Event]) -> None:
        """After a commit that made jobs pending: log, remember due times, wake this
        node (if it claims from their queues) and (NOTIFY) the others."""
        self._log.add(events)
        if not jobs:
            return
        now = datetime.now(UTC)
        later = [job.run_at for job in jobs if job.run_at > now]
        due = min(later) if later else None
        self._saw_due(due)
        self._notifier.poke(due)
        serves = self._serves
        if serves is None or any(job.queue in serves for job in jobs):
            self._call_waker()  # not for work only other nodes' queues hold: no idle claims

    def _freed(self, job: Job) -> None:
        """A job stopped running. If its type is under a global limit, a slot opened
        that a claim made a moment ago (before this commit) could not see: wake this
        node's dispatcher and the others' to claim again."""
        if job.type in self._limited:
            self._notifier.poke(None)
            self._call_waker()

    async def _send_notify(self, payload: str) -> None:
        await self._execute(self.q.notify, {"channel": self.channel, "payload": payload})

    @property
    def buffered_events(self) -> int:
        """Audit events not yet written (they pile up while the database is down)."""
        return len(self._log)

    def next_due_at(self) -> datetime | None:
        """The earliest run_at still ahead among scheduled jobs, as of the last claim or
        notification. Once it has passed this is None until the next claim refreshes it:
        the job is due, and answering a past time would make a dispatcher with no free
        worker spin on its timer."""
        due = self._next_due
        return due if due is not None and due > datetime.now(UTC) else None

    # -- nodes -----------------------------------------------------------------------

    async def register_node(self, limits: Mapping[str, int | None]) -> None:
        """Declare this node alive with its types and per-type limits."""
        self._limits = dict(limits)
        self._known = (0.0, frozenset())
        await self._execute(
            self.q.register, {"node": self.node_id, "limits": pg_rows.raw(self._limits)}
        )

    async def known_types(self) -> frozenset[str]:
        """Types some live node runs (cached for a second: it is asked on every enqueue)."""
        at, types = self._known
        if time.monotonic() - at < 1.0:
            return types
        rows = await self._execute(self.q.known_types, {"live": self._live_window()})
        types = frozenset(r[0] for r in rows) | frozenset(self._limits or ())
        self._known = (time.monotonic(), types)
        return types

    def _live_window(self) -> float:
        return 3 * self.lease_seconds

    # -- enqueue ---------------------------------------------------------------------

    async def enqueue(self, new: NewJob) -> Enqueued:
        """Store one job. Enqueues arriving while another's commit is in flight share the
        next transaction (group commit); each returns once its job is committed. Dedupe
        and idempotency are checked in that transaction, each call answered on its own."""
        for _ in range(3):
            with suppress(Retry):
                return await self._enqueues.submit(new)
        raise StoreUnavailable("the enqueue kept losing deadlocks on its keys; retry")

    async def _write_enqueues(self, news: list[NewJob]) -> list[Enqueued | Exception]:
        """Write one group of enqueues (see `group_or_each`)."""
        return await group_or_each(self._store_group, news)

    async def _store_group(self, news: list[NewJob]) -> list[Enqueued | Exception]:
        """Store a group of enqueues in one transaction on the enqueue lane."""
        return await self._store_jobs(news, sort_keys=True, lane="enqueue")

    async def enqueue_many(self, news: Sequence[NewJob]) -> list[Enqueued | Exception]:
        """Store several jobs in one transaction, each answered on its own (a job whose
        keys lost a deadlock is written again, in a transaction of its own)."""
        answers = await self._store_jobs(news, sort_keys=False) if news else []
        for i, answer in enumerate(answers):
            if isinstance(answer, Retry):
                try:
                    answers[i] = await self.enqueue(news[i])
                except Exception as exc:  # this job's answer, like any refusal
                    answers[i] = exc
        return answers

    async def _store_jobs(
        self, news: Sequence[NewJob], *, sort_keys: bool, lane: str | None = None
    ) -> list[Enqueued | Exception]:
        """Store jobs in one transaction, each answered on its own.

        The plain jobs go in one statement: without keyed ones that is the whole
        transaction, one round trip. A job with a dedupe or idempotency key gets a
        savepoint first, so its refusal undoes only itself; in key order when `sort_keys`
        (a group's order is arbitrary anyway), so two nodes rarely wait on each other.
        """
        answers: list[Enqueued | Exception | None] = [None] * len(news)
        events: list[Event] = []
        keyed = [i for i, new in enumerate(news) if self._keyed(new)]
        if sort_keys:
            keyed.sort(key=lambda i: (news[i].idempotency_key or "", news[i].spec.dedupe_key or ""))
        plain = [i for i, new in enumerate(news) if not self._keyed(new)]
        async with self._connection(lane) as conn:
            if keyed:
                async with conn.pipeline(), conn.transaction():
                    for i in keyed:
                        answers[i] = await self._enqueue_keyed(conn, news[i], events)
                    await self._add_plain(conn, news, plain, answers, events)
            else:
                await self._add_plain(conn, news, plain, answers, events)
        done = [a for a in answers if a is not None]
        assert len(done) == len(news)
        self._enqueued([a.job for a in done if isinstance(a, Enqueued) and a.created], events)
        return done

    async def _enqueue_keyed(
        self, conn: AsyncConnection, new: NewJob, events: list[Event]
    ) -> Enqueued | Exception:
        """Enqueue a job with keys in a savepoint; a refusal is its answer."""
        mark = len(events)
        try:
            async with conn.transaction():
                return await self._enqueue_in(conn, new, events)
        except (DuplicateJob, IdempotencyMismatch, StoreFull, StoreUnavailable) as exc:
            del events[mark:]
            return exc
        except psycopg.errors.DeadlockDetected:
            del events[mark:]
            return Retry()

    async def _add_plain(
        self,
        conn: AsyncConnection,
        news: Sequence[NewJob],
        indexes: list[int],
        answers: list[Enqueued | Exception | None],
        events: list[Event],
    ) -> None:
        """Insert the jobs without keys (`news[i]` for i in `indexes`) in one statement."""
        todo: list[tuple[int, dict[str, Any]]] = []
        for i in indexes:
            try:
                await self._check_capacity(conn)
            except StoreFull as exc:
                answers[i] = exc
                continue
            todo.append((i, self._insert_params(news[i].spec, news[i].max_retries)))
        if not todo:
            return
        if len(todo) == 1:
            cur = await conn.execute(self.q.add_job, todo[0][1])
            row = await cur.fetchone()
            assert row is not None
            decided = {todo[0][1]["id"]: row}
        else:
            cur = await conn.execute(self.q.add_jobs, pg_rows.columns([p for _, p in todo]))
            decided = {r[0]: r[1:] for r in await cur.fetchall()}
        for i, params in todo:
            job = pg_rows.pending(params, news[i].spec, decided[params["id"]])
            events.append(_event(job, "enqueued", job.created_at, self.node_id))
            answers[i] = Enqueued(job, created=True)

    def _keyed(self, new: NewJob) -> bool:
        return new.idempotency_key is not None or self._dedupes(new.spec)

    @staticmethod
    def _dedupes(spec: JobSpec) -> bool:
        return spec.dedupe_key is not None and bool(spec.dedupe_window_seconds)

    async def _enqueue_in(
        self, conn: AsyncConnection, new: NewJob, events: list[Event]
    ) -> Enqueued:
        """The enqueue steps, inside the caller's transaction when there are keys."""
        job_id = new_id()
        if new.idempotency_key is not None:
            original = await self._take_idempotency_key(conn, new, job_id)
            if original is not None:
                return Enqueued(original, created=False)
        if self._dedupes(new.spec):
            await self._take_dedupe_key(conn, new.spec, job_id)
        await self._check_capacity(conn)
        job = await self._insert(conn, new.spec, new.max_retries, None, job_id)
        events.append(_event(job, "enqueued", job.created_at, self.node_id))
        return Enqueued(job, created=True)

    async def _take_idempotency_key(
        self, conn: AsyncConnection, new: NewJob, job_id: str
    ) -> Job | None:
        """Claim the key for `job_id`, or return the job it already names (same body)."""
        params = {
            "key": pg_rows.text(new.idempotency_key),
            "hash": pg_rows.text(new.request_hash) or "",
            "id": job_id,
            "ttl": self.idempotency_ttl,
        }
        if await self._scalar(conn, self.q.claim_idempotency, params) is not None:
            return None
        cur = await conn.execute(self.q.idempotency_holder, params)
        held = await cur.fetchone()
        if held is None:  # deleted meanwhile by expiry: ours to take on a retry
            raise StoreUnavailable("idempotency key changed concurrently; retry")
        if held[0] != (pg_rows.text(new.request_hash) or ""):
            raise IdempotencyMismatch(held[1])
        cur = await conn.execute(self.q.get, {"id": held[1]})
        row = await cur.fetchone()
        if row is None:
            raise StoreUnavailable(f"idempotency key names a missing job {held[1]}")
        return pg_rows.job(row)

    async def _take_dedupe_key(self, conn: AsyncConnection, spec: JobSpec, job_id: str) -> None:
        """Hold the dedupe key for the window, or raise DuplicateJob naming its holder."""
        params = {
            "key": pg_rows.text(spec.dedupe_key),
            "id": job_id,
            "window": spec.dedupe_window_seconds,
        }
        if await self._scalar(conn, self.q.claim_dedupe, params) is not None:
            return
        holder = await self._scalar(conn, self.q.dedupe_holder, params)
        raise DuplicateJob(holder or "unknown")

    async def _check_capacity(self, conn: AsyncConnection) -> None:
        """Enforce `max_pending` from a count refreshed at most once a second."""
        if self.max_pending is None:
            return
        at, count = self._pending_estimate
        if time.monotonic() - at >= 1.0:
            count = int(await self._scalar(conn, self.q.count_pending, {}))
            at = time.monotonic()
        if count >= self.max_pending:
            raise StoreFull(f"the queue is full ({self.max_pending} pending jobs)")
        self._pending_estimate = (at, count + 1)

    async def _insert(
        self,
        conn: AsyncConnection,
        spec: JobSpec,
        max_retries: int,
        parent_id: str | None,
        job_id: str | None = None,
    ) -> Job:
        """Insert a pending job."""
        params = self._insert_params(spec, max_retries, parent_id, job_id)
        cur = await conn.execute(self.q.insert_job, params)
        row = await cur.fetchone()
        assert row is not None
        return pg_rows.job(row)

    def _insert_params(
        self,
        spec: JobSpec,
        max_retries: int,
        parent_id: str | None = None,
        job_id: str | None = None,
    ) -> dict[str, Any]:
        return {
            "id": job_id or new_id(),
            "type": spec.type,
            "queue": spec.queue,
            "payload": spec.payload,
            "priority": spec.priority,
            "max_retries": max_retries,
            "run_at": spec.run_at,
            "delay": spec.delay_seconds or 0.0,
            "timeout": spec.timeout_seconds,
            "dedupe_key": pg_rows.text(spec.dedupe_key),
            "webhook_url": pg_rows.text(spec.webhook_url),
            "on_success": pg_rows.raw(spec.on_success),
            "on_failure": pg_rows.raw(spec.on_failure),
            "parent_id": parent_id,
        }

    async def _follow_up(
        self, conn: AsyncConnection, spec: JobSpec | None, parent: Job, events: list[Event]
    ) -> list[Job]:
        """Chain a template (no max_pending check: the parent already had its place)."""
        if spec is None:
            return []
        max_retries = spec.max_retries if spec.max_retries is not None else DEFAULT_MAX_RETRIES
        job = await self._insert(conn, spec, max_retries, parent.id)
        events.append(_event(job, "enqueued", job.created_at, self.node_id, f"after {parent.id}"))
        return [job]

    # -- claiming --------------------------------------------------------------------

    async def claim(
        self, limit: int, queues: frozenset[str] | None, slots: Mapping[str, int]
    ) -> list[Lease]:
        """Take up to `limit` due jobs as leases, within this node's slots and the global
        per-type limits: one statement (the schema's claim function), one round trip."""
        types = sorted(t for t, n in slots.items() if n > 0)
        if limit <= 0 or not types:
            return []
        params = {
            "types": types,
            "caps": [slots[t] for t in types],
            "queues": None if queues is None else sorted(queues),
            "limit": limit,
            "node": self.node_id,
            "lease": self.lease_seconds,
            "live": self._live_window(),
            "lock_ns": f"goqueue.type.{self.schema}.",
        }
        *rows, last = await self._execute(self.q.claim, params)
        self._next_due, limited = last[-2], last[-1]
        self._serves = queues
        self._limited = (self._limited - set(types)) | set(limited)
        leases = [self._lease(row) for row in rows]
        leases.sort(key=lambda lease: (-lease.job.priority, lease.job.run_at, lease.job.seq))
        self._log.add([_event(x.job, "started", x.job.started_at, self.node_id) for x in leases])
        return leases

    @staticmethod
    def _lease(row: Row) -> Lease:
        n = N_JOB_COLUMNS
        return Lease(job=pg_rows.job(row), token=row[n], owner=row[n + 1], expires_at=row[n + 2])

    async def heartbeat(self, leases: Sequence[Lease], lease_seconds: float) -> list[str]:
        """Extend the leases still held; return the tokens that are not."""
        if not leases:
            return []
        params = {
            "ids": [x.job.id for x in leases],
            "tokens": [x.token for x in leases],
            "lease": lease_seconds,
        }
        held = {row[0] for row in await self._execute(self.q.heartbeat, params)}
        return [x.token for x in leases if x.token not in held]

    async def reap_expired(self) -> list[Job]:
        """Return jobs whose lease ran out to pending (the lost attempt counts), or
        dead-letter them when it was their last; several nodes may reap at once."""
        touched: list[Job] = []
        pending: list[Job] = []  # requeued jobs and on_failure follow-ups
        events: list[Event] = []
        async with self._connection() as conn, conn.transaction():
            cur = await conn.execute(self.q.expired, {"limit": 100})
            for expired in await cur.fetchall():
                outcome = await self._reap_one(conn, expired, events)
                touched.append(outcome.job)
                pending.extend(outcome.followups)
                if outcome.job.status == "pending":
                    pending.append(outcome.job)
        self._enqueued(pending, events)
        for job in touched:
            self._freed(job)
        return touched

    async def _reap_one(self, conn: AsyncConnection, expired: Row, events: list[Event]) -> Outcome:
        """Requeue (or bury) one job whose lease ran out; its row is locked already."""
        job_id, token, owner, attempts, max_retries = expired
        error = pg_rows.text(f"lease expired (node {owner} lost)") or ""
        params = {"id": job_id, "token": token, "error": error, "retry_at": None}
        mark = len(events)
        if attempts > max_retries:
            outcome = await self._bury(conn, params, events)
        else:
            cur = await conn.execute(self.q.retry, params)
            row = await cur.fetchone()
            outcome = None if row is None else Outcome(pg_rows.job(row), [])
        assert outcome is not None  # locked FOR UPDATE, so the fence still holds
        job = outcome.job
        events.insert(mark, _event(job, "lease_expired", job.updated_at, self.node_id, error))
        return outcome

    # -- outcomes --------------------------------------------------------------------

    async def complete(self, lease: Lease, result: msgspec.Raw | None) -> Outcome | None:
        """Record success and enqueue `on_success` atomically; None if the lease is stale.
        Completes arriving while another's commit is in flight share the next transaction
        (group commit), one statement for all of them unless some chain a job."""
        return await self._completes.submit((lease, result))

    async def _write_completes(self, items: list[Done]) -> list[Outcome | Exception | None]:
        """Write one group of completes (see `group_or_each`)."""
        return await group_or_each(self._complete_group, items)

    async def _complete_group(self, items: list[Done]) -> list[Outcome | None]:
        """Complete several leases in one transaction; each is fenced by its own token."""
        events: list[Event] = []
        async with self._connection("complete") as conn:
            if all(lease.job.on_success is None for lease, _ in items):
                outcomes = await self._complete_in(conn, items, events)
            else:  # pipelined: BEGIN goes with the update, COMMIT with the last insert
                async with conn.pipeline(), conn.transaction():
                    outcomes = await self._complete_in(conn, items, events)
        done = [outcome for outcome in outcomes if outcome is not None]
        self._enqueued([job for outcome in done for job in outcome.followups], events)
        for outcome in done:
            self._freed(outcome.job)
        return outcomes

    async def _complete_in(
        self, conn: AsyncConnection, items: list[Done], events: list[Event]
    ) -> list[Outcome | None]:
        """Mark the group's jobs done (one statement), then chain their `on_success`."""
        if len(items) == 1:
            lease, result = items[0]
            params = {"id": lease.job.id, "token": lease.token, "result": result}
            cur = await conn.execute(self.q.complete, params)
            row = await cur.fetchone()
            finished = {} if row is None else {(lease.job.id, lease.token): row[0]}
        else:
            params = {
                "ids": [lease.job.id for lease, _ in items],
                "tokens": [lease.token for lease, _ in items],
                "results": [None if r is None else bytes(r).decode() for _, r in items],
            }
            cur = await conn.execute(self.q.complete_many, params)
            finished = {(r[0], r[1]): r[2] for r in await cur.fetchall()}
        outcomes: list[Outcome | None] = []
        for lease, result in items:
            at = finished.pop((lease.job.id, lease.token), None)  # a repeat is stale
            if at is None:
                outcomes.append(None)
                continue
            job = msgspec.structs.replace(
                lease.job, status="done", result=result, finished_at=at, updated_at=at
            )
            events.append(_event(job, "succeeded", at, self.node_id))
            outcomes.append(Outcome(job, await self._follow_up(conn, job.on_success, job, events)))
        return outcomes

    async def fail(self, lease: Lease, error: str, retry_at: datetime | None) -> Outcome | None:
        """Record a failed attempt: pending again at `retry_at`, or dead-lettered (with
        `on_failure` enqueued) in one transaction. None if the lease is stale."""
        error = pg_rows.text(error) or ""
        params = {"id": lease.job.id, "token": lease.token, "error": error}
        if retry_at is not None:
            return await self._retry(params | {"retry_at": retry_at})
        events: list[Event] = []
        async with self._connection() as conn, conn.pipeline(), conn.transaction():
            outcome = await self._bury(conn, params, events)
        if outcome is not None:
            self._enqueued(outcome.followups, events)
            self._freed(outcome.job)
        return outcome

    async def _retry(self, params: Mapping[str, Any]) -> Outcome | None:
        """Make the job pending again at `retry_at`, recording the attempt's error."""
        rows = await self._execute(self.q.retry, params)
        if not rows:
            return None
        job = pg_rows.job(rows[0])
        error, detail = params["error"], job.run_at.isoformat()
        self._enqueued(
            [job],
            [
                _event(job, "attempt_failed", job.updated_at, self.node_id, error),
                _event(job, "retry_scheduled", job.updated_at, self.node_id, detail),
            ],
        )
        return Outcome(job, [])

    async def _bury(
        self, conn: AsyncConnection, params: Mapping[str, Any], events: list[Event]
    ) -> Outcome | None:
        """Mark the job failed, archive it as a dead letter, chain `on_failure`."""
        cur = await conn.execute(self.q.bury, params)
        row = await cur.fetchone()
        if row is None:
            return None
        job = pg_rows.job(row)
        assert job.finished_at is not None
        dead = DeadLetter(
            id=new_id(), job_id=job.id, job=job, errors=job.errors, created_at=job.finished_at
        )
        await conn.execute(
            self.q.insert_dead,
            {
                "id": dead.id,
                "job_id": job.id,
                "job": pg_rows.raw(job),
                "errors": pg_rows.raw(dead.errors),
                "created_at": dead.created_at,
            },
        )
        events.append(_event(job, "attempt_failed", job.finished_at, self.node_id, job.last_error))
        events.append(_event(job, "dead_lettered", job.finished_at, self.node_id, dead.id))
        followups = await self._follow_up(conn, job.on_failure, job, events)
        return Outcome(job, followups, dead)

    async def release(self, lease: Lease) -> bool:
        """Hand the job back to pending without counting the attempt."""
        params = {"id": lease.job.id, "token": lease.token}
        rows = await self._execute(self.q.release, params)
        if not rows:
            return False
        job = pg_rows.job(rows[0])
        self._enqueued([job], [_event(job, "released", job.updated_at, self.node_id)])
        return True

    async def cancel(self, job_id: str, force: bool) -> tuple[Job, str | None]:
        """Cancel a pending job, or a running one with `force` (its lease is cleared, so
        the holder is fenced out; its token is returned to kill the worker)."""
        if not _is_uuid(job_id):
            raise NotFound(f"job {job_id} not found")
        async with self._connection() as conn, conn.transaction():
            cur = await conn.execute(self.q.lock_job, {"id": job_id})
            found = await cur.fetchone()
            if found is None:
                raise NotFound(f"job {job_id} not found")
            status, token = found
            if status in ("done", "failed", "cancelled"):
                raise InvalidState(f"job {job_id} is already {status}", status)
            if status == "running" and not force:
                raise InvalidState(f"job {job_id} is running; use force=true to kill it", "running")
            cur = await conn.execute(self.q.cancel, {"id": job_id})
            row = await cur.fetchone()
        assert row is not None
        job = pg_rows.job(row)
        self._log.add([_event(job, "cancelled", job.updated_at, self.node_id)])
        if status != "running":
            return job, None
        self._freed(job)
        return job, token

    # -- reads -----------------------------------------------------------------------

    async def get(self, job_id: str) -> Job | None:
        """One job by id (None for an unknown or malformed id)."""
        if not _is_uuid(job_id):
            return None
        rows = await self._execute(self.q.get, {"id": job_id})
        return pg_rows.job(rows[0]) if rows else None

    async def list_jobs(self, filters: JobFilter, limit: int, offset: int) -> Page:
        """Jobs newest first, and how many match."""
        conds = [
            f"{col} = %({col})s" for col in ("type", "status", "queue") if getattr(filters, col)
        ]
        where = f" WHERE {' AND '.join(conds)}" if conds else ""
        params = {
            "type": filters.type,
            "status": filters.status,
            "queue": filters.queue,
            "limit": limit,
            "offset": offset,
        }
        page_sql = (
            f"SELECT {JOB_COLUMNS} FROM {self.q.jobs_from}{where}"
            " ORDER BY created_at DESC, seq DESC LIMIT %(limit)s OFFSET %(offset)s"
        )
        async with self._connection() as conn:
            async with conn.pipeline():
                page = await conn.execute(page_sql, params)
                total = await conn.execute(
                    f"SELECT count(*) FROM {self.q.jobs_from}{where}", params
                )
            rows = await page.fetchall()
            count = await total.fetchone()
        return Page([pg_rows.job(r) for r in rows], int(count[0]) if count else 0)

    async def stats(self) -> Stats:
        """Counts by status (all present), pending depth by queue and priority, dead letters."""
        async with self._connection() as conn:
            async with conn.pipeline():
                by_status = await conn.execute(self.q.counts)
                depth = await conn.execute(self.q.depth)
                dead = await conn.execute(self.q.dead_count)
            counts = dict.fromkeys(STATUSES, 0) | dict(await by_status.fetchall())
            queues: dict[str, dict[str, int]] = {}
            for queue, priority, n in sorted(await depth.fetchall(), key=lambda r: (r[0], -r[1])):
                queues.setdefault(queue, {})[str(priority)] = n
            dead_row = await dead.fetchone()
        return Stats(counts, queues, int(dead_row[0]) if dead_row else 0)

    async def queue_stats(self, queue: str) -> QueueStats:
        """One queue's counts by status and pending depth by priority."""
        params = {"queue": queue}
        async with self._connection() as conn:
            async with conn.pipeline():
                by_status = await conn.execute(self.q.queue_counts, params)
                depth = await conn.execute(self.q.queue_depth, params)
                paused = await conn.execute(self.q.is_paused, params)
            counts = dict.fromkeys(STATUSES, 0) | dict(await by_status.fetchall())
            by_priority = {str(p): n for p, n in sorted(await depth.fetchall(), reverse=True)}
            paused_row = await paused.fetchone()
        return QueueStats(queue, counts, by_priority, bool(paused_row and paused_row[0]))

    async def set_paused(self, queue: str, paused: bool) -> None:
        """Pause or resume a queue for every node; resuming wakes them."""
        if paused:
            await self._execute(self.q.pause, {"queue": queue})
            return
        await self._execute(self.q.resume, {"queue": queue})
        self._notifier.poke(None)
        self._call_waker()

    async def paused_queues(self) -> frozenset[str]:
        """The queues currently paused."""
        return frozenset(r[0] for r in await self._execute(self.q.paused, {}))

    async def events(self, job_id: str) -> list[Event]:
        """A job's audit trail, oldest first (buffered events are written first)."""
        if not _is_uuid(job_id):
            return []
        await self._log.flush()
        rows = await self._execute(self.q.events, {"id": job_id})
        return [
            Event(job_id=r[0], event=r[1], at=r[2], node=r[3], attempt=r[4], detail=r[5])
            for r in rows
        ]

    # -- dead letters ----------------------------------------------------------------

    async def list_dead(self, limit: int, offset: int) -> Page:
        """Dead letters newest first."""
        async with self._connection() as conn:
            async with conn.pipeline():
                page = await conn.execute(self.q.list_dead, {"limit": limit, "offset": offset})
                total = await conn.execute(self.q.dead_count)
            rows = await page.fetchall()
            count = await total.fetchone()
        return Page([pg_rows.dead(r) for r in rows], int(count[0]) if count else 0)

    async def get_dead(self, dead_id: str) -> DeadLetter | None:
        """One dead letter by its own id."""
        if not _is_uuid(dead_id):
            return None
        rows = await self._execute(self.q.get_dead, {"id": dead_id})
        return pg_rows.dead(rows[0]) if rows else None

    async def replay_dead(self, dead_id: str, max_retries: int) -> Job:
        """Insert a fresh job from the letter and delete the letter, in one transaction."""
        if not _is_uuid(dead_id):
            raise NotFound(f"dead letter {dead_id} not found")
        events: list[Event] = []
        async with self._connection() as conn, conn.transaction():
            cur = await conn.execute(self.q.take_dead, {"id": dead_id})
            row = await cur.fetchone()
            if row is None:
                raise NotFound(f"dead letter {dead_id} not found")
            dead = pg_rows.dead(row)
            await self._check_capacity(conn)
            job = await self._insert(conn, dead.job.replay_spec(), max_retries, None)
            events.append(_event(job, "enqueued", job.created_at, self.node_id))
            events.append(_event(job, "replayed", job.created_at, self.node_id, dead.job_id))
        self._enqueued([job], events)
        return job

    async def prune(self, finished_before: datetime, limit: int) -> int:
        """Delete old finished jobs and their audit trails, oldest first."""
        await self._log.flush()  # so no buffered event of a pruned job lands afterwards
        rows = await self._execute(self.q.prune, {"before": finished_before, "limit": limit})
        return int(rows[0][0]) if rows else 0

    async def purge_dead(self, dead_id: str) -> bool:
        """Delete a dead letter; False if there was none."""
        if not _is_uuid(dead_id):
            return False
        async with self._connection() as conn:
            cur = await conn.execute(self.q.purge_dead, {"id": dead_id})
            return cur.rowcount > 0

    # -- summaries for operators (the dashboard, issue 13) ---------------------------
    # Kept together at the end, with their SQL below the class, so the store's split by
    # role can move them whole.

    async def queue_summaries(self) -> list[QueueSummary]:
        """Every queue with pending or running jobs, and every paused one: one pass over
        the pending jobs (the same cost as `stats`), one over the running ones."""
        s = f'"{self.schema}"'
        async with self._connection() as conn:
            async with conn.pipeline():
                pending = await conn.execute(QUEUE_PENDING_SQL.format(s=s))
                running = await conn.execute(QUEUE_RUNNING_SQL.format(s=s))
                paused = await conn.execute(self.q.paused)
            pending_rows = await pending.fetchall()
            running_rows = dict(await running.fetchall())
            paused_set = {r[0] for r in await paused.fetchall()}
        return _queue_summaries(pending_rows, running_rows, paused_set)

    async def nodes(self) -> list[NodeSummary]:
        """Nodes that heartbeated within the hour; `live` within the reaper's window."""
        rows = await self._execute(
            NODES_SQL.format(s=f'"{self.schema}"'), {"live": self._live_window()}
        )
        return [
            NodeSummary(node, started, beat, live, sorted(msgspec.json.decode(limits)))
            for node, started, beat, live, limits in rows
        ]

    async def job_briefs(self, filters: JobFilter, limit: int, offset: int, preview: int) -> Page:
        """`list_jobs` with payload, result and error cut to a preview in the database."""
        given = {"type": filters.type, "status": filters.status, "queue": filters.queue}
        conds = [f"{col} = %({col})s" for col, value in given.items() if value is not None]
        where = f" WHERE {' AND '.join(conds)}" if conds else ""
        params = {**given, "limit": limit, "offset": offset, "n": preview}
        s = f'"{self.schema}"'
        async with self._connection() as conn:
            async with conn.pipeline():
                page = await conn.execute(JOB_BRIEFS_SQL.format(s=s, where=where), params)
                total = await conn.execute(f"SELECT count(*) FROM {s}.jobs{where}", params)
            rows = await page.fetchall()
            count = await total.fetchone()
        return Page([_job_brief_row(r) for r in rows], int(count[0]) if count else 0)

    async def dead_briefs(self, filters: DeadFilter, limit: int, offset: int, preview: int) -> Page:
        """Dead letters newest first, filtered on their job snapshot, cut in the database."""
        if filters.job_id is not None and not _is_uuid(filters.job_id):
            return Page([], 0)
        params = {
            "type": filters.type,
            "queue": filters.queue,
            "job_id": filters.job_id,
            "pattern": None if filters.error is None else f"%{_like_escape(filters.error)}%",
            "limit": limit,
            "offset": offset,
            "n": preview,
        }
        s = f'"{self.schema}"'
        async with self._connection() as conn:
            async with conn.pipeline():
                page = await conn.execute(DEAD_BRIEFS_SQL.format(s=s), params)
                total = await conn.execute(DEAD_COUNT_SQL.format(s=s), params)
            rows = await page.fetchall()
            count = await total.fetchone()
        return Page([_dead_brief_row(r) for r in rows], int(count[0]) if count else 0)


# -- the summaries' SQL and row decoding ({s} is the quoted schema) ------------------------

QUEUE_PENDING_SQL = """
    SELECT queue, priority, count(*),
        count(*) FILTER (WHERE run_at > now()),
        min(run_at) FILTER (WHERE run_at <= now()),
        extract(epoch FROM now() - min(run_at) FILTER (WHERE run_at <= now()))::float8
    FROM {s}.jobs WHERE status = 'pending' GROUP BY queue, priority"""
QUEUE_RUNNING_SQL = "SELECT queue, count(*) FROM {s}.jobs WHERE status = 'running' GROUP BY queue"
NODES_SQL = """
    SELECT node_id, started_at, heartbeat_at,
        heartbeat_at > now() - %(live)s * interval '1 second', limits
    FROM {s}.nodes WHERE heartbeat_at > now() - interval '1 hour' ORDER BY node_id"""
# A preview is three columns: the first n characters, the size in bytes, whether it is cut.
_PREVIEWS = """
    left(t.p, %(n)s), octet_length(t.p), char_length(t.p) > %(n)s,
    left(t.r, %(n)s), octet_length(t.r), char_length(t.r) > %(n)s,
    left(t.e, %(n)s), octet_length(t.e), char_length(t.e) > %(n)s"""
JOB_BRIEFS_SQL = (
    """
    SELECT id, type, queue, priority, status, attempts, max_retries, run_at, created_at,
        started_at, finished_at, updated_at, parent_id,"""
    + _PREVIEWS
    + """
    FROM {s}.jobs
        CROSS JOIN LATERAL (SELECT payload::text AS p, result::text AS r, last_error AS e) t
    {where}
    ORDER BY created_at DESC, seq DESC LIMIT %(limit)s OFFSET %(offset)s"""
)
_DEAD_FROM = """
    FROM {s}.dead_letters
        CROSS JOIN LATERAL (SELECT (job -> 'payload')::text AS p, NULL::text AS r,
            job ->> 'last_error' AS e) t
    WHERE (%(type)s::text IS NULL OR job ->> 'type' = %(type)s::text)
      AND (%(queue)s::text IS NULL OR job ->> 'queue' = %(queue)s::text)
      AND (%(job_id)s::uuid IS NULL OR job_id = %(job_id)s::uuid)
      AND (%(pattern)s::text IS NULL OR t.e ILIKE %(pattern)s::text)"""
DEAD_BRIEFS_SQL = (
    """
    SELECT id, job_id, job ->> 'type', job ->> 'queue', (job ->> 'priority')::int,
        (job ->> 'attempts')::int, (job ->> 'max_retries')::int, created_at,"""
    + _PREVIEWS
    + _DEAD_FROM
    + """
    ORDER BY created_at DESC, seq DESC LIMIT %(limit)s OFFSET %(offset)s"""
)
DEAD_COUNT_SQL = "SELECT count(*)" + _DEAD_FROM


def _like_escape(text: str) -> str:
    """`text` matched literally inside a LIKE pattern."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _preview(cols: Sequence[Any]) -> Preview | None:
    text, size, cut = cols
    return None if text is None else Preview(text, int(size), bool(cut))


def _job_brief_row(row: Row) -> JobBrief:
    payload = _preview(row[13:16])
    return JobBrief(
        *row[:13],
        payload=payload or Preview("null", 4, False),
        result=_preview(row[16:19]),
        last_error=_preview(row[19:22]),
    )


def _dead_brief_row(row: Row) -> DeadBrief:
    payload = _preview(row[8:11])
    return DeadBrief(
        *row[:8], payload=payload or Preview("null", 4, False), last_error=_preview(row[14:17])
    )


def _queue_summaries(
    pending: Sequence[Row], running: Mapping[str, int], paused: set[str]
) -> list[QueueSummary]:
    """Fold (queue, priority) rows into one summary per queue."""
    by_queue: dict[str, list[Row]] = {}
    for row in pending:
        by_queue.setdefault(row[0], []).append(row)
    out = []
    for name in sorted(set(by_queue) | set(running) | paused):
        rows = sorted(by_queue.get(name, []), key=lambda r: -r[1])
        due = [r for r in rows if r[4] is not None]
        oldest = min(due, key=lambda r: r[4]) if due else None
        out.append(
            QueueSummary(
                name=name,
                pending=sum(r[2] for r in rows),
                scheduled=sum(r[3] for r in rows),
                running=int(running.get(name, 0)),
                depth_by_priority={str(r[1]): int(r[2]) for r in rows},
                oldest_due_at=oldest[4] if oldest else None,
                waiting_seconds=max(0.0, oldest[5]) if oldest else None,
                paused=name in paused,
            )
        )
    return out
