"""The SQLite store: the memory store's working set, kept whole in a SQLite file.

Every rule (ordering, leases and fencing, dedupe, unique and idempotency keys, retries,
the DLQ, schedules) is the memory store's own code, so the two cannot drift apart and
reads never touch the disk. Each write marks what it changed and awaits the group
commit (`commit.py`) that puts those rows in the file before it answers. At start the
file is read back into memory; jobs it left `running` or `claimed` hold leases that have
already run out, so the first reap gives them back: a running one's attempt is counted,
then it is retried or dead-lettered, as on PostgreSQL.

Durability, call by call (every commit is `synchronous=NORMAL`: see `database.py`):
- What a client is told is stored (an enqueue's `201`, a schedule's fire, a cancel, a
  pause, a dead letter's replay or purge) is answered only after an fsync of the WAL that
  follows its commit (shared by every commit before it): what `synchronous=FULL` gives,
  without holding the writes behind it.
- Claims, starts, outcomes, reaps and webhook records wait for their commit only: in the
  WAL (so a `kill -9` of the node loses none of them: the OS has the pages) but not
  fsynced, so a power cut may lose the last of them. That is safe because the WAL is a
  sequence: what a power cut drops is a suffix of commits after the last fsync, never an
  answered enqueue before them. A lost `complete` or `fail` leaves the job as its start
  left it, `running` under a lease, so it is reaped and runs again (at least once, the
  contract); a lost start leaves it pending, so it runs again; the chained jobs and
  webhook deliveries of a lost outcome are written with it, so they come back when it
  runs again. A job may start before its enqueue's fsync is done; a power cut in that
  instant loses a job whose `201` was never sent.

One node owns the file (`database.py`); rate limits are this node's (kept in memory, a
window starts afresh after a restart).
"""

from __future__ import annotations

import itertools
import logging
import sqlite3
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import partial

import msgspec
from goqueue.supervisor.enums import TERMINAL, EventKind, Status
from goqueue.supervisor.errors import StoreUnavailable
from goqueue.supervisor.jobs import (
    CancelFilter,
    Cancelled,
    DeadLetter,
    Enqueued,
    Job,
    Lease,
    Outcome,
    Purged,
    Replayed,
    new_id,
    utcnow,
)
from goqueue.supervisor.observe.summaries import DeadFilter
from goqueue.supervisor.schedules.schedule import Fired, ScheduleState
from goqueue.supervisor.store.base import EMBEDDED, NewJob, NodeLinks
from goqueue.supervisor.store.memory.dead import DeadLetters
from goqueue.supervisor.store.memory.flows import FlowRecord
from goqueue.supervisor.store.memory.store import MemoryStore
from goqueue.supervisor.store.sqlite.changes import (
    EVENTS,
    FLOW,
    JOB,
    LETTER,
    SCHEDULE,
    Changes,
    Key,
    NewDelivery,
    Rows,
    joined,
)
from goqueue.supervisor.store.sqlite.commit import GroupCommit
from goqueue.supervisor.store.sqlite.database import Database
from goqueue.supervisor.store.sqlite.outbox import SqliteOutboxRows
from goqueue.supervisor.webhooks.delivery import event_of, job_body
from goqueue.supervisor.workflows import NewWorkflow, Workflow, WorkflowCreated

DEDUPE, IDEMPOTENCY = "dedupe", "idempotency"
log = logging.getLogger("goqueue.store.sqlite")


class _MarkedLetters(DeadLetters):
    """Dead letters that mark each one added or removed."""

    def __init__(self, mark: Callable[[str, DeadLetter | None], None]) -> None:
        super().__init__()
        self._mark = mark

    def add(self, dead: DeadLetter) -> None:
        super().add(dead)
        self._mark(dead.id, dead)

    def pop(self, dead_id: str) -> DeadLetter | None:
        dead = super().pop(dead_id)
        if dead is not None:
            self._mark(dead_id, None)
        return dead

    def restore(self, dead: DeadLetter) -> None:
        """Keep a letter read from the file (nothing to write)."""
        super().add(dead)


@dataclass(frozen=True)
class _Saved:
    """Everything the file holds, read at start."""

    jobs: list[tuple[bytes, bytes | None, bytes | None, bytes]]
    letters: list[tuple[bytes, bytes | None]]
    keys: list[tuple[str, str, str, str, float]]
    paused: list[str]
    schedules: list[bytes]
    flows: list[bytes]


def _read_all(conn: sqlite3.Connection) -> _Saved:
    return _Saved(
        jobs=conn.execute("SELECT job, result, parents, events FROM jobs ORDER BY seq").fetchall(),
        letters=conn.execute("SELECT letter, parents FROM dead_letters ORDER BY seq").fetchall(),
        keys=conn.execute(
            "SELECT kind, key, job_id, request_hash, expires FROM job_keys ORDER BY expires"
        ).fetchall(),
        paused=[r[0] for r in conn.execute("SELECT queue FROM paused_queues")],
        schedules=[r[0] for r in conn.execute("SELECT state FROM schedules")],
        flows=[r[0] for r in conn.execute("SELECT record FROM workflows ORDER BY seq")],
    )


class SqliteStore(MemoryStore):
    """A durable store for one node in one SQLite file (see the module)."""

    # Every write waits for its commit, so outcomes go through the dispatcher's tasks and a
    # claim is worth taking ahead (as on PostgreSQL); but one node holds every job, so its
    # own last claim tells what waits ahead of a job it would start at its enqueue (as in
    # memory).
    traits = EMBEDDED

    def __init__(
        self,
        path: str,
        node_id: str = "local",
        *,
        lease_seconds: float = 30.0,
        max_pending: int = 100_000,
        idempotency_ttl: float = 86_400.0,
        max_finished: int = 100_000,
        max_events_per_job: int = 100,
        clock: Callable[[], datetime] = utcnow,
        wake: Callable[[], None] = lambda: None,
        links: NodeLinks | None = None,
    ) -> None:
        super().__init__(
            node_id,
            wake=wake,
            links=links,
            lease_seconds=lease_seconds,
            max_pending=max_pending,
            idempotency_ttl=idempotency_ttl,
            max_finished=max_finished,
            max_events_per_job=max_events_per_job,
            clock=clock,
        )
        self.path = path
        self.db = Database(path)
        self._changes = Changes()
        self._letters = _MarkedLetters(self._mark_letter)
        self._dead = self._letters
        self._group = GroupCommit(self.db, self._take, self._encode, self._give_back)
        # outcomes whose commit failed: the dispatcher's retry finds them here
        self._held_outcomes: dict[str, Outcome] = {}
        self.outbox = SqliteOutboxRows(self.db, node_id, clock)

    # -- lifecycle -------------------------------------------------------------------

    async def open(self) -> None:
        """Lock and open the file (BootError naming it if it cannot be), then read it
        back into memory."""
        await self.db.open()
        self._restore(await self.db.read(_read_all))

    async def close(self) -> None:
        """Commit what is left, then close the file (logging what writing it cost)."""
        try:
            await self._group.commit(durable=True)
        finally:
            await self.db.close()
            counts = {"transactions": self.db.transactions, "fsyncs": self.db.syncs}
            log.info("SQLite file closed", extra={"path": self.path, **counts})

    async def ping(self) -> bool:
        """True while the file answers."""
        try:
            await self.db.read(lambda conn: conn.execute("SELECT 1").fetchone())
        except Exception:
            return False
        return True

    def _restore(self, saved: _Saved) -> None:
        """Take back everything the file holds, as this node's working set."""
        now = self.clock()
        self._changes = Changes()
        self._restore_jobs(saved.jobs, now)
        for letter, parents in saved.letters:
            dead = LETTER.decode(letter)
            joined(dead.job, None, parents)
            self._letters.restore(dead)
        for record in saved.flows:
            for ready in self._flows.restore(FLOW.decode(record), self._jobs):
                self._set_status(ready, Status.PENDING, now)  # a half-written release
                self._make_pending(ready, now)
                self._changes.touch(ready)
        ts = now.timestamp()
        for kind, key, job_id, request_hash, expires in saved.keys:
            if expires <= ts:
                continue
            if kind == DEDUPE:
                self._dedupe[key] = (job_id, expires)
            else:
                self._idempotency[key] = (request_hash, job_id, expires)
        self._paused.update(saved.paused)
        for state in saved.schedules:
            self._schedules.restore(SCHEDULE.decode(state))

    def _restore_jobs(
        self, rows: list[tuple[bytes, bytes | None, bytes | None, bytes]], now: datetime
    ) -> None:
        """Jobs by enqueue order: pending ones queued, running ones held by a lease that
        has run out, waiting ones left to their workflow, finished ones in prune order."""
        finished: list[Job] = []
        last_seq = 0
        for job_row, result, parents, events_row in rows:
            job = joined(JOB.decode(job_row), result, parents)
            last_seq = max(last_seq, job.seq)
            self._jobs[job.id] = job
            self._counts[job.status] += 1
            self._events[job.id] = EVENTS.decode(events_row)
            if job.status in TERMINAL:
                finished.append(job)
                continue
            if job.unique_key is not None:
                self._unique[job.unique_key] = job.id
            if job.status == Status.PENDING:
                self._make_pending(job, now)
            elif job.status == Status.WAITING:  # its workflow (below) knows what for
                continue
            else:  # its holder was this file's last node, now gone: reaped at once
                lease = Lease(job=job, token=new_id(), owner=self.node_id, expires_at=now)
                self._tokens[job.id] = lease.token
                self._leases[lease.token] = lease
        finished.sort(key=lambda job: job.finished_at or job.updated_at)
        self._finished.extend(job.id for job in finished)
        self._seq = itertools.count(last_seq + 1)

    # -- marks and commits -----------------------------------------------------------

    def _event(
        self,
        job: Job,
        kind: EventKind,
        now: datetime,
        detail: str | None = None,
        traceback: str | None = None,
    ) -> None:
        super()._event(job, kind, now, detail, traceback)
        self._changes.touch(job)  # every change of a job records an event

    def _forget(self, job_id: str) -> None:
        super()._forget(job_id)
        self._changes.forget(job_id)

    def _set_status(self, job: Job, status: Status, now: datetime) -> None:
        super()._set_status(job, status, now)
        event = event_of(job)
        if event is not None and job.webhook_url is not None:  # owed, with this status
            self._changes.deliveries.append(
                NewDelivery(
                    id=new_id(),
                    job_id=job.id,
                    event=event,
                    url=job.webhook_url,
                    body=job_body(job),
                    created_at=now.timestamp(),
                )
            )

    def _mark_letter(self, dead_id: str, dead: DeadLetter | None) -> None:
        self._changes.letters[dead_id] = dead

    def _enqueue(self, new: NewJob, now: datetime) -> Enqueued:
        enqueued = super()._enqueue(new, now)
        if enqueued.created:
            job_id, spec = enqueued.job.id, new.spec
            if spec.dedupe_key is not None and spec.dedupe_window_seconds:
                expires = self._dedupe[spec.dedupe_key][1]
                self._changes.keys[DEDUPE, spec.dedupe_key] = Key(job_id, "", expires)
            if new.idempotency_key is not None:
                request_hash, _, expires = self._idempotency[new.idempotency_key]
                key = Key(job_id, request_hash, expires)
                self._changes.keys[IDEMPOTENCY, new.idempotency_key] = key
        return enqueued

    def _take(self) -> Changes:
        taken, self._changes = self._changes, Changes()
        return taken

    def _encode(self, changes: Changes) -> Rows:
        return changes.rows(self._events)

    def _give_back(self, taken: Changes) -> None:
        self._changes.give_back(taken, self._jobs)

    async def _commit(self, durable: bool) -> None:
        await self._group.commit(durable)

    # -- enqueue ---------------------------------------------------------------------

    async def enqueue(self, new: NewJob) -> Enqueued:
        """Store one job; returns once it is on disk. Raises StoreUnavailable when the
        file cannot take it (then the job is not kept)."""
        enqueued = await super().enqueue(new)
        try:
            await self._commit(durable=True)
        except StoreUnavailable:
            self._unstore(enqueued, new)
            raise
        return enqueued

    async def enqueue_many(self, news: Sequence[NewJob]) -> list[Enqueued | Exception]:
        """Store several jobs in one transaction, on disk before the answer."""
        out = await super().enqueue_many(news)
        try:
            await self._commit(durable=True)
        except StoreUnavailable:
            for new, enqueued in zip(news, out, strict=True):
                if isinstance(enqueued, Enqueued):
                    self._unstore(enqueued, new)
            raise
        return out

    def _unstore(self, enqueued: Enqueued, new: NewJob) -> None:
        """Forget a job whose enqueue could not be written, as if never asked: its client
        hears 503 and may try again. A job something else moved on meanwhile stays (it is
        written with that change)."""
        job = enqueued.job
        if not enqueued.created or self._jobs.get(job.id) is not job:
            return
        token = self._tokens.get(job.id)
        if job.status == Status.PENDING:
            self._pending.discard(job, self.clock().timestamp())
            self._depth_add(job, -1)
        elif job.status != Status.RUNNING or token is None or job.attempts != 1:
            return
        if token is not None:
            self._drop_lease(token)
        if job.unique_key is not None and self._unique.get(job.unique_key) == job.id:
            del self._unique[job.unique_key]
        dedupe, idempotency = new.spec.dedupe_key, new.idempotency_key
        if dedupe is not None and self._dedupe.get(dedupe, ("",))[0] == job.id:
            del self._dedupe[dedupe]
            self._changes.keys.pop((DEDUPE, dedupe), None)
        if idempotency is not None and self._idempotency.get(idempotency, ("", ""))[1] == job.id:
            del self._idempotency[idempotency]
            self._changes.keys.pop((IDEMPOTENCY, idempotency), None)
        del self._jobs[job.id]
        self._counts[job.status] -= 1
        self._events.pop(job.id, None)
        self._changes.forget(job.id)

    async def fire_schedule(
        self, name: str, tick: datetime, new: NewJob, *, missed: bool = False
    ) -> tuple[Fired, Job | None]:
        """Fire `tick` once; its job and the schedule's last fire in one transaction."""
        fired, job = await super().fire_schedule(name, tick, new, missed=missed)
        if fired == Fired.FIRED:
            self._mark_schedule(name)
            await self._commit(durable=True)
        return fired, job

    async def set_schedule_enabled(self, name: str, enabled: bool) -> ScheduleState:
        """Enable or disable a schedule, kept across restarts."""
        state = await super().set_schedule_enabled(name, enabled)
        self._mark_schedule(name)
        await self._commit(durable=True)
        return state

    def _mark_schedule(self, name: str) -> None:
        state = self._schedules.states().get(name)
        if state is not None:
            self._changes.schedules[name] = state

    # -- claims and outcomes ---------------------------------------------------------

    async def claim(
        self,
        limit: int,
        queues: frozenset[str] | None,
        slots: Mapping[str, int],
        start: int | None = None,
    ) -> list[Lease]:
        """Take due jobs; their starts are in the file before a worker gets one."""
        leases = await super().claim(limit, queues, slots, start)
        if leases:
            await self._commit(durable=False)
        return leases

    async def start(self, lease: Lease) -> Lease | None:
        """Start a claimed lease's attempt, in the file before its worker gets it."""
        started = await super().start(lease)
        if started is not None:
            await self._commit(durable=False)
        return started

    async def reap_expired(self, retry_delay: Callable[[int], float] | None = None) -> list[Job]:
        """Take back expired leases (at start: every job the last node left running)."""
        touched = await super().reap_expired(retry_delay)
        if touched:
            await self._commit(durable=False)
        return touched

    async def complete(self, lease: Lease, result: msgspec.Raw | None) -> Outcome | None:
        """Record success (and its chained job) in the file."""
        return await self._outcome(lease, partial(MemoryStore.complete, self, lease, result))

    async def fail(
        self, lease: Lease, error: str, retry_at: datetime | None, traceback: str | None = None
    ) -> Outcome | None:
        """Record a failed attempt (a retry, or a dead letter and its chained job)."""
        write = partial(MemoryStore.fail, self, lease, error, retry_at, traceback)
        return await self._outcome(lease, write)

    async def _outcome(
        self, lease: Lease, write: Callable[[], Awaitable[Outcome | None]]
    ) -> Outcome | None:
        """An outcome changes memory once; when its commit fails the dispatcher holds it
        and calls again, and finds it here to commit again (not a stale lease)."""
        outcome = self._held_outcomes.get(lease.token) or await write()
        if outcome is None:
            return None
        self._held_outcomes[lease.token] = outcome
        await self._commit(durable=False)
        del self._held_outcomes[lease.token]
        return outcome

    async def release(self, lease: Lease) -> bool:
        """Hand a job back, in the file."""
        released = await super().release(lease)
        if released:
            await self._commit(durable=False)
        return released

    async def cancel(self, job_id: str, force: bool) -> tuple[Job, str | None]:
        """Cancel a job, on disk before the answer."""
        out = await super().cancel(job_id, force)
        await self._commit(durable=True)
        return out

    async def cancel_many(self, filters: CancelFilter, limit: int) -> Cancelled:
        """Cancel every job `filters` select, on disk before the answer."""
        cancelled = await super().cancel_many(filters, limit)
        await self._commit(durable=True)
        return cancelled

    async def create_workflow(self, new: NewWorkflow) -> WorkflowCreated:
        """Store a workflow's steps at once, on disk before the answer."""
        created = await super().create_workflow(new)
        if created.created:
            self._mark_flow(new.id)
            await self._commit(durable=True)
        return created

    async def cancel_workflow(
        self, workflow_id: str
    ) -> tuple[Workflow, list[tuple[Job, str | None]]]:
        """Cancel a workflow's unfinished steps, on disk before the answer."""
        cancelled = await super().cancel_workflow(workflow_id)
        self._mark_flow(workflow_id)
        await self._commit(durable=True)
        return cancelled

    def _release_children(self, parent: Job, now: datetime) -> list[Job]:
        released = super()._release_children(parent, now)
        for child_id in self._flows.children.get(parent.id, ()):  # each holds its result
            child = self._jobs.get(child_id)
            if child is not None:
                self._changes.touch(child)
        return released

    def _resume(self, old: Job, fresh: Job, now: datetime) -> None:
        super()._resume(old, fresh, now)
        if old.workflow_id is not None:  # a step replaced, its edges moved: all rewritten
            self._mark_flow(old.workflow_id)

    def _drop_flow(self, flow: FlowRecord) -> None:
        super()._drop_flow(flow)
        self._changes.flows[flow.id] = None

    def _mark_flow(self, workflow_id: str) -> None:
        """A workflow changed: its record and every step it holds are written."""
        flow = self._flows.flows.get(workflow_id)
        if flow is None:
            return
        self._changes.flows[workflow_id] = flow
        for job_id in flow.steps.values():
            job = self._jobs.get(job_id)
            if job is not None:
                self._changes.touch(job)

    # -- queues, pruning, dead letters -----------------------------------------------

    async def set_paused(self, queue: str, paused: bool) -> None:
        """Pause or resume a queue, kept across restarts."""
        await super().set_paused(queue, paused)
        self._changes.paused[queue] = paused
        await self._commit(durable=True)

    async def prune(self, finished_before: datetime, limit: int) -> int:
        """Forget old finished jobs (and expired keys), then give free pages back."""
        pruned = await super().prune(finished_before, limit)
        self._changes.keys_expired_before = self.clock().timestamp()
        await self._commit(durable=False)
        if pruned:
            await self.outbox.prune(finished_before)
            await self.db.write(_vacuum_a_little)
        return pruned

    async def replay_dead(self, dead_id: str, max_retries: int) -> Job:
        """Replay a letter: the new job and the letter's removal in one transaction."""
        job = await super().replay_dead(dead_id, max_retries)
        await self._commit(durable=True)
        return job

    async def replay_dead_many(self, filters: DeadFilter, limit: int) -> Replayed:
        """Replay matching letters, in one transaction."""
        replayed = await super().replay_dead_many(filters, limit)
        await self._commit(durable=True)
        return replayed

    async def purge_dead(self, dead_id: str) -> bool:
        """Delete a letter, on disk before the answer."""
        purged = await super().purge_dead(dead_id)
        await self._commit(durable=True)
        return purged

    async def purge_dead_many(self, filters: DeadFilter, limit: int) -> Purged:
        """Delete matching letters, in one transaction."""
        purged = await super().purge_dead_many(filters, limit)
        await self._commit(durable=True)
        return purged


VACUUM_PAGES = 1000  # at most ~4 MB given back per prune: a prune never stalls the writer


def _vacuum_a_little(conn: sqlite3.Connection) -> None:
    """Give free pages back to the filesystem, a bounded number at a time, so the file
    does not keep the size of its busiest hour. One page per statement: the pragma frees
    a page per step, and Python's sqlite3 steps a statement that returns no row once."""
    (free,) = conn.execute("PRAGMA freelist_count").fetchone()
    for _ in range(min(free, VACUUM_PAGES)):
        conn.execute("PRAGMA incremental_vacuum(1)")
