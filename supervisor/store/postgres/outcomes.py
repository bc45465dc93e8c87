"""What happens to a PostgreSQL job once it may run: claims, and every write about an
attempt (heartbeat, complete, fail, release), each fenced by the lease token; reaping
expired leases. Cancels are `cancels.py`'s.

A claim is one statement (the schema's claim function) and writes a `started` event per
lease. Completes are group-committed like enqueues. Every state change writes its audit
events in the statement that makes it (see `sql/statements.py`).

A fenced outcome is not always stale: a supervisor frozen past the lease may hold a
finished attempt's outcome while another node reaps the lease. If no later attempt has
started, that outcome is the truth, and `salvage` writes it (see there).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

import msgspec
import psycopg
from goqueue.supervisor.common.enums import EventKind, Status
from goqueue.supervisor.common.jobs import (
    DeadLetter,
    Job,
    Lease,
    Outcome,
    new_id,
)
from goqueue.supervisor.store.base import LATE_OUTCOME
from goqueue.supervisor.store.postgres import rows as pg_rows
from goqueue.supervisor.store.postgres.connection import Batcher, Conn, Connections, group_or_each
from goqueue.supervisor.store.postgres.enqueue import Enqueuer
from goqueue.supervisor.store.postgres.floors import ClaimFloors
from goqueue.supervisor.store.postgres.notify import Wakeups
from goqueue.supervisor.store.postgres.rows import Row
from goqueue.supervisor.store.postgres.sql.claim_keys import HELD_MARK
from goqueue.supervisor.store.postgres.sql.statements import (
    LIVE_LEASES,
    N_JOB_FIELDS,
    Sql,
    Statements,
)
from goqueue.supervisor.store.postgres.workflows import PgWorkflows

Done = tuple[Lease, msgspec.Raw | None]  # a complete: the lease and the result


class Begin(msgspec.Struct, frozen=True):
    """A start: the claimed lease whose attempt begins."""

    lease: Lease


Write = Done | Begin  # what the group commit of attempts writes
Answer = Outcome | Lease | None
Trail = Sequence[tuple[EventKind, str]]  # events (kind, detail) a statement writes

LATE = (EventKind.LATE_OUTCOME, LATE_OUTCOME)


def _trail(events: Trail, traceback: str | None = None) -> dict[str, list[Any]]:
    """The `events`, `details` and `tracebacks` parameters of a statement writing
    `events` (`traceback` goes with the attempt_failed one)."""
    tracebacks = [traceback if k == EventKind.ATTEMPT_FAILED else None for k, _ in events]
    return {
        "events": [k.value for k, _ in events],
        "details": [d for _, d in events],
        "tracebacks": tracebacks,
    }


def _utc_iso(at: datetime) -> str:
    """`at` as the database returns it (UTC; a naive time is read as UTC, as there)."""
    return (at if at.tzinfo is not None else at.replace(tzinfo=UTC)).astimezone(UTC).isoformat()


class Outcomes:
    """Claims and the writes fenced by their leases (see the module)."""

    def __init__(
        self,
        db: Connections,
        sql: Statements,
        node_id: str,
        wakeups: Wakeups,
        enqueuer: Enqueuer,
        workflows: PgWorkflows,
        floors: ClaimFloors,
        *,
        schema: str,
        lease_seconds: float,
    ) -> None:
        self._db = db
        self._floors = floors
        self._sql = sql
        self.node_id = node_id
        self._wakeups = wakeups
        self._enqueuer = enqueuer  # for follow-ups (`on_success`, `on_failure`)
        self._workflows = workflows  # steps released, cancelled with their parents' outcomes
        self.lease_seconds = lease_seconds
        self.live_window = LIVE_LEASES * lease_seconds  # a node's limits count meanwhile
        self.key_held: list[str] = []  # types a short claim held jobs of back by key
        self._lock_ns = f"goqueue.type.{schema}."
        # completes and starts share groups: a worker's outcome and its next job's start
        # commit together
        self._completes: Batcher[Write, Answer] = Batcher(
            self._write_completes, limit=1000, gather=True
        )

    async def idle(self, timeout: float) -> None:
        """Wait (up to `timeout`) for the groups of completes under way to be written."""
        await self._completes.idle(timeout)

    def cancel_groups(self) -> None:
        """Stop writing groups (the store is closing)."""
        self._completes.cancel()

    # -- claiming --------------------------------------------------------------------

    async def claim(
        self,
        limit: int,
        queues: frozenset[str] | None,
        slots: Mapping[str, int],
        start: int | None = None,
        start_types: frozenset[str] = frozenset(),
    ) -> list[Lease]:
        """Take up to `limit` due jobs as leases, within this node's slots and the global
        per-type limits, starting the best `start` (all when None) and those at the head
        of the claim whose type is one of `start_types`: one statement, one round trip.
        Each (type, priority) is walked from its floor (`ClaimFloors`)."""
        types = sorted(t for t, n in slots.items() if n > 0)
        if limit <= 0 or not types:
            return []
        floor_at, floor_seq = self._floors.arrays(queues, types)
        literal = pg_rows.array_literal  # lists cost psycopg far more to adapt
        params = {
            "types": literal(types),
            "caps": literal([slots[t] for t in types]),
            "queues": None if queues is None else literal(sorted(queues)),
            "limit": limit,
            "node": self.node_id,
            "lease": self.lease_seconds,
            "live": self.live_window,
            "lock_ns": self._lock_ns,
            "start": limit if start is None else start,
            "floor_at": literal(floor_at),
            "floor_seq": literal(floor_seq),
            "start_types": literal(sorted(start_types)),
        }
        rows = await self._db.execute(self._sql[Sql.CLAIM], params)
        # One row holds no job: which types are limited, the database's now() and, after
        # a short claim, when the next scheduled job is due.
        (summary,) = [row for row in rows if row[0] is None]
        next_due, named, db_now = summary[-3:]
        leases = [self._lease(row) for row in rows if row[0] is not None]
        # after the limited types, `~type`: a type some of whose due jobs a key held back
        limited = [t for t in named or () if not t.startswith(HELD_MARK)]
        self.key_held.extend(t[1:] for t in named or () if t.startswith(HELD_MARK))
        short = len(leases) < limit
        self._wakeups.claimed(queues, types, limited, next_due, short=short)
        held = set(limited) - self._floors.key_only  # limited by key alone: not held
        exhausted = _exhausted(types, slots, limit, held, leases, short)
        self._floors.claimed(queues, leases, exhausted, db_now)
        leases.sort(key=lambda lease: (-lease.job.priority, lease.job.run_at, lease.job.seq))
        return leases

    @staticmethod
    def _lease(row: Row) -> Lease:
        n = N_JOB_FIELDS
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
        held = {row[0] for row in await self._db.execute(self._sql[Sql.HEARTBEAT], params)}
        return [x.token for x in leases if x.token not in held]

    async def start(self, lease: Lease) -> Lease | None:
        """Start a claimed lease's attempt (group-committed with completes)."""
        answer = await self._completes.submit(Begin(lease))
        assert answer is None or isinstance(answer, Lease)
        return answer

    async def reap_expired(self, retry_delay: Callable[[int], float] | None = None) -> list[Job]:
        """Take back jobs whose lease ran out: a claimed one goes back to pending in its
        place at no cost; a running one lost its attempt, and is pending again after
        `retry_delay(attempts)` seconds or dead-lettered when it was its last. Several
        nodes may reap at once. Within a lease term of the database's start nothing is
        reaped: every lease ran out while it was down, live holders' too, and they need
        that term to extend theirs (a node that booted after the outage cannot know)."""
        touched: list[Job] = []
        pending: list[Job] = []  # requeued jobs and on_failure follow-ups
        async with self._db.connection() as conn, conn.transaction():
            params = {"limit": 100, "term": self.lease_seconds}
            cur = await conn.execute(self._sql[Sql.EXPIRED], params)
            for expired in await cur.fetchall():
                outcome = await self._reap_one(conn, expired, retry_delay)
                touched.append(outcome.job)
                pending.extend(outcome.followups)
                if outcome.job.status == Status.PENDING:
                    pending.append(outcome.job)
        self._wakeups.pending(pending)
        for job in touched:
            self._wakeups.freed(job)
        return touched

    async def _reap_one(
        self, conn: Conn, expired: Row, retry_delay: Callable[[int], float] | None
    ) -> Outcome:
        """Requeue (or bury) one job whose lease ran out; its row is locked already."""
        job_id, token, owner, attempts, max_retries, status = expired
        error = pg_rows.text(f"lease expired (node {owner} lost)") or ""
        if status == Status.CLAIMED:
            params = {"id": job_id, "token": token, "node": self.node_id}
            row = await self._db.fetchone(conn, self._sql[Sql.RELEASE], params)
            assert row is not None  # locked FOR UPDATE, so the fence still holds
            return Outcome(pg_rows.job(row), [])
        retry_at = None
        if retry_delay is not None:
            retry_at = datetime.now(UTC) + timedelta(seconds=retry_delay(attempts))
        params = {"id": job_id, "token": token, "error": error, "retry_at": retry_at}
        params["traceback"] = None
        lost = (EventKind.LEASE_EXPIRED, error)
        if attempts > max_retries:
            outcome = await self._bury(conn, params, lost)
        else:
            params |= _trail([lost])
            outcome = await self._requeue(conn, params)
        assert outcome is not None  # locked FOR UPDATE, so the fence still holds
        return outcome

    # -- outcomes --------------------------------------------------------------------

    async def complete(self, lease: Lease, result: msgspec.Raw | None) -> Outcome | None:
        """Record success and enqueue `on_success` atomically; None if the lease is stale.
        Completes arriving while another's commit is in flight share the next transaction
        (group commit), one statement for all of them unless some chain a job."""
        answer = await self._completes.submit((lease, result))
        assert answer is None or isinstance(answer, Outcome)
        if answer is None:
            answer = await self.salvage(lease, partial(self._complete_one, lease, result))
            if answer is not None:
                self._wakeups.pending(answer.followups)
                self._wakeups.freed(answer.job)
        return answer

    async def _write_completes(self, items: list[Write]) -> list[Answer | Exception]:
        """Write one group of completes and starts (see `group_or_each`)."""
        return await group_or_each(self._complete_group, items)

    async def _complete_group(self, items: list[Write]) -> list[Answer]:
        """Complete and start several leases in one transaction; each is fenced by its
        own token."""
        dones = [x for x in items if not isinstance(x, Begin)]
        begins = [x for x in items if isinstance(x, Begin)]
        async with self._db.connection("complete") as conn:
            # a follow-up or a workflow step's release commits with its parent's success
            chains = any(
                lease.job.on_success is not None or lease.job.workflow_id is not None
                for lease, _ in dones
            )
            if not chains and not (dones and begins):
                outcomes = await self._complete_in(conn, dones) if dones else []
                started = await self._start_in(conn, begins) if begins else {}
            else:  # pipelined: BEGIN goes with the first statement, COMMIT with the last
                async with conn.pipeline(), conn.transaction():
                    started = await self._start_in(conn, begins) if begins else {}
                    outcomes = await self._complete_in(conn, dones) if dones else []
        done = [outcome for outcome in outcomes if outcome is not None]
        pending = [job for outcome in done for job in (*outcome.followups, *outcome.released)]
        if pending:
            self._wakeups.pending(pending)
        limited = self._wakeups.limited  # (most jobs' types have no global limit)
        for job in [outcome.job for outcome in done if outcome.job.type in limited]:
            self._wakeups.freed(job)
        answers: list[Answer] = []
        by_done = iter(outcomes)
        for item in items:
            if isinstance(item, Begin):
                answers.append(started.get(item.lease.token))
            else:
                answers.append(next(by_done))
        return answers

    async def _start_in(self, conn: Conn, begins: list[Begin]) -> dict[str, Lease]:
        """Start the claimed leases of `begins` (one statement); by token, those held."""
        params = {
            "ids": [b.lease.job.id for b in begins],
            "tokens": [b.lease.token for b in begins],
            "node": self.node_id,
            "lease": self.lease_seconds,
        }
        cur = await conn.execute(self._sql[Sql.START_MANY], params)
        rows = {str(r[1]): r for r in await cur.fetchall()}
        started: dict[str, Lease] = {}
        for begin in begins:
            row = rows.get(begin.lease.token)
            if row is None:
                continue
            _, _, attempts, at = row
            job = msgspec.structs.replace(
                begin.lease.job,
                status=Status.RUNNING,
                attempts=attempts,
                started_at=at,
                updated_at=at,
            )
            started[begin.lease.token] = msgspec.structs.replace(begin.lease, job=job)
        return started

    async def _complete_one(
        self, lease: Lease, result: msgspec.Raw | None, conn: Conn
    ) -> Outcome | None:
        (outcome,) = await self._complete_in(conn, [(lease, result)])
        return outcome

    async def _complete_in(self, conn: Conn, items: list[Done]) -> list[Outcome | None]:
        """Mark the group's jobs done (one statement), then chain their `on_success`."""
        hooked = any(lease.job.webhook_url is not None for lease, _ in items)
        if len(items) == 1:
            lease, result = items[0]
            params = {"id": lease.job.id, "token": lease.token, "result": result}
            params["node"] = self.node_id
            statement = self._sql[Sql.COMPLETE if hooked else Sql.COMPLETE_UNHOOKED]
            row = await self._db.fetchone(conn, statement, params)
            finished = {} if row is None else {(lease.job.id, lease.token): row[0]}
        else:
            columns = {
                "ids": [lease.job.id for lease, _ in items],
                "tokens": [lease.token for lease, _ in items],
                "results": [None if r is None else bytes(r).decode() for _, r in items],
                "node": self.node_id,
            }
            statement = self._sql[Sql.COMPLETE_MANY if hooked else Sql.COMPLETE_MANY_UNHOOKED]
            cur = await conn.execute(statement, columns)
            finished = {(r[0], r[1]): r[2] for r in await cur.fetchall()}
        outcomes: list[Outcome | None] = []
        for lease, result in items:
            at = finished.pop((lease.job.id, lease.token), None)  # a repeat is stale
            if at is None:
                outcomes.append(None)
                continue
            job = msgspec.structs.replace(
                lease.job, status=Status.DONE, result=result, finished_at=at, updated_at=at
            )
            followups = await self._enqueuer.follow_up(conn, job.on_success, job)
            outcomes.append(Outcome(job, followups))
        await self._release(conn, outcomes)
        return outcomes

    async def _release(self, conn: Conn, outcomes: list[Outcome | None]) -> None:
        """Release the workflow steps whose last parents these are (in their transaction),
        each told on the outcome of a parent of its."""
        done = {o.job.id: o for o in outcomes if o is not None and o.job.workflow_id is not None}
        if not done:
            return
        for step in await self._workflows.release_in(conn, [o.job for o in done.values()]):
            parent = next(p for p in step.parent_ids or () if p in done)
            done[parent].released.append(step)

    async def fail(
        self, lease: Lease, error: str, retry_at: datetime | None, traceback: str | None = None
    ) -> Outcome | None:
        """Record a failed attempt: pending again at `retry_at`, or dead-lettered (with
        `on_failure` enqueued) in one transaction. None if the lease is stale."""
        error = pg_rows.text(error) or ""
        traceback = pg_rows.text(traceback)
        params: dict[str, Any] = {"id": lease.job.id, "token": lease.token, "error": error}
        params["traceback"] = traceback
        if retry_at is not None:
            failed = (EventKind.ATTEMPT_FAILED, error)
            scheduled = (EventKind.RETRY_SCHEDULED, _utc_iso(retry_at))
            params["retry_at"] = retry_at
            params |= _trail([failed, scheduled], traceback)
            async with self._db.connection() as conn:
                outcome = await self._requeue(conn, params)
            if outcome is None:
                outcome = await self.salvage(lease, lambda conn: self._requeue(conn, params))
            if outcome is not None:
                self._wakeups.pending([outcome.job])
            return outcome
        async with self._db.connection() as conn, conn.pipeline(), conn.transaction():
            outcome = await self._bury(conn, params)
        if outcome is None:
            outcome = await self.salvage(lease, lambda conn: self._bury(conn, params))
        if outcome is not None:
            self._wakeups.pending(outcome.followups)
            self._wakeups.freed(outcome.job)
        return outcome

    async def salvage(
        self, lease: Lease, write: Callable[[Conn], Awaitable[Outcome | None]]
    ) -> Outcome | None:
        """Write a fenced outcome that arrived late, in one transaction, if the lease's
        attempt is the job's last one started and that attempt's lease was reaped: the
        reaping's retry (pending, or claimed by a node that has not started it) or its
        dead letter gives way, the reaping's error is dropped, a `late_outcome` event is
        written, then `write` records the outcome as if it had come in time. Refused
        (None) otherwise, and when the reaping dead-lettered a job with an `on_failure`
        (that follow-up is already enqueued), its letter is gone (replayed, purged) or
        its unique key is held again (see `store/base.py`)."""
        try:
            return await self._salvage(lease, write)
        except psycopg.errors.UniqueViolation:  # its unique key was taken meanwhile
            return None

    async def _salvage(
        self, lease: Lease, write: Callable[[Conn], Awaitable[Outcome | None]]
    ) -> Outcome | None:
        key = {"id": lease.job.id}
        async with self._db.connection() as conn, conn.transaction():
            params = {**key, "attempt": lease.job.attempts}
            found = await self._db.fetchone(conn, self._sql[Sql.SALVAGE_LOCK], params)
            if found is None:
                return None
            status, no_follow_up = found
            if status == Status.FAILED:
                if not no_follow_up:
                    return None
                if await self._db.fetchone(conn, self._sql[Sql.SALVAGE_DEAD], key) is None:
                    return None
            reopen = {**key, "token": lease.token, "node": self.node_id, **_trail([LATE])}
            await conn.execute(self._sql[Sql.REOPEN], reopen)
            if status == Status.FAILED:  # the steps its dead letter cancelled wait again
                await self._workflows.resume_below_in(conn, lease.job)
            outcome = await write(conn)
        assert outcome is not None  # reopened under the lease's token, and locked
        return outcome

    async def _requeue(self, conn: Conn, params: Mapping[str, Any]) -> Outcome | None:
        """Make the job pending again at `retry_at` (now if None), recording the attempt's
        error and the events in `params`."""
        row = await self._db.fetchone(conn, self._sql[Sql.RETRY], {**params, "node": self.node_id})
        return None if row is None else Outcome(pg_rows.job(row), [])

    async def _bury(
        self, conn: Conn, params: Mapping[str, Any], *first: tuple[EventKind, str]
    ) -> Outcome | None:
        """Mark the job failed, archive it as a dead letter, chain `on_failure`. The events
        written are `first` (a reaped job's lease_expired), attempt_failed, dead_lettered."""
        dead_id = new_id()
        failed = (EventKind.ATTEMPT_FAILED, params["error"])
        trail = _trail([*first, failed, (EventKind.DEAD_LETTERED, dead_id)], params["traceback"])
        params = {**params, **trail, "node": self.node_id}
        row = await self._db.fetchone(conn, self._sql[Sql.BURY], params)
        if row is None:
            return None
        job = pg_rows.job(row)
        assert job.finished_at is not None
        dead = DeadLetter(
            id=dead_id, job_id=job.id, job=job, errors=job.errors, created_at=job.finished_at
        )
        letter = {
            "id": dead.id,
            "job_id": job.id,
            "job": pg_rows.raw(job),
            "errors": pg_rows.raw(dead.errors),
            "created_at": dead.created_at,
        }
        await conn.execute(self._sql[Sql.INSERT_DEAD], letter)
        await self._workflows.cancel_below_in(conn, job)
        followups = await self._enqueuer.follow_up(conn, job.on_failure, job)
        return Outcome(job, followups, dead)

    async def release(self, lease: Lease) -> bool:
        """Hand the job back to pending without counting the attempt."""
        params = {"id": lease.job.id, "token": lease.token, "node": self.node_id}
        rows = await self._db.execute(self._sql[Sql.RELEASE], params)
        if not rows:
            return False
        self._wakeups.pending([pg_rows.job(rows[0])])
        return True


def _exhausted(
    types: Sequence[str],
    slots: Mapping[str, int],
    limit: int,
    limited: Collection[str] | None,
    leases: Sequence[Lease],
    short: bool,
) -> list[str]:
    """The types of which a claim took everything due: it came back short, and each took
    fewer than it could (no global limit stopped it)."""
    if not short:
        return []
    taken = Counter(lease.job.type for lease in leases)
    held = set(limited or ())
    return [t for t in types if t not in held and taken[t] < min(slots[t], limit)]
