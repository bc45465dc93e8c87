"""What the webhook outbox (`outbox.Outbox`) asks of the table behind it: the
PostgreSQL store's and the SQLite store's deliveries answer the same three calls."""

from __future__ import annotations

from typing import Protocol

import msgspec
from goqueue.supervisor.webhooks.delivery import Answer, Delivery


class Due(msgspec.Struct, frozen=True, kw_only=True):
    """A delivery this node holds the lease of: what to send, and the token to record."""

    id: str
    job_id: str
    event: str
    url: str
    body: bytes
    attempts: int  # made before this one
    token: str


class DeliveryRows(Protocol):
    """A store's table of owed webhook deliveries, leased to the node attempting them."""

    async def claim(self, limit: int, lease_seconds: float) -> list[Due]:
        """Lease up to `limit` due deliveries, the longest due first. Raises
        StoreUnavailable."""

    async def record(
        self, due: Due, answer: Answer, *, delay: float, max_age: float, final: bool = False
    ) -> bool | None:
        """Write one attempt, fenced by the lease: whether it was given up; None when the
        lease was lost meanwhile. Raises StoreUnavailable."""

    async def of_job(self, job_id: str) -> list[Delivery]:
        """A job's deliveries, oldest first. Raises StoreUnavailable."""
