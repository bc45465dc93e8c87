"""Webhooks from a store's outbox (PostgreSQL's, or the SQLite file's): at least once, by
whichever node is alive.

The terminal status wrote the delivery in its own transaction (the `outbox` CTE); here
a loop leases due deliveries (the PostgreSQL store's `OutboxRows.claim`), makes one
attempt of each concurrently, and records it. It claims when this node wrote a delivery
(`notify` wakes it), when an attempt ends and frees a slot, and otherwise every
`poll` seconds (another node's deliveries, retries falling due, leases of dead nodes).
A delivery is lost by nothing: a node that dies mid-attempt leaves its lease to run
out, an attempt whose record cannot be written is simply made again after the lease,
and an attempt cut short at shutdown is recorded as interrupted and due at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random

from goqueue.supervisor.common.backoff import Backoff
from goqueue.supervisor.common.deliveries import (
    Answer,
    Delivery,
    DeliveryRows,
    Due,
    event_of,
    redacted,
)
from goqueue.supervisor.common.enums import WebhookOutcome
from goqueue.supervisor.common.errors import StoreUnavailable
from goqueue.supervisor.common.jobs import Job
from goqueue.supervisor.webhooks.delivery import OutcomeHook, Poster, RetrySchedule, headers, tell

POLL_SECONDS = 1.0
RETRY_SLACK = 0.02  # after a retry's due time, so the claim's clock has passed it too
RECORD_AT_CLOSE = 5.0  # seconds to record the attempts cut short at shutdown
INTERRUPTED = "interrupted: the node shut down during the attempt"


class Outbox:
    """`Webhooks` for the PostgreSQL and SQLite stores: delivered from the outbox table."""

    def __init__(
        self,
        rows: DeliveryRows,
        poster: Poster,
        *,
        secret: bytes | None,
        schedule: RetrySchedule | None = None,
        poll: float = POLL_SECONDS,
        on_outcome: OutcomeHook | None = None,
        logger: logging.Logger | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self._rows = rows
        self._poster = poster
        self._secret = secret
        self._schedule = schedule or RetrySchedule()
        self._poll = poll
        # An attempt may take the poster's whole timeout, then its record a moment more.
        self.lease_seconds = 2 * poster.timeout + 5.0
        self._on_outcome = on_outcome
        self._log = logger or logging.getLogger(__name__)
        self._rng = rng or random.Random()
        self._wake = asyncio.Event()
        self._in_flight: dict[asyncio.Task[None], Due] = {}
        self._answered: set[str] = set()  # in flight, but only the record is left to write
        self._loop_task: asyncio.Task[None] | None = None
        self._closing = False
        self._retries: set[asyncio.TimerHandle] = set()  # wake-ups for retries recorded here

    async def start(self) -> None:
        """Open the HTTP session and start the delivery loop."""
        if self._loop_task is not None or self._closing:
            raise RuntimeError("Outbox can be started once, before close()")
        await self._poster.start()
        self._loop_task = asyncio.create_task(self._run(), name="goqueue-webhook-outbox")

    def notify(self, job: Job) -> None:
        """A job became terminal here: its delivery (if any) is in the outbox already,
        so look now rather than at the next poll."""
        if event_of(job) is not None:
            self._wake.set()

    async def deliveries(self, job_id: str) -> list[Delivery]:
        """A job's deliveries, oldest first (from the table: any node's)."""
        return await self._rows.of_job(job_id)

    async def close(self, grace: float) -> None:
        """Stop claiming; attempts in flight get up to `grace` seconds, then are cut
        short and recorded as interrupted (due again at once, for another node).
        Deliveries not started stay in the table for the next node."""
        if self._closing:
            return
        self._closing = True
        self._wake.set()
        for timer in self._retries:
            timer.cancel()
        self._retries.clear()
        if self._loop_task is not None:  # a claim under way may return leases to start
            await asyncio.wait({self._loop_task}, timeout=grace)
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)
        if self._in_flight:
            await asyncio.wait(set(self._in_flight), timeout=grace)
        cut = dict(self._in_flight)
        # A record cut short may have been written, or not: then the lease runs out.
        asked = [due for due in cut.values() if due.id not in self._answered]
        for task in cut:
            task.cancel()
        await asyncio.gather(*cut, return_exceptions=True)
        interrupted = Answer(error=INTERRUPTED)
        records = [self._record(due, interrupted, delay=0.0) for due in asked]
        with contextlib.suppress(TimeoutError):  # unrecorded, they wait out their lease
            await asyncio.wait_for(asyncio.gather(*records), RECORD_AT_CLOSE)
        await self._poster.close()

    # -- the loop --------------------------------------------------------------------

    async def _run(self) -> None:
        """Claim what is due while there are free slots; wait to be woken or to poll."""
        failures = Backoff(0.5, 10.0, self._rng)
        while not self._closing:
            self._wake.clear()
            free = self._poster.concurrency - len(self._in_flight)
            wait = self._poll
            if free > 0:
                try:
                    claimed = await self._rows.claim(free, self.lease_seconds)
                except StoreUnavailable as exc:
                    wait = failures.next()
                    self._log.warning(
                        "webhook outbox unreachable", extra={"err": str(exc), "retry_in": wait}
                    )
                    claimed = []
                else:
                    failures.reset()
                for due in claimed:
                    self._begin(due)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), wait)

    def _wake_for_retry(self, delay: float) -> None:
        """Claim again when the retry just recorded falls due: a poll alone would make it
        up to `poll` seconds late (a 2 s backoff became 3 s)."""
        loop = asyncio.get_running_loop()

        def wake() -> None:
            self._retries.discard(timer)
            self._wake.set()

        timer = loop.call_later(delay + RETRY_SLACK, wake)
        self._retries.add(timer)

    def _begin(self, due: Due) -> None:
        task = asyncio.create_task(self._deliver(due), name=f"webhook-{due.id}")
        self._in_flight[task] = due
        task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[None]) -> None:
        due = self._in_flight.pop(task, None)
        if due is not None:
            self._answered.discard(due.id)
        if not task.cancelled() and task.exception() is not None:
            self._log.error("webhook delivery crashed", exc_info=task.exception())
        self._wake.set()  # a slot is free: more may be due

    async def _deliver(self, due: Due) -> None:
        """One attempt of a leased delivery, then its record."""
        request = headers(due.id, due.event, due.job_id, due.body, self._secret)
        answer = await self._poster.post(due.url, due.body, request)
        self._answered.add(due.id)
        delay = self._schedule.delay(due.attempts + 1, self._rng)
        gave_up = await self._record(due, answer, delay=delay, final=answer.refused)
        if gave_up is None:
            return
        if not (answer.delivered or answer.refused or gave_up):
            self._wake_for_retry(delay)
        self._count(_outcome(answer, gave_up))
        fields = self._fields(due, answer)
        if answer.delivered:
            self._log.debug("webhook delivered", extra=fields)
        elif answer.refused:
            self._log.warning("webhook refused", extra=fields)
        elif gave_up:
            self._log.error("webhook delivery gave up", extra=fields)
        else:
            self._log.warning("webhook delivery failed", extra={**fields, "retry_in": delay})

    async def _record(
        self, due: Due, answer: Answer, *, delay: float, final: bool = False
    ) -> bool | None:
        """Write the attempt; None when it could not be (lost lease, store down: the
        delivery is then made again once its lease runs out)."""
        try:
            gave_up = await self._rows.record(
                due, answer, delay=delay, max_age=self._schedule.max_age, final=final
            )
        except StoreUnavailable as exc:
            self._log.warning(
                "webhook attempt not recorded; it will be made again",
                extra={**self._fields(due, answer), "err": str(exc)},
            )
            return None
        if gave_up is None:
            self._log.warning(
                "webhook lease lost during the attempt", extra=self._fields(due, answer)
            )
        return gave_up

    def _count(self, outcome: WebhookOutcome) -> None:
        tell(self._on_outcome, outcome, self._log)

    @staticmethod
    def _fields(due: Due, answer: Answer) -> dict[str, object]:
        return {
            "url": redacted(due.url),
            "job_id": due.job_id,
            "delivery_id": due.id,
            "attempt": due.attempts + 1,
            "status_code": answer.status_code,
            "reason": answer.error,
        }


def _outcome(answer: Answer, gave_up: bool) -> WebhookOutcome:
    if answer.delivered:
        return WebhookOutcome.DELIVERED
    if answer.refused:
        return WebhookOutcome.REFUSED
    return WebhookOutcome.FAILED if gave_up else WebhookOutcome.RETRIED
