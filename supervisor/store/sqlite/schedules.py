"""The SQLite store's periodic jobs: each schedule's state (its last fire, whether it is
enabled) kept across restarts, and a tick fired at most once, its job in the same
transaction."""

from __future__ import annotations

from datetime import datetime

import msgspec
from goqueue.supervisor.common.jobs import Job
from goqueue.supervisor.common.schedule import Fired, ScheduleState, fire_detail
from goqueue.supervisor.store.base import NewJob
from goqueue.supervisor.store.sqlite.calls import Read, Write
from goqueue.supervisor.store.sqlite.rows import encode
from goqueue.supervisor.store.sqlite.rules import Tx

SCHEDULE = msgspec.json.Decoder(ScheduleState)


class SqliteSchedules:
    """The schedule calls of a `SqliteStore`, made through its `write` and `read`."""

    def __init__(self, write: Write, read: Read) -> None:
        self._write = write
        self._read = read

    async def states(self) -> dict[str, ScheduleState]:
        """Every schedule fired or switched, kept across restarts."""
        rows = self._read(lambda c: c.execute("SELECT state FROM schedules").fetchall())
        states = [SCHEDULE.decode(state) for (state,) in rows]
        return {state.name: state for state in states}

    async def fire(
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

    async def switch(self, name: str, enabled: bool) -> ScheduleState:
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


def _schedule(tx: Tx, name: str) -> ScheduleState | None:
    found = tx.conn.execute("SELECT state FROM schedules WHERE name = ?", (name,)).fetchone()
    return None if found is None else SCHEDULE.decode(found[0])


def _save_schedule(tx: Tx, state: ScheduleState) -> None:
    tx.conn.execute(
        "INSERT OR REPLACE INTO schedules (name, state) VALUES (?, ?)", (state.name, encode(state))
    )
