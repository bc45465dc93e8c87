"""Background webhook delivery: job notifications POSTed from the supervisor's loop.

`submit` never waits: it enqueues, and a fixed pool of consumer tasks delivers. A failed
attempt is re-queued by a loop timer after its backoff, so waiting for a retry holds no
consumer and never delays other deliveries.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp
from goqueue.supervisor.backoff import backoff
from goqueue.supervisor.vocab import WebhookOutcome
from yarl import URL

SIGNATURE_HEADER = "X-GoQueue-Signature"
JOB_ID_HEADER = "X-GoQueue-Job-Id"
USER_AGENT = "goqueue-webhook"

OutcomeHook = Callable[[WebhookOutcome], None]


def sign(secret: bytes, body: bytes) -> str:
    """The `X-GoQueue-Signature` value: `sha256=` + lowercase hex HMAC-SHA256 of the body."""
    return "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()


@dataclass(eq=False)
class _Delivery:
    """One notification on its way; compared by identity so it can live in a set."""

    url: str
    body: bytes
    headers: dict[str, str]
    job_id: str
    log_url: str
    attempt: int = 0
    timer: asyncio.TimerHandle | None = field(default=None, repr=False)


class WebhookSender:
    """Delivers webhooks with a timeout, retries with backoff, and counts every outcome.

    Every outcome (a `WebhookOutcome`) is passed to `on_outcome`.

    `max_queued` bounds every outstanding delivery (queued, in flight, or waiting out a
    backoff), so a dead receiver cannot grow memory without limit through pending retries.
    """

    def __init__(
        self,
        *,
        secret: bytes | None,
        timeout: float = 5.0,
        attempts: int = 4,
        backoff: float = 0.5,
        backoff_cap: float = 15.0,
        allow_hosts: frozenset[str] | None = None,
        max_queued: int = 10000,
        concurrency: int = 8,
        on_outcome: OutcomeHook | None = None,
        logger: logging.Logger | None = None,
    ) -> None:
        if attempts < 1 or concurrency < 1 or max_queued < 1:
            raise ValueError("attempts, concurrency and max_queued must be at least 1")
        if timeout <= 0 or backoff < 0 or backoff_cap < 0:
            raise ValueError("timeout must be positive and backoffs non-negative")
        self._secret = secret
        self._timeout = timeout
        self._attempts = attempts
        self._backoff = backoff
        self._backoff_cap = backoff_cap
        self._allow_hosts = (
            None if allow_hosts is None else frozenset(h.lower() for h in allow_hosts)
        )
        self._concurrency = concurrency
        self._on_outcome = on_outcome
        self._log = logger or logging.getLogger(__name__)
        self._rng = random.Random()
        self._max_queued = max_queued
        self._queue: asyncio.Queue[_Delivery] = asyncio.Queue(maxsize=max_queued)
        self._live: set[_Delivery] = set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._session: aiohttp.ClientSession | None = None
        self._consumers: list[asyncio.Task[None]] = []
        self._closing = False

    async def start(self) -> None:
        """Open the HTTP session and start the consumer tasks."""
        if self._session is not None or self._closing:
            raise RuntimeError("WebhookSender can be started once, before close()")
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=self._concurrency),
            timeout=aiohttp.ClientTimeout(total=self._timeout),
        )
        self._consumers = [
            asyncio.create_task(self._consume(), name=f"webhook-consumer-{i}")
            for i in range(self._concurrency)
        ]

    def submit(self, url: str, body: bytes, *, job_id: str = "") -> None:
        """Queue one delivery of `body` to `url`; never blocks (drops when the queue is full)."""
        try:
            target = URL(url)
            log_url = _redacted(target)
        except (ValueError, TypeError):
            self._refuse(url, job_id, WebhookOutcome.REJECTED, "unparseable URL")
            return
        reason = self._unacceptable(target)
        if reason is not None:
            self._refuse(log_url, job_id, WebhookOutcome.REJECTED, reason)
            return
        if self._closing:
            self._refuse(log_url, job_id, WebhookOutcome.DROPPED, "webhook sender is closed")
            return
        if len(self._live) >= self._max_queued:
            self._refuse(log_url, job_id, WebhookOutcome.DROPPED, "webhook queue is full")
            return
        delivery = _Delivery(url, body, self._headers(body, job_id), job_id, log_url)
        # Cannot overflow: the queue only ever holds deliveries counted in `_live`.
        self._queue.put_nowait(delivery)
        self._live.add(delivery)
        self._idle.clear()

    async def close(self, drain_timeout: float = 5.0) -> None:
        """Stop accepting, let pending deliveries (and due retries) finish for up to
        `drain_timeout` seconds, then abandon the rest as dropped and close the session."""
        if self._closing:
            return
        self._closing = True
        if self._consumers and self._live:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), drain_timeout)
        for task in self._consumers:
            task.cancel()
        await asyncio.gather(*self._consumers, return_exceptions=True)
        self._consumers = []
        for delivery in list(self._live):
            if delivery.timer is not None:
                delivery.timer.cancel()
            self._log.warning(
                "webhook abandoned at shutdown",
                extra=self._fields(delivery, "sender closed before delivery finished"),
            )
            self._finish(delivery, WebhookOutcome.DROPPED)
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _unacceptable(self, target: URL) -> str | None:
        """Why `target` may not receive webhooks, or None if it may."""
        if target.scheme not in ("http", "https") or not target.host:
            return "URL must be absolute http(s)"
        if self._allow_hosts is not None and target.host.lower() not in self._allow_hosts:
            return f"host {target.host!r} is not in the webhook allow-list"
        return None

    def _headers(self, body: bytes, job_id: str) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "User-Agent": USER_AGENT}
        if job_id:
            headers[JOB_ID_HEADER] = job_id
        if self._secret is not None:
            headers[SIGNATURE_HEADER] = sign(self._secret, body)
        return headers

    async def _consume(self) -> None:
        """One consumer: deliver queued attempts one at a time, forever."""
        while True:
            delivery = await self._queue.get()
            try:
                await self._attempt(delivery)
            except Exception:
                # A bug here must not silently shrink the consumer pool.
                self._log.exception(
                    "webhook delivery crashed", extra=self._fields(delivery, "internal error")
                )
                self._finish(delivery, WebhookOutcome.FAILED)
            finally:
                self._queue.task_done()

    async def _attempt(self, delivery: _Delivery) -> None:
        """Make one attempt; on failure schedule the next or give up."""
        delivery.attempt += 1
        reason = await self._post(delivery)
        if reason is None:
            self._finish(delivery, WebhookOutcome.DELIVERED)
        elif delivery.attempt >= self._attempts:
            self._log.error("webhook delivery gave up", extra=self._fields(delivery, reason))
            self._finish(delivery, WebhookOutcome.FAILED)
        else:
            self._log.warning("webhook delivery failed", extra=self._fields(delivery, reason))
            delay = backoff(delivery.attempt, self._backoff, self._backoff_cap, self._rng)
            loop = asyncio.get_running_loop()
            delivery.timer = loop.call_later(delay, self._requeue, delivery)
            self._count(WebhookOutcome.RETRIED)

    async def _post(self, delivery: _Delivery) -> str | None:
        """POST once; None on a 2xx, otherwise why it failed."""
        assert self._session is not None
        try:
            async with self._session.post(
                delivery.url,
                data=delivery.body,
                headers=delivery.headers,
                # A redirect could lead outside the allow-list; a receiver must answer itself.
                allow_redirects=False,
            ) as response:
                if 200 <= response.status < 300:
                    return None
                return f"HTTP {response.status}"
        except TimeoutError:
            return f"timed out after {self._timeout:g}s"
        except aiohttp.ClientError as exc:
            return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__

    def _requeue(self, delivery: _Delivery) -> None:
        """Timer callback: put a delivery whose backoff has elapsed back in the queue."""
        delivery.timer = None
        if delivery in self._live:
            self._queue.put_nowait(delivery)

    def _finish(self, delivery: _Delivery, outcome: WebhookOutcome) -> None:
        self._live.discard(delivery)
        if not self._live:
            self._idle.set()
        self._count(outcome)

    def _refuse(self, log_url: str, job_id: str, outcome: WebhookOutcome, reason: str) -> None:
        self._log.warning(
            f"webhook {outcome}",
            extra={"url": log_url, "job_id": job_id, "attempt": 0, "reason": reason},
        )
        self._count(outcome)

    def _count(self, outcome: WebhookOutcome) -> None:
        if self._on_outcome is None:
            return
        try:
            self._on_outcome(outcome)
        except Exception:
            self._log.exception("webhook on_outcome hook raised", extra={"outcome": outcome})

    @staticmethod
    def _fields(delivery: _Delivery, reason: str) -> dict[str, object]:
        return {
            "url": delivery.log_url,
            "job_id": delivery.job_id,
            "attempt": delivery.attempt,
            "reason": reason,
        }


def _redacted(url: URL) -> str:
    """`url` fit for logs: credentials and query string (often tokens) removed."""
    return str(url.with_user(None).with_query(None).with_fragment(None))
