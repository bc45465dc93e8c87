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
from goqueue.supervisor.enums import EventKind
from goqueue.supervisor.jobs import DeadLetter, Event, Job, Lease

encode = msgspec.json.Encoder().encode
JOB = msgspec.json.Decoder(Job)
LETTER = msgspec.json.Decoder(DeadLetter)
EVENTS = msgspec.json.Decoder(list[Event])

COLUMNS = (
    "seq, job, result, parents, lease_token, lease_owner, lease_expires, reaped_token,"
    " waiting_on, n_events"
)
SELECT_ROW = f"SELECT {COLUMNS} FROM jobs"

_UPDATE = (
    "UPDATE jobs SET status = ?, run_at = ?, started_at = ?, finished_at = ?,"
    " unique_key = ?, workflow_id = ?, waiting_on = ?, lease_token = ?, lease_owner = ?,"
    " lease_expires = ?, reaped_token = ?, job = ?, result = ?, parents = ?,"
    " events = events || ?, n_events = ? WHERE seq = ?"
)
_INSERT = (
    "INSERT INTO jobs (status, run_at, started_at, finished_at, unique_key, workflow_id,"
    " waiting_on, lease_token, lease_owner, lease_expires, reaped_token, job, result,"
    " parents, events, n_events, seq, id, type, queue, priority, created_at, parent_id)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


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

    @classmethod
    def read(cls, row: tuple[Any, ...]) -> Row:
        """A `Row` from the columns `SELECT_ROW` names."""
        seq, job_json, result, parents, token, owner, expires, reaped, waiting, n = row
        job = JOB.decode(job_json)
        job.seq = seq
        if result is not None:
            job.result = msgspec.Raw(result)
        if parents is not None:
            job.parents = msgspec.Raw(parents)
        return cls(job, token, owner, expires, reaped, waiting, n)

    def lease(self) -> Lease | None:
        """The lease the row holds, if any."""
        if self.lease_token is None or self.lease_expires is None:
            return None
        expires = datetime.fromtimestamp(self.lease_expires, UTC)
        owner = self.lease_owner or ""
        return Lease(job=self.job, token=self.lease_token, owner=owner, expires_at=expires)

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
        cap: int = 100,
    ) -> None:
        """Add an event to the job's trail (at most `cap` are kept)."""
        if self.n_events + len(self.new_events) >= cap:
            return
        event = Event(
            job_id=self.job.id,
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

    def _values(self) -> tuple[Any, ...]:
        job = self.job
        result, parents = job.result, job.parents
        bare = job
        if result is not None or parents is not None:
            bare = msgspec.structs.replace(job, result=None, parents=None)
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
            encode(bare),
            None if result is None else bytes(result),
            None if parents is None else bytes(parents),
            self._trail(),
            self.n_events + len(self.new_events),
        )

    def update(self) -> tuple[Any, ...]:
        """The parameters of `UPDATE` for this row; its new events are then written."""
        values = (*self._values(), self.job.seq)
        self.n_events += len(self.new_events)
        self.new_events.clear()
        return values

    def insert(self) -> tuple[Any, ...]:
        """The parameters of `INSERT` for this new row."""
        job = self.job
        values = (
            *self._values(),
            job.seq,
            job.id,
            job.type,
            job.queue,
            job.priority,
            job.created_at.timestamp(),
            job.parent_id,
        )
        self.n_events += len(self.new_events)
        self.new_events.clear()
        return values


UPDATE = _UPDATE
INSERT = _INSERT


def events_of(trail: bytes | str) -> list[Event]:
    """A row's trail as events, oldest first (SQLite's `||` makes the column text)."""
    if not trail:
        return []
    text = trail.encode() if isinstance(trail, str) else trail
    return EVENTS.decode(b"[" + text + b"]")


def letter_of(letter: bytes, parents: bytes | None) -> DeadLetter:
    """A dead letter read back, its job's parents' results put back."""
    dead = LETTER.decode(letter)
    if parents is not None:
        dead.job.parents = msgspec.Raw(parents)
    return dead


def letter_row(dead: DeadLetter) -> tuple[Any, ...]:
    """A dead letter's row: its filters' columns, and its job's parents' results apart."""
    job = dead.job
    bare = dead
    if job.parents is not None or job.result is not None:
        bare = msgspec.structs.replace(
            dead, job=msgspec.structs.replace(job, result=None, parents=None)
        )
    return (
        dead.id,
        dead.job_id,
        job.type,
        job.queue,
        job.last_error,
        dead.created_at.timestamp(),
        encode(bare),
        None if job.parents is None else bytes(job.parents),
    )


INSERT_LETTER = (
    "INSERT INTO dead_letters (id, job_id, type, queue, last_error, created_at, letter,"
    " parents) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
