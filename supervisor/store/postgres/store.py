"""The PostgreSQL store: durable, and how several nodes share one queue.

Every claim is a lease (owner, token, expiry) taken with `FOR UPDATE SKIP LOCKED`; every
write about an attempt is fenced by the token. Per-type limits hold across nodes: a claim
of a limited type runs under a per-type advisory lock and counts what is running
everywhere. Dedupe and idempotency are table constraints inside the enqueue transaction.
Enqueues and completes are group-committed: those arriving while one commit is in flight
share the next transaction, each still answered on its own and only once committed.
Each audit event is written by the statement that makes the change it describes, so it
commits (or is lost) with it. Work made claimable is announced with NOTIFY on the
schema's channel (coalesced, after the commit); a listening connection on every node
wakes its dispatcher. Times come from the database clock (`now()`) so that nodes agree
on leases, due-ness and windows.

`PostgresStore` is the facade the engine sees: it owns the lifecycle and this node's
row, and hands every other request to its parts, each a module beside it:
`pg_connection` (pool, lanes, fault policy), `pg_enqueue` (enqueues, follow-ups,
replays), `pg_outcomes` (claims and lease-fenced writes), `pg_reads` (reads and
pruning), `pg_notify` (NOTIFY, LISTEN and wake-ups), `pg_sql` (every statement),
`pg_schema` (schema name and migrations), `pg_rows` (values to and from rows),
`pg_group_commit`, `pg_outbox` (the webhook outbox, delivered by `outbox.Outbox`) and
`pg_schedules` (periodic jobs fired once per tick across nodes).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from datetime import datetime

import msgspec
from goqueue.supervisor.dispatch.rates import Rate, Taken
from goqueue.supervisor.enums import WorkflowStatus
from goqueue.supervisor.errors import StoreUnavailable
from goqueue.supervisor.jobs import (
    CancelFilter,
    Cancelled,
    DeadLetter,
    Enqueued,
    Event,
    Job,
    JobFilter,
    Lease,
    Outcome,
    Page,
    Purged,
    QueueDepths,
    QueueStats,
    Replayed,
    Stats,
)
from goqueue.supervisor.observe.summaries import (
    DeadFilter,
    NodeSummary,
    QueueSummary,
    TypeStats,
)
from goqueue.supervisor.schedules.schedule import Fired, ScheduleState
from goqueue.supervisor.settings.config import DEFAULTS
from goqueue.supervisor.steps import WorkflowCounts
from goqueue.supervisor.store.base import SHARED, NewJob, NodeLinks
from goqueue.supervisor.store.postgres import rows as pg_rows
from goqueue.supervisor.store.postgres.connection import Connections
from goqueue.supervisor.store.postgres.enqueue import Enqueuer
from goqueue.supervisor.store.postgres.notify import Listener, Notifier, Wakeups, cancel_note
from goqueue.supervisor.store.postgres.outbox import OutboxRows
from goqueue.supervisor.store.postgres.outcomes import Outcomes
from goqueue.supervisor.store.postgres.reads import Reads
from goqueue.supervisor.store.postgres.schedules import ScheduleRows
from goqueue.supervisor.store.postgres.sql import schema as pg_schema
from goqueue.supervisor.store.postgres.sql.statements import Sql, Statements
from goqueue.supervisor.store.postgres.summaries import Summaries
from goqueue.supervisor.store.postgres.workflows import PgWorkflows
from goqueue.supervisor.workflows import NewWorkflow, Workflow, WorkflowCreated

log = logging.getLogger("goqueue.store.postgres")


class PostgresStore:
    """The `Store` on PostgreSQL; several instances on one schema act as several nodes."""

    traits = SHARED

    def __init__(
        self,
        dsn: str,
        node_id: str,
        *,
        schema: str = "goqueue",
        lease_seconds: float = DEFAULTS.lease_seconds,
        idempotency_ttl: float = DEFAULTS.idempotency_ttl,
        min_pool: int = 4,
        max_pool: int = 10,
        command_timeout: float = 10.0,
        wake: Callable[[], None] = lambda: None,
        links: NodeLinks | None = None,
    ) -> None:
        """`wake` is the dispatcher's: called when work may be claimable (a job enqueued
        or made due, here or, through LISTEN/NOTIFY, on another node)."""
        self.dsn = dsn
        self.node_id = node_id
        self.schema = pg_schema.check_schema_name(schema)
        self.channel = pg_schema.channel(schema)
        self.lease_seconds = lease_seconds
        self.command_timeout = command_timeout
        self._sql = Statements(schema)
        self._db = Connections(
            dsn,
            node_id,
            self._sql,
            command_timeout=command_timeout,
            min_pool=min_pool,
            max_pool=max_pool,
        )
        self._notifier = Notifier(node_id, self._send_notify)
        self._wakeups = Wakeups(self._notifier, wake)
        self._workflows = PgWorkflows(
            self._db, self._sql, node_id, self._wakeups, idempotency_ttl=idempotency_ttl
        )
        self._links = links or NodeLinks()  # cancels made elsewhere; this node's report
        self._enqueuer = Enqueuer(
            self._db,
            self._sql,
            node_id,
            self._wakeups,
            self._workflows,
            idempotency_ttl=idempotency_ttl,
            lease_seconds=lease_seconds,
        )
        self._outcomes = Outcomes(
            self._db,
            self._sql,
            node_id,
            self._wakeups,
            self._enqueuer,
            self._workflows,
            schema=schema,
            lease_seconds=lease_seconds,
        )
        self._reads = Reads(self._db, self._sql)
        self.outbox = OutboxRows(self._db, self._sql, node_id)  # delivered by `Outbox`
        self._summaries = Summaries(self._db, self._sql, self._outcomes.live_window)
        self._schedules = ScheduleRows(self._db, self._sql, node_id, self._enqueuer, self._wakeups)
        self._tasks: list[asyncio.Task[None]] = []
        self._limits: dict[str, int | None] | None = None
        self._known: tuple[float, frozenset[str]] = (0.0, frozenset())
        self._open = False

    # -- lifecycle -------------------------------------------------------------------

    async def open(self) -> None:
        """Migrate the schema, open the pool, start the listener and the node's beat."""
        if self._open:
            return
        await self._db.open(self.schema)
        self._open = True
        listener = Listener(
            self.dsn,
            self._sql,
            self._db.connect_kwargs(),
            self._wakeups.on_note,
            self._wakeups.wake,
            self._on_cancel,
        )
        self._tasks = [
            asyncio.create_task(listener.run(), name="goqueue-pg-listen"),
            asyncio.create_task(self._maintain(), name="goqueue-pg-maintain"),
            asyncio.create_task(self._beat(), name="goqueue-pg-beat"),
        ]
        with suppress(TimeoutError):
            await asyncio.wait_for(listener.listening.wait(), timeout=self.command_timeout)
        with suppress(StoreUnavailable):
            rows = await self._db.execute(self._sql[Sql.NEXT_DUE_ANY], {})
            self._wakeups.saw_due(rows[0][0] if rows else None)

    async def close(self) -> None:
        """Finish the writes under way, leave the node table, stop tasks, close the pool."""
        if not self._open:
            return
        self._open = False
        await self._enqueuer.idle(self.command_timeout)
        await self._outcomes.idle(self.command_timeout)
        await self._notifier.close()
        if self._limits is not None:
            with suppress(StoreUnavailable):
                await self._db.execute(self._sql[Sql.FORGET_NODE], {"node": self.node_id})
        self._enqueuer.cancel()
        self._outcomes.cancel_groups()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        await self._db.close()

    async def ping(self) -> bool:
        """True when a trivial query answers."""
        try:
            await self._db.execute(self._sql[Sql.PING], {})
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
                await self._register()
            except StoreUnavailable as exc:
                log.warning("node heartbeat failed", extra={"err": str(exc)})

    async def _maintain(self) -> None:
        """Drop expired dedupe / idempotency keys and long-dead nodes, now and then."""
        while True:
            await asyncio.sleep(30.0)
            try:
                await self._db.execute(self._sql[Sql.EXPIRE_KEYS], {})
            except StoreUnavailable as exc:
                log.info("key expiry skipped: store unavailable", extra={"err": str(exc)})

    # -- waking ----------------------------------------------------------------------

    def next_due_at(self) -> datetime | None:
        """When the earliest scheduled job becomes due, as of the last claim or note."""
        return self._wakeups.next_due_at()

    async def cancel_elsewhere(self, job_id: str, token: str) -> None:
        """NOTIFY every node of the cancel; the one holding `token` kills its worker. The
        database unreachable, the holder's next lease check still finds the lease gone."""
        try:
            await self._send_notify(cancel_note(self.node_id, token, job_id))
        except StoreUnavailable as exc:
            log.warning("cancel NOTIFY failed", extra={"job_id": job_id, "err": str(exc)})

    def _on_cancel(self, node: str, token: str, job_id: str) -> None:
        if node == self.node_id or not self._links.cancel(token):
            return  # ours was handled where it was made; another node holds the lease
        log.info(
            "job cancelled on another node; killing its worker",
            extra={"job_id": job_id, "cancelled_on": node},
        )

    async def _send_notify(self, payload: str) -> None:
        params = {"channel": self.channel, "payload": payload}
        await self._db.execute(self._sql[Sql.NOTIFY], params)

    # -- nodes and queues ------------------------------------------------------------

    async def register_node(self, limits: Mapping[str, int | None]) -> None:
        """Declare this node alive with its types and per-type limits."""
        self._limits = dict(limits)
        self._known = (0.0, frozenset())
        await self._register()

    async def _register(self) -> None:
        made = self._links.report()
        report = None if made is None else pg_rows.raw(made)
        params = {"node": self.node_id, "limits": pg_rows.raw(self._limits), "report": report}
        await self._db.execute(self._sql[Sql.REGISTER], params)

    async def known_types(self) -> frozenset[str]:
        """Types some live node runs (cached for a second: it is asked on every enqueue)."""
        at, types = self._known
        if time.monotonic() - at < 1.0:
            return types
        params = {"live": self._outcomes.live_window}
        rows = await self._db.execute(self._sql[Sql.KNOWN_TYPES], params)
        types = frozenset(r[0] for r in rows) | frozenset(self._limits or ())
        self._known = (time.monotonic(), types)
        return types

    async def set_paused(self, queue: str, paused: bool) -> None:
        """Pause or resume a queue for every node; resuming wakes them."""
        if paused:
            await self._db.execute(self._sql[Sql.PAUSE], {"queue": queue})
            return
        await self._db.execute(self._sql[Sql.RESUME], {"queue": queue})
        self._wakeups.everyone()

    # -- enqueue ---------------------------------------------------------------------

    async def enqueue(self, new: NewJob) -> Enqueued:
        """Store one job (group-committed); dedupe and idempotency checked atomically."""
        return await self._enqueuer.enqueue(new)

    async def enqueue_many(self, news: Sequence[NewJob]) -> list[Enqueued | Exception]:
        """Store several jobs in one transaction, each answered on its own."""
        return await self._enqueuer.enqueue_many(news)

    async def replay_dead(self, dead_id: str, max_retries: int) -> Job:
        """Insert a fresh job from the letter and delete the letter, in one transaction."""
        return await self._enqueuer.replay_dead(dead_id, max_retries)

    # -- workflows ---------------------------------------------------------------------

    async def create_workflow(self, new: NewWorkflow) -> WorkflowCreated:
        """Store every step at once, in one transaction."""
        return await self._workflows.create(new)

    async def get_workflow(self, workflow_id: str) -> Workflow | None:
        """One workflow with its steps' live statuses."""
        return await self._workflows.get(workflow_id)

    async def list_workflows(self, status: WorkflowStatus | None, limit: int, offset: int) -> Page:
        """Workflows newest first, of `status` when given."""
        return await self._workflows.page(status, limit, offset)

    async def workflow_counts(self) -> WorkflowCounts:
        """Workflows by status, and steps waiting."""
        return await self._workflows.counts()

    async def cancel_workflow(
        self, workflow_id: str
    ) -> tuple[Workflow, list[tuple[Job, str | None]]]:
        """Cancel every unfinished step of a workflow, in one transaction."""
        return await self._workflows.cancel(workflow_id)

    # -- leases and outcomes ---------------------------------------------------------

    async def claim(
        self,
        limit: int,
        queues: frozenset[str] | None,
        slots: Mapping[str, int],
        start: int | None = None,
    ) -> list[Lease]:
        """Take up to `limit` due jobs as leases, starting the best `start` (one
        statement, one round trip)."""
        return await self._outcomes.claim(limit, queues, slots, start)

    async def start(self, lease: Lease) -> Lease | None:
        """Start a claimed lease's attempt (group-committed with completes)."""
        return await self._outcomes.start(lease)

    async def heartbeat(self, leases: Sequence[Lease], lease_seconds: float) -> list[str]:
        """Extend the leases still held; return the tokens that are not."""
        return await self._outcomes.heartbeat(leases, lease_seconds)

    async def reap_expired(self, retry_delay: Callable[[int], float] | None = None) -> list[Job]:
        """Take back jobs whose lease ran out (see `Store`); returns the jobs touched."""
        return await self._outcomes.reap_expired(retry_delay)

    async def complete(self, lease: Lease, result: msgspec.Raw | None) -> Outcome | None:
        """Record success and enqueue `on_success` atomically; None if the lease is stale."""
        return await self._outcomes.complete(lease, result)

    async def fail(
        self, lease: Lease, error: str, retry_at: datetime | None, traceback: str | None = None
    ) -> Outcome | None:
        """Record a failed attempt: pending at `retry_at`, or dead-lettered (None)."""
        return await self._outcomes.fail(lease, error, retry_at, traceback)

    async def release(self, lease: Lease) -> bool:
        """Hand the job back to pending without counting the attempt."""
        return await self._outcomes.release(lease)

    async def cancel(self, job_id: str, force: bool) -> tuple[Job, str | None]:
        """Cancel a pending job, or a running one with `force` (its token is returned)."""
        return await self._outcomes.cancel(job_id, force)

    async def cancel_many(self, filters: CancelFilter, limit: int) -> Cancelled:
        """Cancel up to `limit` matching jobs, oldest first, in one statement."""
        return await self._outcomes.cancel_many(filters, limit)

    # -- reads -----------------------------------------------------------------------

    async def get(self, job_id: str) -> Job | None:
        """One job by id (None for an unknown or malformed id)."""
        return await self._reads.get(job_id)

    async def list_jobs(self, filters: JobFilter, limit: int, offset: int) -> Page:
        """Jobs newest first, and how many match."""
        return await self._reads.list_jobs(filters, limit, offset)

    async def stats(self) -> Stats:
        """Counts by status, pending depth by queue and priority, dead letters."""
        return await self._reads.stats()

    async def queue_stats(self, queue: str) -> QueueStats:
        """One queue's counts, pending depth by priority, and whether it is paused."""
        return await self._reads.queue_stats(queue)

    async def queue_depths(self, top: int) -> QueueDepths:
        """The `top` deepest queues by priority, the rest summed by priority."""
        return await self._reads.queue_depths(top)

    async def queue_names(self, limit: int) -> frozenset[str]:
        """Queues holding pending jobs (at most `limit`), and the paused ones."""
        return await self._reads.queue_names(limit)

    async def events(self, job_id: str) -> list[Event]:
        """A job's audit trail, oldest first."""
        return await self._reads.events(job_id)

    async def list_dead(self, limit: int, offset: int, filters: DeadFilter | None = None) -> Page:
        """Dead letters newest first (those passing `filters`)."""
        return await self._reads.list_dead(limit, offset, filters)

    async def get_dead(self, dead_id: str) -> DeadLetter | None:
        """One dead letter by its own id or its job's."""
        return await self._reads.get_dead(dead_id)

    async def purge_dead(self, dead_id: str) -> bool:
        """Delete a dead letter; False if there was none."""
        return await self._reads.purge_dead(dead_id)

    async def replay_dead_many(self, filters: DeadFilter, limit: int) -> Replayed:
        """Replay up to `limit` matching letters, oldest first, in one transaction."""
        return await self._enqueuer.replay_dead_many(filters, limit)

    async def purge_dead_many(self, filters: DeadFilter, limit: int) -> Purged:
        """Delete up to `limit` matching letters, oldest first."""
        return await self._reads.purge_dead_many(filters, limit)

    async def prune(self, finished_before: datetime, limit: int) -> int:
        """Delete old finished jobs and their audit trails, oldest first."""
        return await self._reads.prune(finished_before, limit)

    # -- rate limits -------------------------------------------------------------------

    async def take_starts(self, job_type: str, rate: Rate, want: int) -> Taken:
        """Take the starts due now, counted across every node."""
        params = {"type": job_type, "limit": rate.limit, "period": rate.period, "want": want}
        (row,) = await self._db.execute(self._sql[Sql.TAKE_STARTS], params)
        return Taken(int(row[0]), float(row[1]), float(row[2]))

    async def return_starts(self, job_type: str, tat: float, count: int) -> None:
        """Give back unused starts (nothing once another take moved the TAT on)."""
        params = {"type": job_type, "tat": tat, "count": count}
        await self._db.execute(self._sql[Sql.RETURN_STARTS], params)

    # -- periodic jobs -----------------------------------------------------------------

    async def schedule_states(self) -> dict[str, ScheduleState]:
        """Every schedule's state, as every node sees it."""
        return await self._schedules.states()

    async def fire_schedule(
        self, name: str, tick: datetime, new: NewJob, *, missed: bool = False
    ) -> tuple[Fired, Job | None]:
        """Store the tick's job, exactly once across nodes."""
        return await self._schedules.fire(name, tick, new, missed=missed)

    async def set_schedule_enabled(self, name: str, enabled: bool) -> ScheduleState:
        """Enable or disable a schedule for every node, kept across restarts."""
        return await self._schedules.switch(name, enabled)

    # -- summaries for operators (the dashboard) -----------------------------------------

    async def queue_summaries(self) -> list[QueueSummary]:
        """Every queue with pending or running jobs, and every paused one."""
        return await self._summaries.queue_summaries()

    async def nodes(self) -> list[NodeSummary]:
        """The nodes sharing this store, live or recently seen."""
        return await self._summaries.nodes()

    async def type_stats(self) -> list[TypeStats]:
        """Counts by status, run-time percentiles and failure rate of every job type."""
        return await self._summaries.type_stats()

    async def job_briefs(self, filters: JobFilter, limit: int, offset: int, preview: int) -> Page:
        """Jobs newest first as list rows with previews."""
        return await self._summaries.job_briefs(filters, limit, offset, preview)

    async def dead_briefs(self, filters: DeadFilter, limit: int, offset: int, preview: int) -> Page:
        """Dead letters newest first, filtered, as list rows with previews."""
        return await self._summaries.dead_briefs(filters, limit, offset, preview)
