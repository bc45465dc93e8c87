"""The SQLite store: one node's jobs in one SQLite file, whose rows are the truth.

Every call is one savepoint of the turn's transaction (`database.py`): it reads the rows
it needs through their indexes, applies the rules (`rules.py`, the memory store's rules
over rows) and writes them back, then waits for the commit. Nothing about jobs is kept
in memory between calls, so the node's memory does not grow with the backlog or the
history, a restart reads nothing back (jobs a dead node left `running` or `claimed` are
found by an index and reaped at once), and finished jobs stay until `prune` deletes
them by age (`--retention-seconds`).

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
from functools import partial
from typing import TypeVar

import msgspec
from goqueue.supervisor.dispatch.rates import Rate, StartTimes, Taken
from goqueue.supervisor.enums import TERMINAL, EventKind, Status, WorkflowStatus
from goqueue.supervisor.errors import (
    DuplicateJob,
    IdempotencyMismatch,
    InvalidState,
    NotFound,
    StoreFull,
)
from goqueue.supervisor.jobs import (
    BULK_CANCEL,
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
    utcnow,
)
from goqueue.supervisor.observe.summaries import (
    DeadFilter,
    NodeSummary,
    QueueSummary,
    TypeStats,
    dead_brief,
    job_brief,
)
from goqueue.supervisor.schedules.schedule import Fired, ScheduleState, fire_detail
from goqueue.supervisor.settings.config import DEFAULTS
from goqueue.supervisor.steps import WorkflowCounts
from goqueue.supervisor.store.base import EMBEDDED, LATE_OUTCOME, NewJob, NodeLinks
from goqueue.supervisor.store.memory.flows import FlowRecord
from goqueue.supervisor.store.sqlite import reads
from goqueue.supervisor.store.sqlite.database import Database
from goqueue.supervisor.store.sqlite.outbox import SqliteOutboxRows
from goqueue.supervisor.store.sqlite.rows import (
    Row,
    add_count,
    encode,
    events_of,
    from_ts,
    letter_of,
)
from goqueue.supervisor.store.sqlite.rules import FLOW, Context, PausedQueues, Tx
from goqueue.supervisor.workflows import WORKFLOW_CANCELLED, NewWorkflow, Workflow, WorkflowCreated

T = TypeVar("T")
log = logging.getLogger("goqueue.store.sqlite")
SCHEDULE = msgspec.json.Decoder(ScheduleState)
PRUNE_CHUNK = 500  # rows deleted per transaction: a prune never holds the loop long
LAST_SEQ = (
    "SELECT max(coalesce((SELECT max(seq) FROM jobs), 0),"
    " coalesce((SELECT max(seq) FROM workflows), 0))"
)
VACUUM_PAGES = 1000  # at most ~4 MB given back per prune chunk


class SqliteStore:
    """A durable store for one node in one SQLite file (see the module)."""

    traits = EMBEDDED

    def __init__(
        self,
        path: str,
        node_id: str = "local",
        *,
        lease_seconds: float = DEFAULTS.lease_seconds,
        max_pending: int | None = None,
        idempotency_ttl: float = DEFAULTS.idempotency_ttl,
        max_events_per_job: int = 100,
        clock: Callable[[], datetime] = utcnow,
        wake: Callable[[], None] = lambda: None,
        links: NodeLinks | None = None,
    ) -> None:
        self.node_id = node_id
        self.path = path
        self.clock = clock
        self.lease_seconds = lease_seconds
        self.db = Database(path)
        self.outbox = SqliteOutboxRows(self.db, node_id, clock)
        self._links = links or NodeLinks()
        self._limits: dict[str, int | None] = {}
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
        )

    def _next_seq(self) -> int:
        return next(self._seq)

    # -- the plumbing of every call ----------------------------------------------------

    async def _write(self, work: Callable[[Tx], T], durable: bool = False) -> T:
        """Run `work` in one savepoint at one instant, and wait for its commit (with
        `durable`, for the fsync after it)."""
        await self.db.writable()
        tx = Tx(self._ctx, self.clock())
        try:
            out, batch = self.db.run(lambda conn: work(tx.on(conn)))
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

    async def open(self) -> None:
        """Lock and open the file (BootError naming it if it cannot be). Nothing is read
        back: the leases a dead node left run out now, so the first reap takes them."""
        await self.db.open()
        self._read(
            lambda c: c.create_function("goqueue_contains", 2, reads.contains, deterministic=True)
        )
        (last,) = self._read(lambda c: c.execute(LAST_SEQ).fetchone())
        self._seq = itertools.count(int(last) + 1)
        now = self.clock().timestamp()
        await self.db.write(
            lambda c: c.execute(
                "UPDATE jobs SET lease_expires = ? WHERE lease_token IS NOT NULL", (now,)
            )
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

    async def register_node(self, limits: Mapping[str, int | None]) -> None:
        """Remember this node's job types and limits."""
        self._limits.clear()
        self._limits.update(limits)

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

    # -- periodic jobs ---------------------------------------------------------------

    async def schedule_states(self) -> dict[str, ScheduleState]:
        """Every schedule fired or switched, kept across restarts."""
        rows = self._read(lambda c: c.execute("SELECT state FROM schedules").fetchall())
        states = [SCHEDULE.decode(state) for (state,) in rows]
        return {state.name: state for state in states}

    async def fire_schedule(
        self, name: str, tick: datetime, new: NewJob, *, missed: bool = False
    ) -> tuple[Fired, Job | None]:
        """Fire `tick` once; its job and the schedule's last fire in one transaction."""

        def work(tx: Tx) -> tuple[Fired, Job | None]:
            state = _schedule(tx, name)
            if state is not None and not state.enabled:
                return Fired.DISABLED, None
            if state is not None and state.last_fire is not None and tick <= state.last_fire:
                return Fired.TAKEN, None
            job = tx.enqueue(new, fire_detail(name, tick, missed)).job
            state = state or ScheduleState(name=name)
            _save_schedule(tx, msgspec.structs.replace(state, last_fire=tick, last_job_id=job.id))
            return Fired.FIRED, job

        return await self._write(work, durable=True)

    async def set_schedule_enabled(self, name: str, enabled: bool) -> ScheduleState:
        """Enable or disable a schedule, kept across restarts; enabling it again
        (re)starts its count of missed ticks."""

        def work(tx: Tx) -> ScheduleState:
            state = _schedule(tx, name) or ScheduleState(name=name)
            if state.enabled != enabled:
                at = tx.now if enabled else state.enabled_at
                state = msgspec.structs.replace(state, enabled=enabled, enabled_at=at)
            _save_schedule(tx, state)
            return state

        return await self._write(work, durable=True)

    # -- claiming --------------------------------------------------------------------

    async def claim(
        self,
        limit: int,
        queues: frozenset[str] | None,
        slots: Mapping[str, int],
        start: int | None = None,
    ) -> list[Lease]:
        """Take up to `limit` due jobs, best first, within the per-type slots (one
        indexed statement per type); the best `start` of them (all when None) start at
        once, the others are `claimed`. In the file before a worker gets one."""
        if limit <= 0 or not any(n > 0 for n in slots.values()):
            return []

        def work(tx: Tx) -> list[Lease]:
            best = reads.due(tx.conn, tx.ts, queues, tx.paused(), slots, limit)
            leases = []
            for i, row in enumerate(best):
                tx.adopt(row)
                tx.lease(row, started=start is None or i < start)
                tx.save(row)
                lease = row.lease()
                assert lease is not None
                leases.append(lease)
            return leases

        return await self._write(work)

    async def start(self, lease: Lease) -> Lease | None:
        """Start the attempt of a `claimed` lease, in the file before its worker gets it."""

        def work(tx: Tx) -> Lease | None:
            row = _held(tx, lease, Status.CLAIMED)
            if row is None:
                return None
            tx.begin(row)
            row.lease_expires = tx.ts + self.lease_seconds
            tx.save(row)
            return row.lease()

        return await self._write(work)

    def next_due_at(self) -> datetime | None:
        """When the earliest delayed job becomes due (an indexed look-up)."""
        now = self.clock().timestamp()
        try:
            return from_ts(self._read(lambda c: reads.next_due(c, now)))
        except Exception:
            return None

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
                    "UPDATE jobs SET lease_expires = ? WHERE lease_token = ?",
                    (expires, lease.token),
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
            expired = tx.load_where(
                "WHERE lease_token IS NOT NULL AND lease_expires <= ?", (tx.ts,)
            )
            for row in expired:
                _reap(tx, row, retry_delay)
                touched.append(row.job)
            return touched

        return await self._write(work)

    async def complete(self, lease: Lease, result: msgspec.Raw | None) -> Outcome | None:
        """Record success, then chain `on_success` and release waiting steps, atomically."""

        def work(tx: Tx) -> Outcome | None:
            row = _outcome_of(tx, lease)
            if row is None:
                return None
            job = row.job
            job.result = result
            job.finished_at = tx.now
            tx.set_status(row, Status.DONE)
            tx.event(row, EventKind.SUCCEEDED)
            tx.save(row)
            released = tx.release_children(row)
            return Outcome(job, tx.follow_up(job.on_success, job), released=released)

        return await self._write(work)

    async def fail(
        self, lease: Lease, error: str, retry_at: datetime | None, traceback: str | None = None
    ) -> Outcome | None:
        """Record a failed attempt: retry at `retry_at`, or dead-letter and chain."""

        def work(tx: Tx) -> Outcome | None:
            row = _outcome_of(tx, lease)
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
            row = _held(tx, lease, Status.RUNNING, Status.CLAIMED)
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

    async def cancel(self, job_id: str, force: bool) -> tuple[Job, str | None]:
        """Cancel a pending or claimed job, or a running one with `force`; on disk before
        the answer."""

        def work(tx: Tx) -> tuple[Job, str | None]:
            row = tx.load(job_id)
            if row is None:
                raise NotFound(f"job {job_id} not found")
            status = row.job.status
            if status in TERMINAL:
                raise InvalidState(f"job {job_id} is already {status}", status)
            if status == Status.RUNNING and not force:
                raise InvalidState(f"job {job_id} is running; use force=true to kill it", status)
            return row.job, tx.cancel(row)

        return await self._write(work, durable=True)

    async def cancel_many(self, filters: CancelFilter, limit: int) -> Cancelled:
        """Cancel up to `limit` unfinished jobs passing `filters`, oldest first."""

        def work(tx: Tx) -> Cancelled:
            where, params = reads.cancel_filter(filters)
            left_alone = () if Status.RUNNING in filters.statuses else (Status.RUNNING,)
            running = reads.count_jobs(tx.conn, where, params, left_alone)
            total = reads.count_jobs(tx.conn, where, params, filters.statuses)
            marks = ",".join("?" * len(filters.statuses))
            taken = tx.load_where(
                f"{where} AND status IN ({marks}) ORDER BY created_at, seq LIMIT ?",
                (*params, *filters.statuses, limit),
            )
            killed = sum(1 for row in taken if row.job.status == Status.RUNNING)
            tokens = [t for row in taken if (t := tx.cancel(row, BULK_CANCEL)) is not None]
            jobs = [row.job for row in taken]
            return Cancelled(jobs, tokens, max(0, total - limit), running, killed)

        return await self._write(work, durable=True)

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
        """Delete up to `limit` finished jobs that finished before `finished_before`, with
        their trails (and workflows none of whose steps is left), oldest first, a chunk
        per transaction; expired keys go too, and free pages go back to the disk."""
        cutoff = finished_before.timestamp()
        pruned = 0
        while pruned < limit:
            chunk = min(PRUNE_CHUNK, limit - pruned)
            deleted = await self._write(partial(_prune_chunk, cutoff=cutoff, limit=chunk))
            pruned += deleted
            if deleted < chunk:
                break
        await self._write(_forget_expired)
        await self.outbox.prune(finished_before)
        if pruned:
            await self._write(lambda tx: _vacuum_a_little(tx.conn))
        return pruned

    # -- dead letters ----------------------------------------------------------------

    async def replay_dead(self, dead_id: str, max_retries: int) -> Job:
        """Replay a letter: the new job and the letter's removal in one transaction."""

        def work(tx: Tx) -> Job:
            dead = _letter(tx.conn, dead_id)
            if dead is None:
                raise NotFound(f"dead letter {dead_id} not found")
            tx.check_room()
            return _replay(tx, dead, max_retries)

        return await self._write(work, durable=True)

    async def replay_dead_many(self, filters: DeadFilter, limit: int) -> Replayed:
        """Replay up to `limit` matching letters, oldest first, each with its job's own
        retries, in one transaction; stops early (the rest remaining) once full."""

        def work(tx: Tx) -> Replayed:
            letters, more = reads.oldest_letters(tx.conn, filters, limit)
            jobs: list[Job] = []
            for dead in letters:
                try:
                    tx.check_room()
                except StoreFull:
                    if not jobs:
                        raise
                    break
                jobs.append(_replay(tx, dead, dead.job.max_retries))
            return Replayed(jobs, more + len(letters) - len(jobs))

        return await self._write(work, durable=True)

    async def purge_dead(self, dead_id: str) -> bool:
        """Delete a letter, on disk before the answer."""

        def work(tx: Tx) -> bool:
            gone = tx.conn.execute("DELETE FROM dead_letters WHERE id = ?", (dead_id,))
            return gone.rowcount > 0

        return await self._write(work, durable=True)

    async def purge_dead_many(self, filters: DeadFilter, limit: int) -> Purged:
        """Delete up to `limit` matching letters, oldest first, in one transaction."""

        def work(tx: Tx) -> Purged:
            letters, more = reads.oldest_letters(tx.conn, filters, limit)
            tx.conn.executemany(
                "DELETE FROM dead_letters WHERE id = ?", [(dead.id,) for dead in letters]
            )
            return Purged(len(letters), more)

        return await self._write(work, durable=True)

    # -- workflows -------------------------------------------------------------------

    async def create_workflow(self, new: NewWorkflow) -> WorkflowCreated:
        """Store every step at once, roots pending and the others waiting; on disk
        before the answer."""

        def work(tx: Tx) -> WorkflowCreated:
            if new.idempotency_key is not None:
                seen = tx.conn.execute(
                    "SELECT id, record FROM workflows WHERE idempotency_key = ?",
                    (new.idempotency_key,),
                ).fetchone()
                if seen is not None:
                    if FLOW.decode(seen[1]).request_hash != (new.request_hash or ""):
                        raise IdempotencyMismatch(seen[0])
                    return WorkflowCreated(_workflow(tx.conn, seen[0]), created=False)
            tx.check_room(sum(1 for step in new.steps if not step.after))
            _create_workflow(tx, new)
            return WorkflowCreated(_workflow(tx.conn, new.id), created=True)

        return await self._write(work, durable=True)

    async def get_workflow(self, workflow_id: str) -> Workflow | None:
        """One workflow with its steps' live statuses."""
        return self._read(lambda c: reads.workflow(c, workflow_id))

    async def list_workflows(self, status: WorkflowStatus | None, limit: int, offset: int) -> Page:
        """Workflows newest first, of `status` if given."""
        return self._read(lambda c: reads.workflows(c, status, limit, offset))

    async def workflow_counts(self) -> WorkflowCounts:
        """Workflows by status, and steps waiting."""
        return self._read(reads.workflow_counts)

    async def cancel_workflow(
        self, workflow_id: str
    ) -> tuple[Workflow, list[tuple[Job, str | None]]]:
        """Cancel every unfinished step (the running ones' lease tokens come back so the
        engine can kill their workers); on disk before the answer."""

        def work(tx: Tx) -> tuple[Workflow, list[tuple[Job, str | None]]]:
            flow = tx.flow(workflow_id)
            if flow is None:
                raise NotFound(f"workflow {workflow_id} not found")
            if flow.cancelled:
                raise InvalidState(f"workflow {workflow_id} is already cancelled", "cancelled")
            flow.cancelled = True
            tx.save_flow(flow)
            cancelled: list[tuple[Job, str | None]] = []
            for job_id in flow.steps.values():
                row = tx.load(job_id)
                if row is None or row.job.status in TERMINAL:
                    continue
                token = tx.cancel(row, WORKFLOW_CANCELLED, WORKFLOW_CANCELLED)
                cancelled.append((row.job, token))
            return _workflow(tx.conn, workflow_id), cancelled

        return await self._write(work, durable=True)

    # -- reads -----------------------------------------------------------------------

    async def get(self, job_id: str) -> Job | None:
        """One job by id."""
        return self._read(lambda c: reads.job(c, job_id))

    async def list_jobs(self, filters: JobFilter, limit: int, offset: int) -> Page:
        """Jobs newest first."""
        return self._read(lambda c: reads.jobs(c, filters, limit, offset))

    async def events(self, job_id: str) -> list[Event]:
        """A job's audit trail, oldest first."""
        found = self._read(
            lambda c: c.execute("SELECT events FROM jobs WHERE id = ?", (job_id,)).fetchone()
        )
        return [] if found is None else events_of(found[0])

    async def stats(self) -> Stats:
        """Counts by status and pending depth by queue and priority (kept as they change)."""
        return self._read(reads.stats)

    async def queue_stats(self, queue: str) -> QueueStats:
        """One queue's counts by status and depth by priority."""
        return self._read(lambda c: reads.queue_stats(c, queue))

    async def queue_depths(self, top: int) -> QueueDepths:
        """The `top` deepest queues by priority, the rest summed by priority."""
        now = self.clock().timestamp()
        return self._read(lambda c: reads.queue_depths(c, top, now))

    async def queue_names(self, limit: int) -> frozenset[str]:
        """Queues holding pending jobs, and paused queues (at most `limit`)."""
        return self._read(lambda c: reads.queue_names(c, limit))

    async def list_dead(self, limit: int, offset: int, filters: DeadFilter | None = None) -> Page:
        """Dead letters newest first (those passing `filters`)."""
        return self._read(lambda c: reads.letters(c, filters, limit, offset))

    async def get_dead(self, dead_id: str) -> DeadLetter | None:
        """One dead letter, by its own id or its job's."""
        return self._read(lambda c: _letter(c, dead_id) or _letter(c, dead_id, by_job=True))

    async def queue_summaries(self) -> list[QueueSummary]:
        """Every queue with pending, claimed or running jobs, and every paused one."""
        now = self.clock().timestamp()
        return self._read(lambda c: reads.queue_summaries(c, now))

    async def nodes(self) -> list[NodeSummary]:
        """This node alone: it is alive for as long as it answers."""
        types = sorted(self._limits)
        report = self._links.report()
        return [NodeSummary(self.node_id, self._opened_at, self.clock(), True, types, report)]

    async def type_stats(self) -> list[TypeStats]:
        """Counts by status, run-time percentiles (of the latest finished jobs) and
        failure rate of every job type."""
        return self._read(reads.type_stats)

    async def job_briefs(self, filters: JobFilter, limit: int, offset: int, preview: int) -> Page:
        """A page of `list_jobs` as brief rows."""
        page = await self.list_jobs(filters, limit, offset)
        return Page([job_brief(job, preview) for job in page.items], page.total)

    async def dead_briefs(self, filters: DeadFilter, limit: int, offset: int, preview: int) -> Page:
        """Dead letters newest first, filtered, as brief rows."""
        page = await self.list_dead(limit, offset, filters)
        return Page([dead_brief(dead, preview) for dead in page.items], page.total)


# -- the calls' steps ------------------------------------------------------------------


def _held(tx: Tx, lease: Lease, *statuses: Status) -> Row | None:
    """The row, if `lease` still holds it in one of `statuses` (running if none)."""
    row = tx.load(lease.job.id)
    if row is None or row.lease_token != lease.token:
        return None
    return row if row.job.status in (statuses or (Status.RUNNING,)) else None


def _outcome_of(tx: Tx, lease: Lease) -> Row | None:
    """The row an attempt's outcome is written to, its lease dropped: held by `lease`,
    or reopened for a late outcome (`_salvage`); None when the outcome is refused."""
    row = _held(tx, lease) or _salvage(tx, lease)
    if row is not None:
        row.drop_lease()
    return row


def _reap(tx: Tx, row: Row, retry_delay: Callable[[int], float] | None) -> None:
    """A lease ran out: a claim goes back in its place at no cost; a running attempt
    is lost (counted), retried after its delay or dead-lettered."""
    job = row.job
    error = f"lease expired (holder {row.lease_owner} lost)"
    token = row.lease_token
    row.drop_lease()
    if job.status == Status.CLAIMED:
        tx.make_pending(row)
        tx.event(row, EventKind.RELEASED, error)
        tx.save(row)
        return
    tx.event(row, EventKind.LEASE_EXPIRED)
    row.reaped_token = token
    tx.record_error(row, error, None)
    if job.attempts > job.max_retries:
        tx.event(row, EventKind.ATTEMPT_FAILED, error)
        tx.dead_letter(row)
        return
    tx.retry_in(row, 0.0 if retry_delay is None else retry_delay(job.attempts))
    tx.save(row)


def _salvage(tx: Tx, lease: Lease) -> Row | None:
    """The row of a fenced outcome that arrived late, reopened under its lease, if that
    attempt is the job's last one started and its lease was reaped (the rules in
    `store/base.py`); None when refused."""
    row = tx.load(lease.job.id)
    if row is None or row.reaped_token != lease.token:
        return None
    job = row.job
    if job.attempts != lease.job.attempts:
        return None
    was_failed = job.status == Status.FAILED
    if was_failed:
        dead = _letter(tx.conn, job.id, by_job=True)
        if job.on_failure is not None or dead is None:
            return None
        if job.unique_key is not None and tx.unique_holder(job.unique_key, job.id) is not None:
            return None
        tx.conn.execute("DELETE FROM dead_letters WHERE id = ?", (dead.id,))
    elif job.status == Status.CLAIMED:
        row.drop_lease()
    elif job.status != Status.PENDING:
        return None
    row.reaped_token = None
    if job.errors and job.errors[-1].attempt == job.attempts:
        job.errors = job.errors[:-1]
        job.last_error = job.errors[-1].error if job.errors else None
    job.finished_at = None
    tx.set_status(row, Status.RUNNING)
    row.lease_token, row.lease_owner, row.lease_expires = lease.token, lease.owner, tx.ts
    tx.event(row, EventKind.LATE_OUTCOME, LATE_OUTCOME)
    tx.save(row)
    if was_failed:  # a workflow step: the steps its dead letter cancelled wait again
        tx.resume(job, row)
    return row


def _replay(tx: Tx, dead: DeadLetter, max_retries: int) -> Job:
    """A fresh job from a dead letter, in its step's place; the letter goes."""
    row = tx.insert(dead.job.replay_spec(), max_retries, None)
    tx.resume(dead.job, row)
    tx.conn.execute("DELETE FROM dead_letters WHERE id = ?", (dead.id,))
    tx.event(row, EventKind.REPLAYED, dead.job_id)
    tx.save(row)
    return row.job


def _letter(conn: sqlite3.Connection, some_id: str, *, by_job: bool = False) -> DeadLetter | None:
    """A dead letter by its own id, or (`by_job`) the latest of a job."""
    column = "job_id" if by_job else "id"
    found = conn.execute(
        f"SELECT letter, parents FROM dead_letters WHERE {column} = ? ORDER BY seq DESC LIMIT 1",
        (some_id,),
    ).fetchone()
    return None if found is None else letter_of(found[0], found[1])


def _schedule(tx: Tx, name: str) -> ScheduleState | None:
    found = tx.conn.execute("SELECT state FROM schedules WHERE name = ?", (name,)).fetchone()
    return None if found is None else SCHEDULE.decode(found[0])


def _save_schedule(tx: Tx, state: ScheduleState) -> None:
    tx.conn.execute(
        "INSERT OR REPLACE INTO schedules (name, state) VALUES (?, ?)", (state.name, encode(state))
    )


def _create_workflow(tx: Tx, new: NewWorkflow) -> None:
    """Every step's row, its edges, and the workflow's record."""
    ids: dict[str, str] = {}
    for step in new.steps:
        parents = [ids[key] for key in step.after]

        def prepare(row: Row, parents: list[str] = parents, key: str = step.key) -> None:
            job = row.job
            job.workflow_id, job.step_key, job.parent_ids = new.id, key, parents
            if parents:
                job.status = Status.WAITING
                job.parents = msgspec.Raw(b"{}")
                row.waiting_on = len(parents)

        spec, retries = step.new.spec, step.new.max_retries
        row = tx.insert(spec, retries, None, detail=f"workflow {new.id}", prepare=prepare)
        ids[step.key] = row.job.id
        tx.conn.executemany(
            "INSERT INTO workflow_edges (parent_id, child_id) VALUES (?, ?)",
            [(parent, row.job.id) for parent in parents],
        )
    flow = FlowRecord(
        id=new.id,
        name=new.name,
        created_at=tx.now,
        steps=ids,
        seq=tx.ctx.next_seq(),
        idempotency_key=new.idempotency_key,
        request_hash=new.request_hash or "",
    )
    tx.conn.execute(
        "INSERT INTO workflows (id, seq, record, idempotency_key) VALUES (?, ?, ?, ?)",
        (flow.id, flow.seq, encode(flow), flow.idempotency_key),
    )


def _workflow(conn: sqlite3.Connection, workflow_id: str) -> Workflow:
    """A workflow this call made or found (NotFound if it is gone after all)."""
    found = reads.workflow(conn, workflow_id)
    if found is None:
        raise NotFound(f"workflow {workflow_id} not found")
    return found


def _prune_chunk(tx: Tx, *, cutoff: float, limit: int) -> int:
    """Delete up to `limit` jobs finished before `cutoff`; drop the workflows left with
    no step."""
    rows = tx.conn.execute(
        "SELECT seq, workflow_id, queue, type, priority, status FROM jobs"
        " WHERE finished_at < ? ORDER BY finished_at LIMIT ?",
        (cutoff, limit),
    ).fetchall()
    if not rows:
        return 0
    tx.conn.executemany("DELETE FROM jobs WHERE seq = ?", [(row[0],) for row in rows])
    for _, _, *group in rows:
        add_count(tx.counts, tuple(group), -1)
    for workflow_id in {row[1] for row in rows if row[1] is not None}:
        left = tx.conn.execute(
            "SELECT 1 FROM jobs WHERE workflow_id = ? LIMIT 1", (workflow_id,)
        ).fetchone()
        flow = None if left is not None else tx.flow(workflow_id)
        if flow is not None:
            steps = [(job_id, job_id) for job_id in flow.steps.values()]
            tx.conn.executemany(
                "DELETE FROM workflow_edges WHERE parent_id = ? OR child_id = ?", steps
            )
            tx.conn.execute("DELETE FROM workflows WHERE id = ?", (workflow_id,))
    return len(rows)


def _forget_expired(tx: Tx) -> None:
    """Expired dedupe and idempotency keys, and emptied count groups, go."""
    tx.conn.execute(
        "DELETE FROM job_keys WHERE rowid IN"
        " (SELECT rowid FROM job_keys WHERE expires < ? LIMIT 10000)",
        (tx.ts,),
    )
    tx.conn.execute("DELETE FROM job_counts WHERE n = 0")


def _vacuum_a_little(conn: sqlite3.Connection) -> None:
    """Give free pages back to the filesystem, a bounded number at a time, so the file
    does not keep the size of its busiest hour. One page per statement: the pragma frees
    a page per step, and Python's sqlite3 steps a statement that returns no row once."""
    (free,) = conn.execute("PRAGMA freelist_count").fetchone()
    for _ in range(min(free, VACUUM_PAGES)):
        conn.execute("PRAGMA incremental_vacuum(1)")
