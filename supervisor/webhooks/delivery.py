"""Webhooks: how every delivery is made, whichever store keeps it.

A job reaching a terminal status (done, failed, cancelled) with a `webhook_url` gets one
delivery: its body (the job as the API shows it, encoded once), its event, a stable id.
Two implementations of `Webhooks` deliver them: `sender.WebhookSender`, best effort in
this process (the in-memory store), and `outbox.Outbox`, at least once from a table
(PostgreSQL's or SQLite's) written in the terminal status's own transaction. Both use
what is here: the request's headers and signature, one retry schedule and the `Poster`
that makes one attempt under the egress policy. The records, and the view
`GET /jobs/{id}/deliveries` shows, are in `common/deliveries.py`.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import aiohttp
from aiohttp.abc import AbstractResolver
from goqueue.supervisor.common.backoff import backoff
from goqueue.supervisor.common.deliveries import Answer, Delivery
from goqueue.supervisor.common.enums import WebhookOutcome
from goqueue.supervisor.common.jobs import Job
from goqueue.supervisor.webhooks.egress import EgressPolicy, EgressRefused, GuardedResolver

DELIVERY_HEADER = "X-GoQueue-Delivery"
EVENT_HEADER = "X-GoQueue-Event"
JOB_ID_HEADER = "X-GoQueue-Job-Id"
SIGNATURE_HEADER = "X-GoQueue-Signature"
USER_AGENT = "goqueue-webhook"


OutcomeHook = Callable[[WebhookOutcome], None]  # told every delivery's outcome (metrics)


def tell(hook: OutcomeHook | None, outcome: WebhookOutcome, log: logging.Logger) -> None:
    """Tell `hook` (if any) of an outcome; a hook that raises is logged, never the
    delivery's failure."""
    if hook is None:
        return
    try:
        hook(outcome)
    except Exception:
        log.exception("webhook on_outcome hook raised", extra={"outcome": outcome})


def sign(secret: bytes, body: bytes) -> str:
    """The `X-GoQueue-Signature` value: `sha256=` + lowercase hex HMAC-SHA256 of the body."""
    return "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()


def headers(
    delivery_id: str, event: str, job_id: str, body: bytes, secret: bytes | None
) -> dict[str, str]:
    """The headers of every attempt of one delivery (the same on each retry)."""
    out = {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        DELIVERY_HEADER: delivery_id,
        EVENT_HEADER: event,
        JOB_ID_HEADER: job_id,
    }
    if secret is not None:
        out[SIGNATURE_HEADER] = sign(secret, body)
    return out


# -- the view ------------------------------------------------------------------------


class Webhooks(Protocol):
    """What the node asks of its webhook deliveries (see the module)."""

    async def start(self) -> None:
        """Start delivering (the store is open)."""

    def notify(self, job: Job) -> None:
        """`job` was just recorded in a terminal status: deliver its webhook, if any."""

    async def deliveries(self, job_id: str) -> list[Delivery]:
        """A job's deliveries, oldest first (empty when it has none)."""

    async def close(self, grace: float) -> None:
        """Stop; attempts in flight get up to `grace` seconds to finish."""


# -- when to retry -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RetrySchedule:
    """When a failed delivery is tried again: `backoff(attempt, base, cap)` after each
    failure, until the next attempt would come more than `max_age` seconds after the
    job's terminal status (a day: 2 s, 4 s, ... then hourly, about 35 attempts)."""

    base: float = 2.0
    cap: float = 3600.0
    max_age: float = 86400.0

    def delay(self, attempt: int, rng: random.Random) -> float:
        """Seconds between failed attempt number `attempt` (from 1) and the next."""
        return backoff(attempt, self.base, self.cap, rng)

    def gives_up(self, age_at_next: float) -> bool:
        """True when an attempt `age_at_next` seconds after the terminal status is too late."""
        return age_at_next > self.max_age


# -- one attempt ---------------------------------------------------------------------


class Poster:
    """Makes attempts: one POST each, with a timeout, no redirects, no proxy from the
    environment, and only to destinations the egress policy allows (IP literals checked
    here, names on every resolution by `GuardedResolver`)."""

    def __init__(
        self,
        policy: EgressPolicy,
        *,
        timeout: float,
        concurrency: int,
        resolver: AbstractResolver | None = None,
    ) -> None:
        if timeout <= 0 or concurrency < 1:
            raise ValueError("timeout must be positive and concurrency at least 1")
        self.policy = policy
        self.timeout = timeout
        self.concurrency = concurrency
        self._resolver = resolver  # what names resolve with (aiohttp's default if None)
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        """Open the HTTP session."""
        if self._session is None:
            connector = aiohttp.TCPConnector(
                limit=self.concurrency, resolver=GuardedResolver(self.policy, self._resolver)
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=aiohttp.ClientTimeout(total=self.timeout),
                trust_env=False,  # an HTTP_PROXY must not carry webhooks around the policy
            )

    async def close(self) -> None:
        """Close the HTTP session."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def post(self, url: str, body: bytes, request_headers: dict[str, str]) -> Answer:
        """One attempt; never raises for what the network or the receiver does."""
        # IP literals are judged here: aiohttp connects to them without asking a resolver.
        refusal = self.policy.url_refusal(url)
        if refusal is not None:
            return Answer(error=f"refused: webhook_url {refusal}", refused=True)
        assert self._session is not None, "Poster.start() first"
        try:
            async with self._session.post(
                url, data=body, headers=request_headers, allow_redirects=False
            ) as response:
                status = response.status
        except TimeoutError:
            return Answer(error=f"timed out after {self.timeout:g}s")
        except aiohttp.ClientConnectorError as exc:
            if isinstance(exc.os_error, EgressRefused):
                return Answer(error=f"refused: {exc.os_error}", refused=True)
            return Answer(error=_describe(exc))
        except (aiohttp.ClientError, ValueError) as exc:
            return Answer(error=_describe(exc))
        if 200 <= status < 300:
            return Answer(status)
        note = " (redirects are not followed)" if 300 <= status < 400 else ""
        return Answer(status, f"HTTP {status}{note}")


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
