"""The SQLite store's dead letters: replayed into fresh jobs, purged, found by id or by
their job's id; each write on disk before the answer."""

from __future__ import annotations

import sqlite3

from goqueue.supervisor.common.bulk import Purged, Replayed
from goqueue.supervisor.common.enums import EventKind
from goqueue.supervisor.common.errors import NotFound, StoreFull
from goqueue.supervisor.common.jobs import DeadLetter, Job
from goqueue.supervisor.common.summaries import DeadFilter
from goqueue.supervisor.store.sqlite import reads, steps
from goqueue.supervisor.store.sqlite.calls import Read, Write
from goqueue.supervisor.store.sqlite.rows import letter_of
from goqueue.supervisor.store.sqlite.rules import Tx


class SqliteDeadLetters:
    """The dead-letter calls of a `SqliteStore`, made through its `write` and `read`."""

    def __init__(self, write: Write, read: Read) -> None:
        self._write = write
        self._read = read

    async def replay(self, dead_id: str, max_retries: int) -> Job:
        """Replay a letter: the new job and the letter's removal in one transaction."""

        def work(tx: Tx) -> Job:
            dead = letter(tx.conn, dead_id)
            if dead is None:
                raise NotFound(f"dead letter {dead_id} not found")
            tx.check_room()
            return _replay(tx, dead, max_retries)

        return await self._write(work, durable=True)

    async def replay_many(self, filters: DeadFilter, limit: int) -> Replayed:
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

    async def purge(self, dead_id: str) -> bool:
        """Delete a letter, on disk before the answer."""

        def work(tx: Tx) -> bool:
            gone = tx.conn.execute("DELETE FROM dead_letters WHERE id = ?", (dead_id,))
            return gone.rowcount > 0

        return await self._write(work, durable=True)

    async def purge_many(self, filters: DeadFilter, limit: int) -> Purged:
        """Delete up to `limit` matching letters, oldest first, in one transaction."""

        def work(tx: Tx) -> Purged:
            letters, more = reads.oldest_letters(tx.conn, filters, limit)
            tx.conn.executemany(
                "DELETE FROM dead_letters WHERE id = ?", [(dead.id,) for dead in letters]
            )
            return Purged(len(letters), more)

        return await self._write(work, durable=True)

    async def get(self, dead_id: str) -> DeadLetter | None:
        """One dead letter, by its own id or its job's."""
        return self._read(lambda c: letter(c, dead_id) or letter(c, dead_id, by_job=True))


def _replay(tx: Tx, dead: DeadLetter, max_retries: int) -> Job:
    """A fresh job from a dead letter, in its step's place; the letter goes."""
    row = tx.insert(dead.job.replay_spec(), max_retries, None)
    steps.resume(tx, dead.job, row)
    tx.conn.execute("DELETE FROM dead_letters WHERE id = ?", (dead.id,))
    tx.event(row, EventKind.REPLAYED, dead.job_id)
    tx.save(row)
    return row.job


def letter(conn: sqlite3.Connection, some_id: str, *, by_job: bool = False) -> DeadLetter | None:
    """A dead letter by its own id, or (`by_job`) the latest of a job."""
    column = "job_id" if by_job else "id"
    found = conn.execute(
        f"SELECT letter, parents FROM dead_letters WHERE {column} = ? ORDER BY seq DESC LIMIT 1",
        (some_id,),
    ).fetchone()
    return None if found is None else letter_of(found[0], found[1])
