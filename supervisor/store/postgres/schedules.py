"""Periodic jobs on PostgreSQL: schedules' state shared by every node, and ticks fired
exactly once however many nodes try them.

A fire is one transaction: lock the schedule's row (created if need be), refuse if it is
disabled or this tick is not after its last fire, insert the tick's key into
`schedule_fires` (a second try of one tick inserts nothing), insert the job with its
`enqueued` event naming the schedule and the tick, and move the last fire on. Nodes
firing one tick take turns on the row lock; the later one finds it fired and moves on.
"""

from __future__ import annotations

from datetime import datetime

from goqueue.supervisor.common.enums import EventKind
from goqueue.supervisor.common.jobs import Job, new_id
from goqueue.supervisor.common.schedule import Fired, ScheduleState, fire_detail
from goqueue.supervisor.store.base import NewJob
from goqueue.supervisor.store.postgres.connection import Connections
from goqueue.supervisor.store.postgres.enqueue import Enqueuer
from goqueue.supervisor.store.postgres.notify import Wakeups
from goqueue.supervisor.store.postgres.rows import Row
from goqueue.supervisor.store.postgres.sql.statements import Sql, Statements


def _state(row: Row) -> ScheduleState:
    return ScheduleState(
        name=row[0],
        enabled=row[1],
        last_fire=row[2],
        last_job_id=None if row[3] is None else str(row[3]),
        enabled_at=row[4],
    )


class ScheduleRows:
    """The schedules' statements (see the module)."""

    def __init__(
        self, db: Connections, sql: Statements, node_id: str, enqueuer: Enqueuer, wakeups: Wakeups
    ) -> None:
        self._db = db
        self._sql = sql
        self.node_id = node_id
        self._enqueuer = enqueuer
        self._wakeups = wakeups

    async def states(self) -> dict[str, ScheduleState]:
        """Every schedule's state, by name."""
        rows = await self._db.execute(self._sql[Sql.SCHEDULE_STATES], {})
        return {row[0]: _state(row) for row in rows}

    async def fire(
        self, name: str, tick: datetime, new: NewJob, *, missed: bool = False
    ) -> tuple[Fired, Job | None]:
        """Store the tick's job once (see the module)."""
        job_id = new_id()
        params = {"name": name, "tick": tick, "job_id": job_id, "node": self.node_id}
        async with self._db.connection() as conn, conn.transaction():
            row = await self._db.fetchone(conn, self._sql[Sql.SCHEDULE_LOCK], params)
            assert row is not None
            enabled, last_fire = row
            if not enabled:
                return Fired.DISABLED, None
            if last_fire is not None and tick <= last_fire:
                return Fired.TAKEN, None
            if await self._db.fetchone(conn, self._sql[Sql.SCHEDULE_FIRE], params) is None:
                return Fired.TAKEN, None
            events = [(EventKind.ENQUEUED, fire_detail(name, tick, missed))]
            job = await self._enqueuer.insert(
                conn, new.spec, new.max_retries, job_id=job_id, events=events
            )
            await conn.execute(self._sql[Sql.SCHEDULE_FIRED], params)
        self._wakeups.pending([job])
        return Fired.FIRED, job

    async def switch(self, name: str, enabled: bool) -> ScheduleState:
        """Enable or disable a schedule for every node."""
        params = {"name": name, "enabled": enabled}
        rows = await self._db.write(self._sql[Sql.SCHEDULE_SWITCH], params)
        return _state(rows[0])
