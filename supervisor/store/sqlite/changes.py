"""What changed in the store's memory since the last commit, and its rows for the file.

The store marks what each call touched (`Changes`); a commit encodes the marked items as
they are at that moment (`Changes.rows`, on the loop, so the thread never reads objects
the loop is changing) and writes the rows in one transaction (`Rows.write`, on the
thread). A job touched five times between two commits is written once. A commit that
fails gives its marks back (`Changes.give_back`) so the next one writes them.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from datetime import UTC, datetime

import msgspec
from goqueue.supervisor.jobs import DeadLetter, Event, Job
from goqueue.supervisor.schedules.schedule import ScheduleState
from goqueue.supervisor.store.memory.flows import FlowRecord
from msgspec.structs import replace

JOB = msgspec.json.Decoder(Job)
EVENTS = msgspec.json.Decoder(list[Event])
LETTER = msgspec.json.Decoder(DeadLetter)
SCHEDULE = msgspec.json.Decoder(ScheduleState)
FLOW = msgspec.json.Decoder(FlowRecord)
encode = msgspec.json.Encoder().encode


class Key(msgspec.Struct, frozen=True, gc=False):
    """A dedupe or idempotency key: the job holding it until `expires` (unix seconds)."""

    job_id: str
    request_hash: str
    expires: float


class NewDelivery(msgspec.Struct, frozen=True, gc=False):
    """A webhook owed for a terminal status, written with that status."""

    id: str
    job_id: str
    event: str
    url: str
    body: bytes
    created_at: float


@dataclass
class Changes:
    """Marks of what changed, by kind; the latest value wins."""

    jobs: dict[str, Job] = field(default_factory=dict)
    gone: set[str] = field(default_factory=set)  # jobs forgotten (pruned, retired)
    letters: dict[str, DeadLetter | None] = field(default_factory=dict)  # None: removed
    keys: dict[tuple[str, str], Key] = field(default_factory=dict)
    paused: dict[str, bool] = field(default_factory=dict)
    schedules: dict[str, ScheduleState] = field(default_factory=dict)
    flows: dict[str, FlowRecord | None] = field(default_factory=dict)  # None: removed
    deliveries: list[NewDelivery] = field(default_factory=list)
    keys_expired_before: float | None = None
    durable: bool = False  # something in here was answered to a client as stored

    def touch(self, job: Job) -> None:
        """`job` changed."""
        self.jobs[job.id] = job
        self.gone.discard(job.id)

    def forget(self, job_id: str) -> None:
        """`job_id` is no longer kept."""
        self.jobs.pop(job_id, None)
        self.gone.add(job_id)

    def rows(self, events: dict[str, list[Event]]) -> Rows:
        """The rows of everything marked, jobs with their trails from `events`."""
        taken = self
        return Rows(
            jobs=[
                (
                    job.id,
                    job.seq,
                    job.status,
                    job.finished_at.isoformat() if job.finished_at else None,
                    *_split(job),
                    encode(events.get(job.id, [])),
                )
                for job in taken.jobs.values()
            ],
            gone=[(job_id,) for job_id in taken.gone],
            letters=[_letter(d) for d in taken.letters.values() if d is not None],
            unlettered=[(i,) for i, d in taken.letters.items() if d is None],
            keys=[
                (kind, key, k.job_id, k.request_hash, k.expires)
                for (kind, key), k in taken.keys.items()
            ],
            paused=[(q,) for q, p in taken.paused.items() if p],
            resumed=[(q,) for q, p in taken.paused.items() if not p],
            schedules=[(name, encode(s)) for name, s in taken.schedules.items()],
            flows=[(f.id, f.seq, encode(f)) for f in taken.flows.values() if f is not None],
            unflowed=[(i,) for i, f in taken.flows.items() if f is None],
            deliveries=[
                (d.id, d.job_id, d.event, d.url, d.body, d.created_at, d.created_at)
                for d in taken.deliveries
            ],
            keys_expired_before=taken.keys_expired_before,
        )

    def give_back(self, taken: Changes, current: dict[str, Job]) -> None:
        """Mark again what a failed commit held, under anything marked since (newer)."""
        for job_id in taken.jobs:
            job = current.get(job_id)
            if job is not None and job_id not in self.gone:
                self.jobs.setdefault(job_id, job)
        self.gone |= taken.gone - set(self.jobs)
        for name in ("letters", "keys", "paused", "schedules", "flows"):
            mine, theirs = getattr(self, name), getattr(taken, name)
            setattr(self, name, theirs | mine)
        self.deliveries[:0] = taken.deliveries
        self.durable = self.durable or taken.durable

    @property
    def empty(self) -> bool:
        """Nothing to write."""
        return not (
            self.jobs
            or self.gone
            or self.letters
            or self.keys
            or self.paused
            or self.schedules
            or self.flows
            or self.deliveries
            or self.keys_expired_before is not None
        )


@dataclass(frozen=True)
class Rows:
    """One commit's rows, encoded: written by the thread, in one transaction."""

    jobs: list[tuple[str, int, str, str | None, bytes, bytes | None, bytes | None, bytes]]
    gone: list[tuple[str]]
    letters: list[tuple[str, bytes, bytes | None]]
    unlettered: list[tuple[str]]
    keys: list[tuple[str, str, str, str, float]]
    paused: list[tuple[str]]
    resumed: list[tuple[str]]
    schedules: list[tuple[str, bytes]]
    flows: list[tuple[str, int, bytes]]
    unflowed: list[tuple[str]]
    deliveries: list[tuple[str, str, str, str, bytes, float, float]]
    keys_expired_before: float | None

    def write(self, conn: sqlite3.Connection) -> None:
        """Write every row (inside the caller's transaction); a statement with no rows
        is not even prepared (most commits hold only jobs)."""
        for statement, rows in (
            (UPSERT_JOB, self.jobs),
            ("DELETE FROM jobs WHERE id = ?", self.gone),
            (
                "INSERT OR REPLACE INTO dead_letters (id, letter, parents) VALUES (?, ?, ?)",
                self.letters,
            ),
            ("DELETE FROM dead_letters WHERE id = ?", self.unlettered),
            ("INSERT OR REPLACE INTO job_keys VALUES (?, ?, ?, ?, ?)", self.keys),
            ("INSERT OR IGNORE INTO paused_queues (queue) VALUES (?)", self.paused),
            ("DELETE FROM paused_queues WHERE queue = ?", self.resumed),
            ("INSERT OR REPLACE INTO schedules (name, state) VALUES (?, ?)", self.schedules),
            ("INSERT OR REPLACE INTO workflows (id, seq, record) VALUES (?, ?, ?)", self.flows),
            ("DELETE FROM workflows WHERE id = ?", self.unflowed),
            (INSERT_DELIVERY, self.deliveries),
        ):
            if rows:
                conn.executemany(statement, rows)
        if self.keys_expired_before is not None:
            conn.execute("DELETE FROM job_keys WHERE expires < ?", (self.keys_expired_before,))


def _split(job: Job) -> tuple[bytes, bytes | None, bytes | None]:
    """A job's JSON, its result and its parents' results: msgspec reads no `Raw | None`
    inside a struct, so the two raw fields go in columns of their own."""
    result, parents = job.result, job.parents
    if result is None and parents is None:
        return encode(job), None, None
    bare = encode(replace(job, result=None, parents=None))
    return (
        bare,
        None if result is None else bytes(result),
        None if parents is None else bytes(parents),
    )


def _letter(dead: DeadLetter) -> tuple[str, bytes, bytes | None]:
    """A dead letter's row: its job's parents' results in a column of their own."""
    parents = dead.job.parents
    if parents is None:
        return dead.id, encode(dead), None
    bare = replace(dead, job=replace(dead.job, result=None, parents=None))
    return dead.id, encode(bare), bytes(parents)


def joined(job: Job, result: bytes | None, parents: bytes | None) -> Job:
    """A job read back from its row, its raw fields put back."""
    if result is not None:
        job.result = msgspec.Raw(result)
    if parents is not None:
        job.parents = msgspec.Raw(parents)
    return job


UPSERT_JOB = (
    "INSERT INTO jobs (id, seq, status, finished_at, job, result, parents, events)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET"
    " status = excluded.status, finished_at = excluded.finished_at, job = excluded.job,"
    " result = excluded.result, parents = excluded.parents, events = excluded.events"
)
INSERT_DELIVERY = (
    "INSERT OR IGNORE INTO webhook_deliveries"
    " (id, job_id, event, url, body, created_at, next_attempt_at) VALUES (?, ?, ?, ?, ?, ?, ?)"
)


def from_ts(ts: float | None) -> datetime | None:
    """A unix time as an aware UTC datetime."""
    return None if ts is None else datetime.fromtimestamp(ts, UTC)
