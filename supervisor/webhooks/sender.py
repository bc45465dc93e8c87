"""Webhooks in this process, best effort: the in-memory store's deliveries.

`notify` never waits: it queues, and a fixed pool of consumer tasks delivers. A failed
attempt is re-queued by a loop timer after its backoff (the shared `RetrySchedule`), so
waiting for a retry holds no consumer and never delays other deliveries. Everything is
in memory: deliveries still queued or waiting for a retry when the process ends are
lost (PostgreSQL's outbox is the at-least-once one).

`max_queued` bounds every outstanding delivery (queued, in flight, or waiting out a
backoff), so a dead receiver cannot grow memory without limit; beyond it a delivery is
dropped and counted. The view of past deliveries keeps the last `max_remembered` jobs'.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import timedelta

import msgspec
from goqueue.supervisor.common.deliveries import (
    Answer,
    Delivery,
    DeliveryAttempt,
    event_of,
    job_body,
    redacted,
)
from goqueue.supervisor.common.enums import WebhookEvent, WebhookOutcome
from goqueue.supervisor.common.jobs import Job, new_id, utcnow
from goqueue.supervisor.webhooks.delivery import OutcomeHook, Poster, RetrySchedule, headers, tell


@dataclass(eq=False)
class _Delivery:
    """One delivery on its way or done; compared by identity so it can live in a set."""

    view: Delivery
    target: str  # the URL as given (the view's is redacted)
    body: bytes
    headers: dict[str, str]
    job_id: str
    born: float  # time.monotonic() of the terminal status
    timer: asyncio.TimerHandle | None = field(default=None, repr=False)


class WebhookSender:
    """`Webhooks` for the in-memory store: delivered from this process, best effort."""

    def __init__(
        self,
        poster: Poster,
        *,
        secret: bytes | None,
        node_id: str,
        schedule: RetrySchedule | None = None,
        max_queued: int = 10_000,
        max_remembered: int = 10_000,
        on_outcome: OutcomeHook | None = None,
        logger: logging.Logger | None = None,
        rng: random.Random | None = None,
    ) -> None:
        if max_queued < 1 or max_remembered < 1:
            raise ValueError("max_queued and max_remembered must be at least 1")
        self._poster = poster
        self._secret = secret
        self._node_id = node_id
        self._schedule = schedule or RetrySchedule()
        self._max_queued = max_queued
        self._max_remembered = max_remembered
        self._on_outcome = on_outcome
        self._log = logger or logging.getLogger(__name__)
        self._rng = rng or random.Random()
        self._queue: asyncio.Queue[_Delivery] = asyncio.Queue()
        self._live: set[_Delivery] = set()  # outstanding: queued, in flight or waiting
        self._busy = 0  # of which queued or in flight (not waiting out a backoff)
        self._quiet = asyncio.Event()  # set while `_busy` is 0
        self._quiet.set()
        self._seen: OrderedDict[str, list[Delivery]] = OrderedDict()  # job id -> deliveries
        self._consumers: list[asyncio.Task[None]] = []
        self._started = False
        self._closing = False

    async def start(self) -> None:
        """Open the HTTP session and start the consumer tasks."""
        if self._started or self._closing:
            raise RuntimeError("WebhookSender can be started once, before close()")
        self._started = True
        await self._poster.start()
        self._consumers = [
            asyncio.create_task(self._consume(), name=f"webhook-consumer-{i}")
            for i in range(self._poster.concurrency)
        ]

    def notify(self, job: Job) -> None:
        """Queue the webhook of a job just recorded as terminal (none without a URL)."""
        event = event_of(job)
        if event is not None and job.webhook_url is not None:
            self.submit(job.webhook_url, job_body(job), job_id=job.id, event=event)

    def submit(self, url: str, body: bytes, *, job_id: str, event: WebhookEvent) -> None:
        """Queue one delivery of `body` to `url`; never blocks (drops when full)."""
        delivery_id = new_id()
        now = utcnow()
        view = Delivery(
            id=delivery_id, event=event, url=redacted(url), attempts=[], next_attempt_at=now
        )
        self._remember(job_id, view)
        reason = None
        if self._closing:
            reason = "webhook sender is closed"
        elif len(self._live) >= self._max_queued:
            reason = f"webhook queue is full ({self._max_queued} deliveries outstanding)"
        if reason is not None:
            self._log.warning("webhook dropped", extra=self._fields(view, job_id, 0, reason))
            view.next_attempt_at, view.given_up = None, True
            self._count(WebhookOutcome.DROPPED)
            return
        request = headers(delivery_id, event, job_id, body, self._secret)
        delivery = _Delivery(view, url, body, request, job_id, time.monotonic())
        self._live.add(delivery)
        self._enqueue(delivery)

    async def deliveries(self, job_id: str) -> list[Delivery]:
        """A job's deliveries this process remembers, oldest first (copies: the
        originals change as attempts go on)."""
        views = self._seen.get(job_id, ())
        return [msgspec.structs.replace(v, attempts=list(v.attempts)) for v in views]

    async def close(self, grace: float) -> None:
        """Stop accepting, let the attempts queued or in flight finish for up to `grace`
        seconds, then drop the rest (those waiting for a retry too) and close the session."""
        if self._closing:
            return
        self._closing = True
        if self._consumers and self._busy:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._quiet.wait(), grace)
        for task in self._consumers:
            task.cancel()
        await asyncio.gather(*self._consumers, return_exceptions=True)
        self._consumers = []
        for delivery in list(self._live):
            if delivery.timer is not None:
                delivery.timer.cancel()
            reason = "the node stopped before it was delivered"
            self._log.warning(
                "webhook abandoned at shutdown", extra=self._log_fields(delivery, reason)
            )
            delivery.view.next_attempt_at, delivery.view.given_up = None, True
            self._finish(delivery, WebhookOutcome.DROPPED)
        await self._poster.close()

    # -- delivering ------------------------------------------------------------------

    async def _consume(self) -> None:
        """One consumer: deliver queued attempts one at a time, forever."""
        while True:
            delivery = await self._queue.get()
            try:
                await self._attempt(delivery)
            except Exception:
                # A bug here must not silently shrink the consumer pool.
                reason = "internal error"
                self._log.exception(
                    "webhook delivery crashed", extra=self._log_fields(delivery, reason)
                )
                delivery.view.next_attempt_at, delivery.view.given_up = None, True
                self._finish(delivery, WebhookOutcome.FAILED)
            self._settled()

    async def _attempt(self, delivery: _Delivery) -> None:
        """Make one attempt, record it, then finish or schedule the next."""
        answer = await self._poster.post(delivery.target, delivery.body, delivery.headers)
        view = delivery.view
        view.attempts.append(self._attempt_record(answer))
        if answer.delivered:
            view.delivered_at, view.next_attempt_at = view.attempts[-1].at, None
            self._finish(delivery, WebhookOutcome.DELIVERED)
            return
        reason = answer.error or "no answer"
        delay = self._schedule.delay(len(view.attempts), self._rng)
        age_at_next = time.monotonic() - delivery.born + delay
        if answer.refused or self._schedule.gives_up(age_at_next):
            level = logging.WARNING if answer.refused else logging.ERROR
            self._log.log(
                level, "webhook delivery gave up", extra=self._log_fields(delivery, reason)
            )
            view.next_attempt_at, view.given_up = None, True
            self._finish(
                delivery, WebhookOutcome.REFUSED if answer.refused else WebhookOutcome.FAILED
            )
            return
        self._log.warning("webhook delivery failed", extra=self._log_fields(delivery, reason))
        view.next_attempt_at = utcnow() + timedelta(seconds=delay)
        delivery.timer = asyncio.get_running_loop().call_later(delay, self._requeue, delivery)
        self._count(WebhookOutcome.RETRIED)

    def _attempt_record(self, answer: Answer) -> DeliveryAttempt:
        return DeliveryAttempt(
            at=utcnow(), status_code=answer.status_code, error=answer.error, node=self._node_id
        )

    def _requeue(self, delivery: _Delivery) -> None:
        """Timer callback: put a delivery whose backoff has elapsed back in the queue."""
        delivery.timer = None
        if delivery in self._live:
            self._enqueue(delivery)

    def _enqueue(self, delivery: _Delivery) -> None:
        self._busy += 1
        self._quiet.clear()
        self._queue.put_nowait(delivery)

    def _settled(self) -> None:
        """An attempt ended (delivered, given up, or waiting for its retry)."""
        self._busy -= 1
        if not self._busy:
            self._quiet.set()

    def _finish(self, delivery: _Delivery, outcome: WebhookOutcome) -> None:
        self._live.discard(delivery)
        self._count(outcome)

    def _remember(self, job_id: str, view: Delivery) -> None:
        self._seen.setdefault(job_id, []).append(view)
        self._seen.move_to_end(job_id)
        while len(self._seen) > self._max_remembered:
            self._seen.popitem(last=False)

    def _count(self, outcome: WebhookOutcome) -> None:
        tell(self._on_outcome, outcome, self._log)

    def _log_fields(self, delivery: _Delivery, reason: str) -> dict[str, object]:
        return self._fields(delivery.view, delivery.job_id, len(delivery.view.attempts), reason)

    @staticmethod
    def _fields(view: Delivery, job_id: str, attempt: int, reason: str) -> dict[str, object]:
        return {
            "url": view.url,
            "job_id": job_id,
            "delivery_id": view.id,
            "attempt": attempt,
            "reason": reason,
        }
