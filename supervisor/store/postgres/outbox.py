"""The webhook outbox on PostgreSQL: the deliveries terminal statuses wrote (the
`outbox` CTE of `sql/fragments.py`), leased to a node, attempted, and recorded.

A claim takes due rows with `FOR UPDATE SKIP LOCKED` and leases them by pushing their
next attempt a lease ahead, so two nodes never hold one delivery at once and a node
that dies mid-attempt leaves it to the others when the lease runs out. Each attempt is
written back fenced by the lease token: a node whose lease was taken over records
nothing.
"""

from __future__ import annotations

from typing import Any

import msgspec
from goqueue.supervisor.common.deliveries import Answer, Delivery, DeliveryAttempt, Due, redacted
from goqueue.supervisor.store.postgres import rows as pg_rows
from goqueue.supervisor.store.postgres.connection import Connections
from goqueue.supervisor.store.postgres.sql.statements import Sql, Statements

_HISTORY = msgspec.json.Decoder(list[DeliveryAttempt])


class OutboxRows:
    """The outbox table's statements (see the module)."""

    def __init__(self, db: Connections, sql: Statements, node_id: str) -> None:
        self._db = db
        self._sql = sql
        self.node_id = node_id

    async def claim(self, limit: int, lease_seconds: float) -> list[Due]:
        """Lease up to `limit` due deliveries, the longest due first. Raises
        StoreUnavailable."""
        if limit <= 0:
            return []
        params = {"limit": limit, "lease": lease_seconds, "node": self.node_id}
        rows = await self._db.execute(self._sql[Sql.OUTBOX_CLAIM], params)
        return [
            Due(
                id=r[0],
                job_id=r[1],
                event=r[2],
                url=r[3],
                body=r[4].encode(),
                attempts=r[5],
                token=r[6],
            )
            for r in rows
        ]

    async def record(
        self, due: Due, answer: Answer, *, delay: float, max_age: float, final: bool = False
    ) -> bool | None:
        """Write one attempt: delivered, or due again in `delay` seconds unless `final` or
        past `max_age` (then given up). Returns whether it was given up; None when the
        lease was lost meanwhile (nothing written). Raises StoreUnavailable."""
        params: dict[str, Any] = {
            "id": due.id,
            "token": due.token,
            "delivered": answer.delivered,
            "final": final,
            "delay": delay,
            "max_age": max_age,
            "status_code": answer.status_code,
            "error": pg_rows.text(answer.error),
            "node": self.node_id,
        }
        rows = await self._db.execute(self._sql[Sql.OUTBOX_RECORD], params)
        return bool(rows[0][0]) if rows else None

    async def of_job(self, job_id: str) -> list[Delivery]:
        """A job's deliveries, oldest first. Raises StoreUnavailable."""
        if not pg_rows.is_uuid(job_id):
            return []
        rows = await self._db.execute(self._sql[Sql.OUTBOX_OF_JOB], {"id": job_id})
        return [
            Delivery(
                id=r[0],
                event=r[1],
                url=redacted(r[2]),
                attempts=_HISTORY.decode(r[3]),
                delivered_at=r[4],
                next_attempt_at=r[5],
                given_up=r[6] is not None,
            )
            for r in rows
        ]
