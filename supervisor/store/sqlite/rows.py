"""A job's row in the SQLite file, both ways: what `Row` holds beside the job (its lease,
the attempt last reaped, a waiting step's count of parents not done), how a row is read
back (`SELECT_ROW`, `Row.read`) and written (`Row.update`, `Row.insert`).

The row's `job` column is the whole `Job` as JSON; its other columns are copies of the
fields the store selects on, written in the same statement, so they cannot disagree."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import msgspec
from goqueue.supervisor.common.enums import EventKind, Status
from goqueue.supervisor.common.jobs import DeadLetter, Event, Job, Lease
from goqueue.supervisor.store.base import EVENTS_KEPT

encode = msgspec.json.Encoder().encode
JOB = msgspec.json.Decoder(Job)
LETTER = msgspec.json.Decoder(DeadLetter)


class TrailEvent(msgspec.Struct, kw_only=True, gc=False, omit_defaults=True):
    """An event as a row's trail holds it: its job is the row's, and fields left empty are
    not written (trails written before this carry `job_id` and every field)."""

    event: str
    at: datetime
    node: str
    attempt: int
    detail: str | None = None
    traceback: str | None = None
    job_id: str | None = None


TRAIL = msgspec.json.Decoder(list[TrailEvent])

COLUMNS = (
    "seq, job, result, parents, lease_token, lease_owner, lease_expires, reaped_token,"
    " waiting_on, n_events"
)
SELECT_ROW = f"SELECT {COLUMNS} FROM jobs"

# the columns that mirror a job's fields, as `Row._columns` gives them
MIRRORED = (
    "status",
    "run_at",
    "started_at",
    "finished_at",
    "unique_key",
    "workflow_id",
    "waiting_on",
    "lease_token",
    "lease_owner",
    "lease_expires",
    "reaped_token",
    "result",
    "parents",
)
_updates: dict[tuple[str, ...], str] = {}


def _update(changed: tuple[str, ...]) -> str:
    """The UPDATE of the `changed` mirrored columns, the job and its trail: the columns
    left alone keep their index entries untouched (an UPDATE rewrites the entries of
    every index on a column it sets)."""
    sql = _updates.get(changed)
    if sql is None:
        sets = "".join(f"{column} = ?, " for column in changed)
        sql = _updates[changed] = (
            f"UPDATE jobs SET {sets}job = ?, events = events || ?, n_events = ? WHERE seq = ?"
        )
    return sql


_INSERTED = (
    *MIRRORED,
    *("job", "events", "n_events", "seq", "id", "type", "queue", "priority", "created_at"),
    "parent_id",
    "concurrency_key",
    "debounce_key",
)
INSERT = f"INSERT INTO jobs ({', '.join(_INSERTED)}) VALUES ({', '.join('?' * len(_INSERTED))})"


def without_raw(job: Job) -> Job:
    """`job` without the raw fields that have columns of their own (its result, its
    parents' results): msgspec reads no `Raw | None` inside a struct."""
    if job.result is None and job.parents is None:
        return job
    return msgspec.structs.replace(job, result=None, parents=None)


def ts(moment: datetime | None) -> float | None:
    """A time as unix seconds, as the columns hold it."""
    return None if moment is None else moment.timestamp()


def from_ts(value: float | None) -> datetime | None:
    """A unix time as an aware UTC datetime."""
    return None if value is None else datetime.fromtimestamp(value, UTC)


@dataclass(slots=True)
class Row:
    """A job as its row holds it, with the events written since it was read."""

    job: Job
    lease_token: str | None = None
    lease_owner: str | None = None
    lease_expires: float | None = None
    reaped_token: str | None = None  # the token of its attempt last reaped (late outcomes)
    waiting_on: int | None = None  # a waiting step: its parents not done yet
    n_events: int = 0
    new_events: list[bytes] = field(default_factory=list)
    _saved: tuple[Any, ...] = ()  # the mirrored columns as the file holds them

    def __post_init__(self) -> None:
        if not self._saved:
            self._saved = (None,) * len(MIRRORED)

    @classmethod
    def read(cls, found: tuple[Any, ...]) -> Row:
        """A `Row` from the columns `SELECT_ROW` names."""
        seq, job_json, result, parents, token, owner, expires, reaped, waiting, n = found
        job = JOB.decode(job_json)
        job.seq = seq
        if result is not None:
            job.result = msgspec.Raw(result)
        if parents is not None:
            job.parents = msgspec.Raw(parents)
        row = cls(job, token, owner, expires, reaped, waiting, n)
        row._saved = row._columns()
        return row

    def copy(self) -> Row:
        """This row with a job of its own: changes to it leave this one as it was."""
        return Row(
            msgspec.structs.replace(self.job),
            self.lease_token,
            self.lease_owner,
            self.lease_expires,
            self.reaped_token,
            self.waiting_on,
            self.n_events,
            [*self.new_events],
            self._saved,
        )

    def lease(self) -> Lease | None:
        """The lease the row holds, if any."""
        if self.lease_token is None or self.lease_expires is None:
            return None
        expires = datetime.fromtimestamp(self.lease_expires, UTC)
        owner = self.lease_owner or ""
        return Lease(job=self.job, token=self.lease_token, owner=owner, expires_at=expires)

    def extend(self, expires: float) -> None:
        """The lease was extended in the file to `expires`."""
        self.lease_expires = expires
        at = MIRRORED.index("lease_expires")
        self._saved = (*self._saved[:at], expires, *self._saved[at + 1 :])

    def drop_lease(self) -> None:
        """The row holds no lease any more."""
        self.lease_token = self.lease_owner = self.lease_expires = None

    def event(
        self,
        kind: EventKind,
        now: datetime,
        node: str,
        detail: str | None = None,
        traceback: str | None = None,
        cap: int = EVENTS_KEPT,
    ) -> None:
        """Add an event to the job's trail (at most `cap` are kept)."""
        if self.n_events + len(self.new_events) >= cap:
            return
        event = TrailEvent(
            event=kind,
            at=now,
            node=node,
            attempt=self.job.attempts,
            detail=detail,
            traceback=traceback,
        )
        self.new_events.append(encode(event))

    def _trail(self) -> bytes:
        """The new events as the text appended to the row's trail."""
        text = b",".join(self.new_events)
        return b"," + text if self.n_events and text else text

    def _columns(self) -> tuple[Any, ...]:
        """The mirrored columns' values now (`MIRRORED`'s order)."""
        job = self.job
        result, parents = job.result, job.parents
        return (
            job.status,
            job.run_at.timestamp(),
            ts(job.started_at),
            ts(job.finished_at),
            job.unique_key,
            job.workflow_id,
            self.waiting_on,
            self.lease_token,
            self.lease_owner,
            self.lease_expires,
            self.reaped_token,
            None if result is None else bytes(result),
            None if parents is None else bytes(parents),
        )

    def _bare(self) -> bytes:
        """The job's JSON without the fields that have columns of their own."""
        return encode(without_raw(self.job))

    def _written(self, columns: tuple[Any, ...]) -> tuple[bytes, int]:
        """The trail to append and the new count of events, now they are written."""
        trail, count = self._trail(), self.n_events + len(self.new_events)
        self.n_events = count
        self.new_events.clear()
        self._saved = columns
        return trail, count

    def moved(self, counts: dict[Group, int]) -> Status | None:
        """Count the job's move from the status the file holds to its status now; the
        status the file holds (None for a new row)."""
        was: Status | None = self._saved[0]
        now = self.job.status
        if was != now:
            job = self.job
            if was is not None:
                add_count(counts, (job.queue, job.type, job.priority, was), -1)
            add_count(counts, (job.queue, job.type, job.priority, now), 1)
        return was

    def update(self) -> tuple[str, tuple[Any, ...]]:
        """The UPDATE that writes what changed since the row was read or last written."""
        columns = self._columns()
        names = []
        values = []
        for name, now, was in zip(MIRRORED, columns, self._saved, strict=True):
            if now != was:
                names.append(name)
                values.append(now)
        trail, count = self._written(columns)
        values += (self._bare(), trail, count, self.job.seq)
        return _update(tuple(names)), tuple(values)

    def insert(self) -> tuple[Any, ...]:
        """The parameters of `INSERT` for this new row."""
        job = self.job
        columns = self._columns()
        trail, count = self._written(columns)
        return (
            *columns,
            self._bare(),
            trail,
            count,
            job.seq,
            job.id,
            job.type,
            job.queue,
            job.priority,
            job.created_at.timestamp(),
            job.parent_id,
            job.concurrency_key,
            job.debounce_key,
        )


def events_of(job_id: str, trail: bytes | str) -> list[Event]:
    """A row's trail as events, oldest first (SQLite's `||` makes the column text)."""
    if not trail:
        return []
    text = trail.encode() if isinstance(trail, str) else trail
    return [
        Event(
            job_id=job_id,
            event=e.event,
            at=e.at,
            node=e.node,
            attempt=e.attempt,
            detail=e.detail,
            traceback=e.traceback,
        )
        for e in TRAIL.decode(b"[" + text + b"]")
    ]


def letter_of(letter: bytes, parents: bytes | None) -> DeadLetter:
    """A dead letter read back, its job's parents' results put back."""
    dead = LETTER.decode(letter)
    if parents is not None:
        dead.job.parents = msgspec.Raw(parents)
    return dead


def letter_row(dead: DeadLetter) -> tuple[Any, ...]:
    """A dead letter's row: its filters' columns, and its job's parents' results apart."""
    job = dead.job
    bare = without_raw(job)
    return (
        dead.id,
        dead.job_id,
        job.type,
        job.queue,
        job.last_error,
        dead.created_at.timestamp(),
        encode(dead if bare is job else msgspec.structs.replace(dead, job=bare)),
        None if job.parents is None else bytes(job.parents),
    )


Group = tuple[str, str, int, str]  # a job's queue, type, priority and status
ADD_COUNTS = (
    "INSERT INTO job_counts (queue, type, priority, status, n) VALUES (?, ?, ?, ?, ?)"
    " ON CONFLICT DO UPDATE SET n = n + excluded.n"
)


def add_count(counts: dict[Group, int], group: Group, delta: int) -> None:
    """Count `delta` more jobs in `group`."""
    counts[group] = counts.get(group, 0) + delta


INSERT_LETTER = (
    "INSERT INTO dead_letters (id, job_id, type, queue, last_error, created_at, letter,"
    " parents) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
