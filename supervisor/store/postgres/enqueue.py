"""How the PostgreSQL store enqueues: plain jobs, keyed jobs, follow-ups and replays.

Enqueues are group-committed: those arriving while one commit is in flight share the
next transaction, each answered on its own once committed. The plain jobs of a group go
in one statement; a job with a dedupe or idempotency key gets a savepoint, so that its
refusal undoes only itself. Every statement inserting a job writes its `enqueued` event
too, so the audit trail commits with the job.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import suppress
from typing import Any

import psycopg
from goqueue.supervisor.common.bulk import Replayed
from goqueue.supervisor.common.enums import EventKind, Status
from goqueue.supervisor.common.errors import (
    DuplicateJob,
    IdempotencyMismatch,
    NotFound,
    StoreUnavailable,
)
from goqueue.supervisor.common.jobs import Enqueued, Job, JobSpec, Lease, new_id
from goqueue.supervisor.common.summaries import DeadFilter
from goqueue.supervisor.store.base import NewJob, StartNow
from goqueue.supervisor.store.postgres import enqueue_steps as pg_steps
from goqueue.supervisor.store.postgres import rows as pg_rows
from goqueue.supervisor.store.postgres.connection import (
    Batcher,
    Conn,
    Connections,
    WriteAgain,
    group_or_each,
)
from goqueue.supervisor.store.postgres.floors import ClaimFloors
from goqueue.supervisor.store.postgres.notify import Wakeups
from goqueue.supervisor.store.postgres.sql.statements import LIVE_LEASES, Sql, Statements
from goqueue.supervisor.store.postgres.workflows import PgWorkflows

Answer = Enqueued | Exception


def _other_keys(spec: JobSpec) -> bool:
    """True when storing a job of `spec` checks a key other than an idempotency key
    (dedupe, unique, debounce): it then needs a savepoint of its own, so that a refusal
    undoes only itself. A job whose only key is an idempotency key has it claimed by the
    statement that stores it (`Sql.ADD_JOB_KEYED`, `Sql.ADD_JOBS_KEYED`)."""
    return (
        spec.unique_key is not None
        or spec.debounce_key is not None
        or (spec.dedupe_key is not None and pg_steps.dedupes(spec))
    )


def _key_sorted(news: Sequence[NewJob], indexes: list[int]) -> list[int]:
    """`indexes` in the order of their jobs' keys."""

    def order(i: int) -> tuple[str, str, str, str]:
        spec = news[i].spec
        keys = (spec.dedupe_key or "", spec.unique_key or "", spec.debounce_key or "")
        return (news[i].idempotency_key or "", *keys)

    return sorted(indexes, key=order)


class Enqueuer:
    """Stores new jobs: enqueues (group-committed), batches, follow-ups, replays."""

    def __init__(
        self,
        db: Connections,
        sql: Statements,
        node_id: str,
        wakeups: Wakeups,
        workflows: PgWorkflows,
        floors: ClaimFloors,
        *,
        idempotency_ttl: float,
        lease_seconds: float,
    ) -> None:
        self._db = db
        self._floors = floors  # a start at enqueue looks for jobs ahead as a claim does
        self._sql = sql
        self.node_id = node_id
        self._wakeups = wakeups
        self._workflows = workflows  # a replayed step takes its dead job's place
        self.idempotency_ttl = idempotency_ttl
        self.lease_seconds = lease_seconds
        self._live = LIVE_LEASES * lease_seconds  # a node's limits count meanwhile
        self._group = Batcher(self._write_group, limit=1000)

    async def enqueue(self, new: NewJob) -> Enqueued:
        """Store one job. Enqueues arriving while another's commit is in flight share the
        next transaction (group commit); each returns once its job is committed. Dedupe
        and idempotency are checked in that transaction, each call answered on its own."""
        for _ in range(3):
            with suppress(WriteAgain):
                return await self._group.submit(new)
        raise StoreUnavailable("the enqueue kept losing deadlocks on its keys; retry")

    async def enqueue_many(self, news: Sequence[NewJob]) -> list[Answer]:
        """Store several jobs in one transaction, each answered on its own (a job whose
        keys lost a deadlock is written again, in a transaction of its own)."""
        answers = await self._store_jobs(news, sort_keys=False) if news else []
        for i, answer in enumerate(answers):
            if isinstance(answer, WriteAgain):
                try:
                    answers[i] = await self.enqueue(news[i])
                except Exception as exc:  # this job's answer, like any refusal
                    answers[i] = exc
        return answers

    async def idle(self, timeout: float) -> None:
        """Wait (up to `timeout`) for the groups under way to be written."""
        await self._group.idle(timeout)

    def cancel(self) -> None:
        """Stop writing groups (the store is closing)."""
        self._group.cancel()

    async def _write_group(self, news: list[NewJob]) -> list[Answer]:
        """Write one group of enqueues (see `group_or_each`)."""
        return await group_or_each(self._store_group, news)

    async def _store_group(self, news: list[NewJob]) -> list[Answer]:
        """Store a group of enqueues in one transaction on the enqueue lane."""
        return await self._store_jobs(news, sort_keys=True, lane="enqueue")

    async def _store_jobs(
        self,
        news: Sequence[NewJob],
        *,
        sort_keys: bool,
        lane: str | None = None,
        claim_keys: bool = True,
    ) -> list[Answer]:
        """Store jobs in one transaction, each answered on its own.

        The plain jobs, and (with `claim_keys`) those whose only key is an idempotency
        key, go in one statement that claims those keys: without other keyed jobs that is
        the whole transaction, one round trip. The others get a savepoint each after it,
        so that a refusal undoes only itself: a job with a dedupe, unique or debounce key,
        one whose idempotency key a job before it in the group has, and one whose key the
        statement found held (a repeat or a mismatch, told apart there). With
        `sort_keys` (a group's order is arbitrary anyway) they go in key order, so two
        nodes rarely wait on each other.
        """
        answers: list[Answer | None] = [None] * len(news)
        keyed: list[int] = []
        plain: list[int] = []
        claimed: set[str] = set()  # the idempotency keys the statement claims
        for i, new in enumerate(news):  # each job asked once
            key = new.idempotency_key
            if _other_keys(new.spec) or (key is not None and (not claim_keys or key in claimed)):
                keyed.append(i)
            else:
                plain.append(i)
                if key is not None:
                    claimed.add(key)
        if sort_keys and claimed:
            plain.sort(key=lambda i: news[i].idempotency_key or "")
        held: list[int] = []
        async with self._db.connection(lane) as conn:
            if keyed:
                async with conn.pipeline(), self._db.transaction(conn):
                    held = await self._add_plain(conn, news, plain, answers)
                    await self._add_keyed(conn, news, keyed + held, answers, sort_keys)
                held = []
            else:
                self._db.committing(conn)  # autocommit: the insert is its own commit
                held = await self._add_plain(conn, news, plain, answers)
        if held:  # the others are committed: a failure of these is theirs alone
            try:
                later = await group_or_each(self._store_keyed, [news[i] for i in held])
            except Exception as exc:  # (StoreUnavailable, OutcomeUnknown)
                later = [exc] * len(held)
            for i, answer in zip(held, later, strict=True):
                answers[i] = answer
        done = [a for a in answers if a is not None]
        assert len(done) == len(news)
        woken = set(held)  # (the call storing those woke for them)
        fresh = [
            a.job
            for i, a in enumerate(done)
            if isinstance(a, Enqueued) and a.created and a.lease is None and i not in woken
        ]
        if fresh:  # (a job started at its enqueue wakes nobody)
            self._wakeups.pending(fresh)
        return done

    async def _store_keyed(self, news: list[NewJob]) -> list[Answer]:
        """Store jobs whose idempotency keys were held, each in a savepoint."""
        return await self._store_jobs(news, sort_keys=True, claim_keys=False)

    async def _add_keyed(
        self,
        conn: Conn,
        news: Sequence[NewJob],
        indexes: list[int],
        answers: list[Answer | None],
        sort_keys: bool,
    ) -> None:
        """Enqueue `news[i]` for i in `indexes`, each in a savepoint of its own."""
        order = _key_sorted(news, indexes) if sort_keys else sorted(indexes)
        for i in order:
            answers[i] = await self._enqueue_keyed(conn, news[i])

    async def _enqueue_keyed(self, conn: Conn, new: NewJob) -> Answer:
        """Enqueue a job with keys in a savepoint; a refusal is its answer."""
        try:
            async with conn.transaction():
                return await self._enqueue_in(conn, new)
        except (DuplicateJob, IdempotencyMismatch, StoreUnavailable) as exc:
            return exc
        except psycopg.errors.DeadlockDetected:
            return WriteAgain()

    async def _add_plain(
        self,
        conn: Conn,
        news: Sequence[NewJob],
        indexes: list[int],
        answers: list[Answer | None],
    ) -> list[int]:
        """Insert the jobs without keys but an idempotency one (`news[i]` for i in
        `indexes`) in one statement, claiming those keys; those whose key was held
        already are not stored, and returned."""
        if not indexes:
            return []
        todo = [(i, _params(news[i])) for i in indexes]
        keys = [news[i].idempotency_key for i in indexes]
        keyed = any(key is not None for key in keys)
        if len(todo) == 1:
            (i, params), new = todo[0], news[indexes[0]]
            if new.start is not None or keyed:
                stored = await self._add_started(conn, new, new.start, params, keyed=keyed)
                if stored is None:
                    return [i]
                answers[i] = stored
                return []
            params = params | {"node": self.node_id}
            row = await self._db.fetchone(conn, self._sql[Sql.ADD_JOB], params)
            assert row is not None
            decided = {params["id"]: row}
        else:
            columns: dict[str, Any] = pg_rows.columns([p for _, p in todo])
            columns["node"] = self.node_id
            statement = Sql.ADD_JOBS
            if keyed:
                statement = Sql.ADD_JOBS_KEYED
                columns |= {
                    "key": [pg_rows.text(key) for key in keys],
                    "hash": [
                        None if key is None else pg_rows.text(news[i].request_hash) or ""
                        for i, key in zip(indexes, keys, strict=True)
                    ],
                    "ttl": self.idempotency_ttl,
                }
            cur = await conn.execute(self._sql[statement], columns)
            decided = {r[0]: r[1:] for r in await cur.fetchall()}
        held = []
        for i, params in todo:
            row = decided.get(params["id"])
            if row is None:  # its idempotency key was held
                held.append(i)
                continue
            job = pg_rows.pending(params, news[i].spec, row)
            answers[i] = Enqueued(job, created=True)
        return held

    async def _add_started(
        self,
        conn: Conn,
        new: NewJob,
        start: StartNow | None,
        params: dict[str, Any],
        *,
        keyed: bool = False,
    ) -> Enqueued | None:
        """Insert one job started for this node, or pending when it may not run now
        (`Sql.ADD_JOB_STARTED`); with `keyed`, claiming its idempotency key in the same
        statement (`Sql.ADD_JOB_KEYED`: pending when `start` is None), and None when the
        key was held already."""
        token = new_id()
        queues = None if start is None else start.queues
        types = [] if start is None else sorted(start.types)
        floor_at, floor_seq = self._floors.at(queues, types, new.spec.priority_value)
        params = params | {
            "node": self.node_id,
            "token": token,
            "lease": self.lease_seconds,
            "live": self._live,
            "types": pg_rows.array_literal(types),
            "queues": None if queues is None else pg_rows.array_literal(sorted(queues)),
            "floor_at": pg_rows.array_literal(floor_at),
            "floor_seq": pg_rows.array_literal(floor_seq),
        }
        statement = Sql.ADD_JOB_STARTED
        if keyed:
            statement = Sql.ADD_JOB_KEYED
            params |= {
                "key": pg_rows.text(new.idempotency_key),
                "hash": pg_rows.text(new.request_hash) or "",
                "ttl": self.idempotency_ttl,
                "start": start is not None,
            }
        row = await self._db.fetchone(conn, self._sql[statement], params)
        if row is None:
            return None
        run_at, created_at, seq, started_at, expires_at = row
        job = pg_rows.pending(params, new.spec, (run_at, created_at, seq))
        if started_at is None:
            return Enqueued(job, created=True)
        job.status, job.attempts, job.started_at = Status.RUNNING, 1, started_at
        lease = Lease(job=job, token=token, owner=self.node_id, expires_at=expires_at)
        return Enqueued(job, created=True, lease=lease)

    async def _enqueue_in(self, conn: Conn, new: NewJob) -> Enqueued:
        """The enqueue steps (`pg_steps.keyed_enqueue`), inside the caller's transaction."""
        steps = pg_steps.keyed_enqueue(
            self._sql, new, node=self.node_id, idempotency_ttl=self.idempotency_ttl
        )
        return await pg_steps.run_async(conn, steps)

    async def insert(
        self,
        conn: Conn,
        spec: JobSpec,
        max_retries: int,
        *,
        parent_id: str | None = None,
        job_id: str | None = None,
        events: Sequence[tuple[EventKind, str | None]] = pg_steps.ENQUEUED,
        trace_context: dict[str, str] | None = None,
    ) -> Job:
        """Insert a pending job with its `events` (kind, detail), in one statement."""
        query = pg_steps.insert(
            self._sql,
            spec,
            max_retries,
            node=self.node_id,
            parent_id=parent_id,
            job_id=job_id,
            events=events,
            trace_context=trace_context,
        )
        row = await self._db.fetchone(conn, *query)
        assert row is not None
        return pg_rows.job(row)

    async def follow_up(self, conn: Conn, spec: JobSpec | None, parent: Job) -> list[Job]:
        """Chain a template after `parent` (in the caller's transaction)."""
        if spec is None:
            return []
        events = [(EventKind.ENQUEUED, f"after {parent.id}")]
        context = parent.trace_context  # a chained job stays in its parent's trace
        job = await self.insert(
            conn,
            spec,
            spec.max_retries_value,
            parent_id=parent.id,
            events=events,
            trace_context=context,
        )
        return [job]

    async def replay_dead(self, dead_id: str, max_retries: int) -> Job:
        """Insert a fresh job from the letter and delete the letter, in one transaction."""
        if not pg_rows.is_uuid(dead_id):
            raise NotFound(f"dead letter {dead_id} not found")
        async with self._db.connection() as conn, self._db.transaction(conn):
            row = await self._db.fetchone(conn, self._sql[Sql.TAKE_DEAD], {"id": dead_id})
            if row is None:
                raise NotFound(f"dead letter {dead_id} not found")
            dead = pg_rows.dead(row)
            events = [(EventKind.ENQUEUED, None), (EventKind.REPLAYED, dead.job_id)]
            job = await self.insert(conn, dead.job.replay_spec(), max_retries, events=events)
            job = await self._workflows.resume_in(conn, dead.job, job)
        self._wakeups.pending([job])
        return job

    async def replay_dead_many(self, filters: DeadFilter, limit: int) -> Replayed:
        """Replay up to `limit` matching letters, oldest first, in one transaction: each
        letter is deleted and its fresh job inserted together, or none of them is."""
        params = pg_rows.dead_filter(filters) | {"limit": limit}
        if filters.job_id is not None and not pg_rows.is_uuid(filters.job_id):
            return Replayed([], 0)
        async with self._db.connection() as conn, self._db.transaction(conn):
            take, prepare = self._sql[Sql.TAKE_DEAD_MANY], pg_rows.dead_prepare(filters)
            cur = await conn.execute(take, params, prepare=prepare)
            rows = sorted(await cur.fetchall(), key=lambda r: (r[4], r[5]))
            jobs = []
            for row in rows:
                dead = pg_rows.dead(row)
                events = [(EventKind.ENQUEUED, None), (EventKind.REPLAYED, dead.job_id)]
                spec, retries = dead.job.replay_spec(), dead.job.max_retries
                job = await self.insert(conn, spec, retries, events=events)
                jobs.append(await self._workflows.resume_in(conn, dead.job, job))
            # the letters left, as this transaction sees them (its deletes counted)
            count, counted = pg_rows.dead_count(filters, params, Sql.COUNT_DEAD_MATCHING)
            left = await self._db.fetchone(conn, self._sql[count], counted)
        self._wakeups.pending(jobs)
        return Replayed(jobs, int(left[0]) if left else 0)


def _params(new: NewJob) -> dict[str, Any]:
    """The insert parameters of one plain job."""
    context = new.trace_context
    return pg_rows.insert_params(new.spec, new.max_retries, new.parent_id, trace_context=context)
