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

`PostgresStore` owns the lifecycle and this node's row; every other request is answered
by one of its parts, each a module beside it, whose own methods it hands out at
construction: `connection` (pool, lanes, fault policy, group commit), `enqueue`
(enqueues, follow-ups, replays), `outcomes` (claims and lease-fenced writes), `cancels`,
`workflows`, `reads` (reads and pruning), `summaries` (what the dashboard shows),
`schedules` (periodic jobs fired once per tick across nodes), `outbox` (the webhook
outbox, delivered by `webhooks.outbox`), `notify` (NOTIFY, LISTEN and wake-ups), `rows`
(values to and from rows) and `sql/` (every statement, the schema and its migrations).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from contextlib import suppress
from datetime import datetime

from goqueue.supervisor.common.errors import StoreUnavailable
from goqueue.supervisor.common.rates import Rate, Taken
from goqueue.supervisor.settings.config import DEFAULTS
from goqueue.supervisor.settings.stores import channel
from goqueue.supervisor.store.base import MAX_KEY_HOLDS, SHARED, NodeLinks, Upkeep
from goqueue.supervisor.store.postgres import rows as pg_rows
from goqueue.supervisor.store.postgres.cancels import Cancels
from goqueue.supervisor.store.postgres.connection import Connections
from goqueue.supervisor.store.postgres.enqueue import Enqueuer
from goqueue.supervisor.store.postgres.floors import ClaimFloors
from goqueue.supervisor.store.postgres.notify import Listener, Notifier, Wakeups, cancel_note
from goqueue.supervisor.store.postgres.outbox import OutboxRows
from goqueue.supervisor.store.postgres.outcomes import Outcomes
from goqueue.supervisor.store.postgres.reads import Reads
from goqueue.supervisor.store.postgres.schedules import ScheduleRows
from goqueue.supervisor.store.postgres.sql import schema as pg_schema
from goqueue.supervisor.store.postgres.sql.statements import Sql, Statements
from goqueue.supervisor.store.postgres.summaries import Summaries
from goqueue.supervisor.store.postgres.upkeep import TableCare
from goqueue.supervisor.store.postgres.workflows import PgWorkflows

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
    ) -> None:
        """`wake` is the dispatcher's: called when work may be claimable (a job enqueued
        or made due, here or, through LISTEN/NOTIFY, on another node)."""
        self.dsn = dsn
        self.node_id = node_id
        self.schema = pg_schema.check_schema_name(schema)
        self.channel = channel(schema)
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
        self._floors = ClaimFloors()  # where each claim starts
        self._wakeups = Wakeups(self._notifier, wake, self._floors)
        self._workflows = PgWorkflows(
            self._db, self._sql, node_id, self._wakeups, idempotency_ttl=idempotency_ttl
        )
        self._links = NodeLinks()  # cancels made elsewhere; this node's report (`open`)
        self._enqueuer = Enqueuer(
            self._db,
            self._sql,
            node_id,
            self._wakeups,
            self._workflows,
            self._floors,
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
            self._floors,
            schema=schema,
            lease_seconds=lease_seconds,
        )
        self._cancels = Cancels(self._db, self._sql, node_id, self._wakeups, self._workflows)
        self._reads = Reads(self._db, self._sql)
        self._care = TableCare(self._db, self.schema)  # dead rows counted and VACUUMed
        self.outbox = OutboxRows(self._db, self._sql, node_id)  # delivered by `Outbox`
        self._summaries = Summaries(self._db, self._sql, self._outcomes.live_window)
        self._schedules = ScheduleRows(self._db, self._sql, node_id, self._enqueuer, self._wakeups)
        # The store's requests that a part answers whole are that part's own methods
        # (each documented where it is written, not again here).
        self.enqueue = self._enqueuer.enqueue
        self.enqueue_many = self._enqueuer.enqueue_many
        self.replay_dead = self._enqueuer.replay_dead
        self.create_workflow = self._workflows.create
        self.get_workflow = self._workflows.get
        self.list_workflows = self._workflows.page
        self.workflow_counts = self._workflows.counts
        self.cancel_workflow = self._workflows.cancel
        self.claim = self._outcomes.claim
        self.start = self._outcomes.start
        self.heartbeat = self._outcomes.heartbeat
        self.reap_expired = self._outcomes.reap_expired
        self.complete = self._outcomes.complete
        self.fail = self._outcomes.fail
        self.release = self._outcomes.release
        self.cancel = self._cancels.cancel
        self.cancel_many = self._cancels.cancel_many
        self.get = self._reads.get
        self.list_jobs = self._reads.list_jobs
        self.stats = self._reads.stats
        self.queue_stats = self._reads.queue_stats
        self.queue_depths = self._reads.queue_depths
        self.queue_names = self._reads.queue_names
        self.events = self._reads.events
        self.list_dead = self._reads.list_dead
        self.get_dead = self._reads.get_dead
        self.purge_dead = self._reads.purge_dead
        self.replay_dead_many = self._enqueuer.replay_dead_many
        self.purge_dead_many = self._reads.purge_dead_many
        self.prune = self._reads.prune
        self.schedule_states = self._schedules.states
        self.fire_schedule = self._schedules.fire
        self.set_schedule_enabled = self._schedules.switch
        self.queue_summaries = self._summaries.queue_summaries
        self.nodes = self._summaries.nodes
        self.type_stats = self._summaries.type_stats
        self.job_briefs = self._summaries.job_briefs
        self.dead_briefs = self._summaries.dead_briefs
        self._tasks: list[asyncio.Task[None]] = []
        self._limits: dict[str, int | None] | None = None
        self._key_rules: dict[str, dict[str, float | None]] = {}  # (`register_node`)
        self._known: tuple[float, frozenset[str]] = (0.0, frozenset())
        self._open = False

    # -- lifecycle -------------------------------------------------------------------

    async def reserve(self) -> None:
        """Nothing to hold: a node may share this store."""

    async def open(self, links: NodeLinks | None = None) -> None:
        """Migrate the schema, open the pool, start the listener and the node's beat."""
        if links is not None:
            self._links = links
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
            asyncio.create_task(self._care.run(), name="goqueue-pg-table-care"),
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

    def upkeep(self) -> Upkeep:
        """The jobs table's dead row versions, the oldest snapshot and VACUUMs run."""
        return self._care.upkeep()

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
        if node != self.node_id:
            self._notifier.heard()
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

    async def register_node(
        self,
        limits: Mapping[str, int | None],
        *,
        key_limits: Mapping[str, int] | None = None,
        key_rates: Mapping[str, Rate] | None = None,
    ) -> None:
        """Declare this node alive with its types and per-type limits, and its per-key
        limits and rates (the claim takes the smallest limit, the slowest rate, a live
        node declares): by type, `{"n": limit, "step": seconds between starts, "burst":
        starts at once}`, each null when not declared. The first time, the other nodes
        are told that this one joined."""
        joining = self._limits is None
        self._limits = dict(limits)
        self._key_rules = key_rules(key_limits or {}, key_rates or {})
        self._floors.declare(self._key_rules, (t for t, n in limits.items() if n is not None))
        self._known = (0.0, frozenset())
        await self._register()
        if joining:
            self._notifier.announce()  # the others count this node from now

    async def _register(self) -> None:
        """Write this node's row, and count the other live nodes (`Notifier.counted`)."""
        made = self._links.report()
        report = None if made is None else pg_rows.raw(made)
        params = {
            "node": self.node_id,
            "limits": pg_rows.raw(self._limits),
            "report": report,
            "key_limits": pg_rows.raw(self._key_rules) if self._key_rules else None,
            "live": self._outcomes.live_window,
        }
        asked = self._notifier.clock()
        ((others,),) = await self._db.execute(self._sql[Sql.REGISTER], params)
        self._notifier.counted(int(others), asked)

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
            await self._db.write(self._sql[Sql.PAUSE], {"queue": queue})
            return
        await self._db.write(self._sql[Sql.RESUME], {"queue": queue})
        self._floors.reset()  # the queue's jobs lie below floors its neighbours raised
        self._wakeups.everyone()

    # -- rate limits -------------------------------------------------------------------

    async def key_holds(self, limits: Mapping[str, int]) -> list[tuple[str, str, int, int]]:
        """The keys at their limit, with their due pending jobs (`Store.key_holds`)."""
        if not limits:
            return []
        types = sorted(limits)
        params = {"types": types, "limits": [limits[t] for t in types], "most": MAX_KEY_HOLDS}
        rows = await self._db.execute(self._sql[Sql.KEY_HOLDS], params)
        return [(str(t), str(k), int(n), int(w)) for t, k, n, w in rows]

    def key_waits(self) -> list[str]:
        """The types a short claim held jobs of back by key, since last asked."""
        waits, self._outcomes.key_held = self._outcomes.key_held, []
        return waits

    async def take_starts(self, job_type: str, rate: Rate, want: int) -> Taken:
        """Take the starts due now, counted across every node."""
        params = {"type": job_type, "limit": rate.limit, "period": rate.period, "want": want}
        (row,) = await self._db.execute(self._sql[Sql.TAKE_STARTS], params)
        return Taken(int(row[0]), float(row[1]), float(row[2]))

    async def return_starts(self, job_type: str, tat: float, count: int) -> None:
        """Give back unused starts (nothing once another take moved the TAT on)."""
        params = {"type": job_type, "tat": tat, "count": count}
        await self._db.execute(self._sql[Sql.RETURN_STARTS], params)


def key_rules(
    limits: Mapping[str, int], rates: Mapping[str, Rate]
) -> dict[str, dict[str, float | None]]:
    """The per-key rules of each type, as the node's row holds them (`register_node`)."""
    rules: dict[str, dict[str, float | None]] = {}
    for job_type in sorted(set(limits) | set(rates)):
        rate = rates.get(job_type)
        rules[job_type] = {
            "n": limits.get(job_type),
            "step": None if rate is None else rate.interval,
            "burst": None if rate is None else rate.limit,
        }
    return rules
