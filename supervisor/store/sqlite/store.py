"""The SQLite store: one node's jobs in one SQLite file, whose rows are the truth.

Every call is one savepoint of the turn's transaction (`database.py`): it reads the rows
it needs through their indexes, applies the rules (`rules.py`, the memory store's rules
over rows) and writes them back, then waits for the commit. Nothing about jobs is kept
in memory between calls, so the node's memory does not grow with the backlog or the
history, a restart reads nothing back (jobs a dead node left `running` or `claimed` are
found by an index and reaped at once), and finished jobs stay until `prune` deletes
them by age (`--retention-seconds`). This module holds the lifecycle, enqueues, claims
and outcomes (an attempt's row under its lease: `leases.py`); its other calls are its
parts' own: `read_calls.py`, `dead_letters.py`, `cancels.py`, `workflows.py`,
`schedules.py`, `pruning.py`.

Durability, call by call (every commit is `synchronous=NORMAL`: see `database.py`):
- What a client is told is stored (an enqueue's `201`, a schedule's fire, a cancel, a
  pause, a dead letter's replay or purge, a workflow) is answered only after an fsync
  of the WAL that follows its commit (shared by every commit before it).
- Claims, starts, outcomes, reaps and webhook records wait for their commit only: in the
  WAL (so a `kill -9` of the node loses none of them: the OS has the pages) but not
  fsynced, so a power cut may lose the last of them. That is safe because the WAL is a
  sequence: what a power cut drops is a suffix of commits after the last fsync, never an
  answered enqueue before them. A lost `complete` or `fail` leaves the job `running`
  under a lease, so it is reaped and runs again (at least once, the contract); a lost
  start leaves it pending. A job may start before its enqueue's fsync is done; a power
  cut in that instant loses a job whose `201` was never sent.

A write that fails (a full disk) changes nothing: the call raises StoreUnavailable, and a
claim, start or outcome is simply asked again. One node owns the file; rate limits are
this node's (kept in memory, a window starts afresh after a restart).
"""

from __future__ import annotations

import itertools
import logging
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import TypeVar

import msgspec
from goqueue.supervisor.common.enums import EventKind, Status
from goqueue.supervisor.common.errors import (
    DuplicateJob,
    IdempotencyMismatch,
    StoreFull,
)
from goqueue.supervisor.common.flow import KeyPace, KeyTurns
from goqueue.supervisor.common.jobs import Enqueued, Job, Lease, Outcome, utcnow
from goqueue.supervisor.common.rates import Rate, StartTimes, Taken
from goqueue.supervisor.common.summaries import (
    NodeSummary,
)
from goqueue.supervisor.settings.config import DEFAULTS
from goqueue.supervisor.store.base import (
    EMBEDDED,
    EVENTS_KEPT,
    ClaimStarts,
    NewJob,
    NodeLinks,
    Upkeep,
)
from goqueue.supervisor.store.sqlite import keyed, pruning, reads, steps
from goqueue.supervisor.store.sqlite.cancels import SqliteCancels
from goqueue.supervisor.store.sqlite.database import Database
from goqueue.supervisor.store.sqlite.dead_letters import SqliteDeadLetters
from goqueue.supervisor.store.sqlite.leases import held, outcome_of, reap
from goqueue.supervisor.store.sqlite.outbox import SqliteOutboxRows
from goqueue.supervisor.store.sqlite.read_calls import SqliteReads
from goqueue.supervisor.store.sqlite.rows import (
    from_ts,
)
from goqueue.supervisor.store.sqlite.rules import Context, PausedQueues, Tx
from goqueue.supervisor.store.sqlite.schedules import SqliteSchedules
from goqueue.supervisor.store.sqlite.workflows import SqliteWorkflows

T = TypeVar("T")
log = logging.getLogger("goqueue.store.sqlite")
LAST_SEQ = (
    "SELECT max(coalesce((SELECT max(seq) FROM jobs), 0),"
    " coalesce((SELECT max(seq) FROM workflows), 0))"
)
# the rows that hold a lease (every claimed or running row, and only those), by their index
LEASED = "status IN ('claimed', 'running') AND lease_token IS NOT NULL"


class SqliteStore:
    """A durable store for one node in one SQLite file (see the module)."""

    traits = EMBEDDED

    def __init__(
        self,
        path: str,
        node_id: str = "local",
        *,
        lease_seconds: float = DEFAULTS.lease_seconds,
        max_pending: int | None = DEFAULTS.max_pending,
        idempotency_ttl: float = DEFAULTS.idempotency_ttl,
        max_events_per_job: int = EVENTS_KEPT,
        clock: Callable[[], datetime] = utcnow,
        wake: Callable[[], None] = lambda: None,
    ) -> None:
        self.node_id = node_id
        self.path = path
        self.clock = clock
        self.lease_seconds = lease_seconds
        self.db = Database(path)
        self.outbox = SqliteOutboxRows(self.db, node_id, clock)
        self._links = NodeLinks()  # this node's report (`open`)
        self._limits: dict[str, int | None] = {}
        self._key_limits: dict[str, int] = {}  # per-key limits by type (`common/flow.py`)
        self._key_rates: dict[str, Rate] = {}  # per-key rates by type
        self._pace = KeyPace()  # the paced keys' TATs (this node's, as rate limits are)
        self._key_waits: list[str] = []  # (`key_waits`)
        self._cursors: dict[str, str] = {}  # where each keyed type takes keys up again
        # the jobs due by this were looked at (by a claim, or a past time answered once;
        # those due at start-up, by the node's first claim)
        self._due_seen = clock().timestamp()
        self._keys = keyed.Keys(lambda: self.db.undone)  # the keys after it, their counts
        self._seq = itertools.count(1)
        self._starts = StartTimes()
        self._opened_at = clock()
        self._ctx = Context(
            node_id=node_id,
            lease_seconds=lease_seconds,
            max_pending=max_pending,
            idempotency_ttl=idempotency_ttl,
            max_events_per_job=max_events_per_job,
            limits=self._limits,
            next_seq=self._next_seq,
            wake=wake,
            leased={},
            paused=PausedQueues(),
            keys=self._keys,
        )
        # The calls a part answers whole are that part's own methods (documented there).
        read_calls = SqliteReads(self._read, clock, self.db.open_moves)
        self.get = read_calls.get
        self.list_jobs = read_calls.list_jobs
        self.events = read_calls.events
        self.stats = read_calls.stats
        self.queue_stats = read_calls.queue_stats
        self.queue_depths = read_calls.queue_depths
        self.queue_names = read_calls.queue_names
        self.list_dead = read_calls.list_dead
        self.queue_summaries = read_calls.queue_summaries
        self.type_stats = read_calls.type_stats
        self.job_briefs = read_calls.job_briefs
        self.dead_briefs = read_calls.dead_briefs
        dead = SqliteDeadLetters(self._write, self._read)
        self.replay_dead = dead.replay
        self.replay_dead_many = dead.replay_many
        self.purge_dead = dead.purge
        self.purge_dead_many = dead.purge_many
        self.get_dead = dead.get
        schedules = SqliteSchedules(self._write, self._read)
        self.schedule_states = schedules.states
        self.fire_schedule = schedules.fire
        self.set_schedule_enabled = schedules.switch
        cancels = SqliteCancels(self._write)
        self.cancel = cancels.one
        self.cancel_many = cancels.many
        flows = SqliteWorkflows(self._write, self._read)
        self.create_workflow = flows.create
        self.get_workflow = flows.get
        self.list_workflows = flows.page
        self.workflow_counts = flows.counts
        self.cancel_workflow = flows.cancel

    def _next_seq(self) -> int:
        return next(self._seq)

    # -- the plumbing of every call ----------------------------------------------------

    async def _write(self, work: Callable[[Tx], T], durable: bool = False) -> T:
        """Run `work` in one savepoint at one instant, and wait for its commit (with
        `durable`, for the fsync after it)."""
        await self.db.writable()
        tx = Tx(self._ctx, self.clock())
        try:
            out, batch = self.db.run(lambda conn: tx.settled(work(tx.on(conn))))
            batch.count(tx.counts)
            await self.db.committed(batch, durable)
        except BaseException:
            tx.forget()
            raise
        return out

    def _read(self, work: Callable[[sqlite3.Connection], T]) -> T:
        return self.db.now(work)

    # -- lifecycle -------------------------------------------------------------------

    async def reserve(self) -> None:
        """Lock the file: a second node on it refuses before it listens."""
        self.db.lock()

    async def open(self, links: NodeLinks | None = None) -> None:
        """Lock and open the file (BootError naming it if it cannot be). Nothing is read
        back: the leases a dead node left run out now, so the first reap takes them."""
        if links is not None:
            self._links = links
        await self.db.open()
        self._read(
            lambda c: c.create_function("goqueue_contains", 2, reads.contains, deterministic=True)
        )
        (last,) = self._read(lambda c: c.execute(LAST_SEQ).fetchone())
        self._seq = itertools.count(int(last) + 1)
        now = self.clock().timestamp()
        await self.db.write(
            lambda c: c.execute(f"UPDATE jobs SET lease_expires = ? WHERE {LEASED}", (now,))
        )
        self._opened_at = self.clock()

    async def close(self) -> None:
        """Commit what is left, then close the file (logging what writing it cost)."""
        opened = self.db.opened
        try:
            if opened:
                await self.db.writable()
        finally:
            await self.db.close()
            if opened:  # a node that never opened it has nothing to report
                counts = {"transactions": self.db.transactions, "fsyncs": self.db.syncs}
                log.info("SQLite file closed", extra={"path": self.path, **counts})

    def upkeep(self) -> Upkeep:
        """Nothing to look after: the defaults."""
        return Upkeep()

    async def ping(self) -> bool:
        """True while the file answers and takes writes (false while a full disk refuses
        them: a write is tried to find out when it comes back)."""
        try:
            self._read(lambda c: c.execute("SELECT 1").fetchone())
        except Exception:
            return False
        return not self.db.failing or await self.db.probe()

    async def cancel_elsewhere(self, job_id: str, token: str) -> None:
        """Nothing to tell: one node owns the file."""

    async def register_node(
        self,
        limits: Mapping[str, int | None],
        *,
        key_limits: Mapping[str, int] | None = None,
        key_rates: Mapping[str, Rate] | None = None,
    ) -> None:
        """Remember this node's job types and limits, and its per-key limits and rates."""
        self._limits.clear()
        self._limits.update(limits)
        self._key_limits = dict(key_limits or {})
        self._key_rates = dict(key_rates or {})

    async def known_types(self) -> frozenset[str]:
        """The types this node declared."""
        return frozenset(self._limits)

    # -- enqueue ---------------------------------------------------------------------

    async def enqueue(self, new: NewJob) -> Enqueued:
        """Store one job; returns once it is on disk. Raises StoreUnavailable when the
        file cannot take it (then nothing of it is kept)."""
        return await self._write(lambda tx: tx.enqueue(new), durable=True)

    async def enqueue_many(self, news: Sequence[NewJob]) -> list[Enqueued | Exception]:
        """Store several jobs in one transaction, on disk before the answer."""

        def work(tx: Tx) -> list[Enqueued | Exception]:
            out: list[Enqueued | Exception] = []
            for new in news:
                try:
                    out.append(tx.enqueue(new))
                except (DuplicateJob, IdempotencyMismatch, StoreFull) as exc:
                    out.append(exc)
            return out

        return await self._write(work, durable=True)

    # -- rate limits (this node's own) -----------------------------------------------

    async def take_starts(self, job_type: str, rate: Rate, want: int) -> Taken:
        """Take the starts due now, on this node."""
        return self._starts.take(job_type, rate, want, self.clock().timestamp())

    async def return_starts(self, job_type: str, tat: float, count: int) -> None:
        """Give back unused starts."""
        self._starts.give_back(job_type, tat, count)

    # -- claiming --------------------------------------------------------------------

    async def claim(
        self,
        limit: int,
        queues: frozenset[str] | None,
        slots: Mapping[str, int],
        start: int | None = None,
        start_types: frozenset[str] = frozenset(),
    ) -> list[Lease]:
        """Take up to `limit` due jobs, best first, within the per-type slots (one
        indexed statement per type); the best `start` of them (all when None) start at
        once, and so do those that lead the claim with a type in `start_types`; the
        others are `claimed`. In the file before a worker gets one."""
        if limit <= 0 or not any(n > 0 for n in slots.values()):
            return []

        def work(tx: Tx) -> list[Lease]:
            turns = KeyTurns(
                self._key_limits, {}, self._key_rates, self._pace, tx.ts, self._cursors
            )
            paused = tx.paused()
            best = reads.due(tx.conn, tx.ts, queues, paused, slots, limit, turns, self._keys)
            self.db.on_undo(turns.undo)  # the claim is not made: the keys' pace is not spent
            self._due_seen = max(self._due_seen, tx.ts)
            if len(best) < limit:
                self._key_waits.extend(turns.held)
            leases = []
            starts = ClaimStarts(start, start_types)
            for row in best:
                tx.adopt(row)
                tx.lease(row, started=starts(row.job.type))
                tx.save(row)
                lease = row.lease()
                assert lease is not None
                leases.append(lease)
            return leases

        return await self._write(work)

    async def key_holds(self, limits: Mapping[str, int]) -> list[tuple[str, str, int, int]]:
        """The keys at their limit, with their due pending jobs (`Store.key_holds`)."""
        now = self.clock().timestamp()
        return self._read(lambda conn: keyed.holds(conn, self._keys.busy, limits, now))

    def key_waits(self) -> list[str]:
        """The types a short claim held jobs of back by key, since last asked."""
        waits, self._key_waits = self._key_waits, []
        return waits

    async def start(self, lease: Lease) -> Lease | None:
        """Start the attempt of a `claimed` lease, in the file before its worker gets it."""

        def work(tx: Tx) -> Lease | None:
            row = held(tx, lease, Status.CLAIMED)
            if row is None:
                return None
            tx.begin(row)
            row.lease_expires = tx.ts + self.lease_seconds
            tx.save(row)
            return row.lease()

        return await self._write(work)

    def next_due_at(self) -> datetime | None:
        """When the earliest delayed job becomes due (an indexed look-up), or a key held
        back by its pace may start again, whichever comes first. A job that came due
        since the last claim looked is answered once though its time is past (the claim
        may have been quicker than it): one wake covers every job due by now."""
        now = self.clock().timestamp()
        paced = self._pace.due(now)
        try:
            due = self._read(lambda c: reads.next_due(c, self._due_seen))
        except Exception:
            due = None
        if due is not None and due <= now:
            self._due_seen = now
        return from_ts(due if paced is None or (due is not None and due < paced) else paced)

    # -- leases and outcomes ---------------------------------------------------------

    async def heartbeat(self, leases: Sequence[Lease], lease_seconds: float) -> list[str]:
        """Extend held leases; report the tokens that are no longer held."""
        if not leases:
            return []

        def work(tx: Tx) -> list[str]:
            expires = tx.ts + lease_seconds
            lost = []
            for lease in leases:
                moved = tx.conn.execute(
                    "UPDATE jobs SET lease_expires = ? WHERE id = ? AND lease_token = ?",
                    (expires, lease.job.id, lease.token),
                )
                if moved.rowcount == 0:
                    lost.append(lease.token)
                row = tx.ctx.leased.get(lease.job.id)
                if row is not None and row.lease_token == lease.token:
                    tx.adopt(row)  # forgotten with the call if it fails
                    row.extend(expires)
            return lost

        return await self._write(work)

    async def reap_expired(self, retry_delay: Callable[[int], float] | None = None) -> list[Job]:
        """Return jobs whose lease ran out to pending, or dead-letter them (at start:
        every job the last node left running or claimed)."""

        def work(tx: Tx) -> list[Job]:
            touched = []
            expired = tx.load_where(f"WHERE {LEASED} AND lease_expires <= ?", (tx.ts,))
            for row in expired:
                reap(tx, row, retry_delay)
                touched.append(row.job)
            return touched

        return await self._write(work)

    async def complete(self, lease: Lease, result: msgspec.Raw | None) -> Outcome | None:
        """Record success, then chain `on_success` and release waiting steps, atomically."""

        def work(tx: Tx) -> Outcome | None:
            row = outcome_of(tx, lease)
            if row is None:
                return None
            job = row.job
            job.result = result
            job.finished_at = tx.now
            tx.set_status(row, Status.DONE)
            tx.event(row, EventKind.SUCCEEDED)
            tx.save(row)
            released = steps.release_children(tx, row)
            return Outcome(job, tx.follow_up(job.on_success, job), released=released)

        return await self._write(work)

    async def fail(
        self, lease: Lease, error: str, retry_at: datetime | None, traceback: str | None = None
    ) -> Outcome | None:
        """Record a failed attempt: retry at `retry_at`, or dead-letter and chain."""

        def work(tx: Tx) -> Outcome | None:
            row = outcome_of(tx, lease)
            if row is None:
                return None
            job = row.job
            tx.record_error(row, error, traceback)
            tx.event(row, EventKind.ATTEMPT_FAILED, error, traceback)
            if retry_at is None:
                dead = tx.dead_letter(row)
                return Outcome(job, tx.follow_up(job.on_failure, job), dead)
            job.run_at = retry_at
            tx.make_pending(row)
            tx.event(row, EventKind.RETRY_SCHEDULED, retry_at.isoformat())
            tx.save(row)
            return Outcome(job, [])

        return await self._write(work)

    async def release(self, lease: Lease) -> bool:
        """Give the job back without counting the attempt."""

        def work(tx: Tx) -> bool:
            row = held(tx, lease, Status.RUNNING, Status.CLAIMED)
            if row is None:
                return False
            row.drop_lease()
            if row.job.status == Status.RUNNING:
                row.job.attempts -= 1
            tx.event(row, EventKind.RELEASED)
            tx.make_pending(row)
            tx.save(row)
            return True

        return await self._write(work)

    # -- queues and pruning ----------------------------------------------------------

    async def set_paused(self, queue: str, paused: bool) -> None:
        """Pause or resume a queue, kept across restarts."""

        def work(tx: Tx) -> None:
            tx.ctx.paused.set(tx.conn, queue, paused)
            if not paused:
                tx.ctx.wake()

        try:
            await self._write(work, durable=True)
        except BaseException:
            self._ctx.paused.forget()
            raise

    async def prune(self, finished_before: datetime, limit: int) -> int:
        """Delete finished jobs older than `finished_before` (see `pruning.prune`)."""
        return await pruning.prune(self._write, self.outbox, finished_before, limit)

    # -- this node ---------------------------------------------------------------------

    async def nodes(self) -> list[NodeSummary]:
        """This node alone: it is alive for as long as it answers."""
        types = sorted(self._limits)
        report = self._links.report()
        return [NodeSummary(self.node_id, self._opened_at, self.clock(), True, types, report)]
