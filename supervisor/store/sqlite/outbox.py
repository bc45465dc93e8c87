"""The webhook outbox in the SQLite file, for `webhooks.outbox.Outbox` to drive.

A terminal status writes its delivery in the same transaction as the status (the store
marks it with the job). Here the outbox leases due deliveries (pushing their next
attempt a lease ahead), and records each attempt fenced by the lease token, as on
PostgreSQL; a delivery owed when the node died is due again once its lease runs out
after the restart, so it is made at least once.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from datetime import datetime

import msgspec
from goqueue.supervisor.common.deliveries import Answer, Delivery, DeliveryAttempt, Due, redacted
from goqueue.supervisor.common.jobs import new_id
from goqueue.supervisor.store.sqlite.database import Database
from goqueue.supervisor.store.sqlite.rows import from_ts

_HISTORY = msgspec.json.Decoder(list[DeliveryAttempt])
_encode = msgspec.json.Encoder().encode


class SqliteOutboxRows:
    """The outbox table's statements (see the module)."""

    def __init__(self, db: Database, node_id: str, clock: Callable[[], datetime]) -> None:
        self._db = db
        self.node_id = node_id
        self._clock = clock

    async def claim(self, limit: int, lease_seconds: float) -> list[Due]:
        """Lease up to `limit` due deliveries, the longest due first."""
        if limit <= 0:
            return []
        now = self._clock().timestamp()

        def claim(conn: sqlite3.Connection) -> list[Due]:
            rows = conn.execute(
                "SELECT id, job_id, event, url, body, attempts FROM webhook_deliveries"
                " WHERE next_attempt_at <= ? ORDER BY next_attempt_at LIMIT ?",
                (now, limit),
            ).fetchall()
            due = [
                Due(
                    id=r[0],
                    job_id=r[1],
                    event=r[2],
                    url=r[3],
                    body=bytes(r[4]),
                    attempts=r[5],
                    token=new_id(),
                )
                for r in rows
            ]
            conn.executemany(
                "UPDATE webhook_deliveries SET next_attempt_at = ?, lease_owner = ?,"
                " lease_token = ? WHERE id = ?",
                [(now + lease_seconds, self.node_id, d.token, d.id) for d in due],
            )
            return due

        return await self._db.write(claim)

    async def record(
        self, due: Due, answer: Answer, *, delay: float, max_age: float, final: bool = False
    ) -> bool | None:
        """Write one attempt: delivered, or due again in `delay` seconds unless `final` or
        past `max_age` (then given up). Whether it was given up; None when the lease
        was lost meanwhile (nothing written)."""
        now = self._clock()
        ts = now.timestamp()
        attempt = DeliveryAttempt(
            at=now, status_code=answer.status_code, error=answer.error, node=self.node_id
        )

        def record(conn: sqlite3.Connection) -> bool | None:
            row = conn.execute(
                "SELECT created_at, history FROM webhook_deliveries"
                " WHERE id = ? AND lease_token = ?",
                (due.id, due.token),
            ).fetchone()
            if row is None:
                return None
            created_at, history = row
            last = not answer.delivered and (final or ts + delay > created_at + max_age)
            attempts = [*_HISTORY.decode(history), attempt]
            conn.execute(
                "UPDATE webhook_deliveries SET attempts = attempts + 1, history = ?,"
                " delivered_at = ?, given_up_at = ?, next_attempt_at = ?,"
                " lease_owner = NULL, lease_token = NULL WHERE id = ?",
                (
                    _encode(attempts),
                    ts if answer.delivered else None,
                    ts if last else None,
                    None if answer.delivered or last else ts + delay,
                    due.id,
                ),
            )
            return last

        return await self._db.write(record)

    async def of_job(self, job_id: str) -> list[Delivery]:
        """A job's deliveries, oldest first."""

        def read(conn: sqlite3.Connection) -> list[Delivery]:
            rows = conn.execute(
                "SELECT id, event, url, history, delivered_at, next_attempt_at, given_up_at"
                " FROM webhook_deliveries WHERE job_id = ? ORDER BY created_at, rowid",
                (job_id,),
            ).fetchall()
            return [
                Delivery(
                    id=r[0],
                    event=r[1],
                    url=redacted(r[2]),
                    attempts=_HISTORY.decode(r[3]),
                    delivered_at=from_ts(r[4]),
                    next_attempt_at=from_ts(r[5]),
                    given_up=r[6] is not None,
                )
                for r in rows
            ]

        return await self._db.read(read)

    async def prune(self, finished_before: datetime) -> None:
        """Forget deliveries made or given up before `finished_before`."""
        ts = finished_before.timestamp()
        await self._db.write(
            lambda conn: conn.execute(
                "DELETE FROM webhook_deliveries WHERE next_attempt_at IS NULL AND created_at < ?",
                (ts,),
            )
        )
