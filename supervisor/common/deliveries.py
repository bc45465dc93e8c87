"""A webhook delivery as the stores keep it and the API shows it: the records, the
table of owed deliveries the outbox (`webhooks/outbox.py`) leases from (the PostgreSQL
and SQLite stores answer the same three calls), and what a job's delivery carries."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

import msgspec
from goqueue.supervisor.common.enums import TERMINAL, Status, WebhookEvent
from goqueue.supervisor.common.jobs import SHOWN_FIELDS, Job
from yarl import URL

EVENTS: dict[Status, WebhookEvent] = {
    Status.DONE: WebhookEvent.DONE,
    Status.FAILED: WebhookEvent.FAILED,
    Status.CANCELLED: WebhookEvent.CANCELLED,
}
_encode = msgspec.json.Encoder().encode


def job_body(job: Job) -> bytes:
    """The body of a job's webhook: the job as `GET /jobs/{id}` shows it."""
    return _encode({name: getattr(job, name) for name in SHOWN_FIELDS})


def event_of(job: Job) -> WebhookEvent | None:
    """The event a job's status fires, or None (not terminal, or no `webhook_url`)."""
    if not job.webhook_url or job.status not in TERMINAL:
        return None
    return EVENTS[job.status]


def redacted(url: str) -> str:
    """`url` fit for logs and the API: no credentials, query string or fragment (where
    receivers often put tokens)."""
    try:
        return str(URL(url).with_user(None).with_query(None).with_fragment(None))
    except (TypeError, ValueError):
        return "(unparseable URL)"


class DeliveryAttempt(msgspec.Struct, kw_only=True):
    """One attempt: when it ended, the receiver's status (null if it never answered),
    why it failed (null on success), and the node that made it."""

    at: datetime
    status_code: int | None = None
    error: str | None = None
    node: str


class Delivery(msgspec.Struct, kw_only=True):
    """One webhook of a job and every attempt at it. `id` is the `X-GoQueue-Delivery`
    header; `next_attempt_at` is null once delivered or given up."""

    id: str
    event: str  # a WebhookEvent, declared str: the API documents a plain string
    url: str  # credentials, query and fragment removed
    attempts: list[DeliveryAttempt]
    delivered_at: datetime | None = None
    next_attempt_at: datetime | None = None
    given_up: bool = False


@dataclass(frozen=True, slots=True)
class Answer:
    """How one attempt went: the status code (None if no answer), or why it failed;
    `refused` when the egress policy stopped it before anything was sent."""

    status_code: int | None = None
    error: str | None = None
    refused: bool = False

    @property
    def delivered(self) -> bool:
        """A 2xx answer."""
        return self.status_code is not None and 200 <= self.status_code < 300


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
