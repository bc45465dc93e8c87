"""Webhook deliveries in process (`WebhookSender`, the in-memory store's) and the
`Poster` both stores use, against real aiohttp receivers on 127.0.0.1 (no mocks).

pytest-asyncio is not a dependency, so each test is sync and drives its scenario with
`asyncio.run`; the receivers and the sender share that one loop. Receivers listen on
loopback, so every sender here is given a policy that allows 127.0.0.1; the tests of
refusals check that nothing reached a receiver.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import inspect
import logging
import random
import socket
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from aiohttp import web
from aiohttp.abc import AbstractResolver, ResolveResult
from goqueue.supervisor.common.deliveries import Delivery
from goqueue.supervisor.common.enums import WebhookEvent
from goqueue.supervisor.webhooks.delivery import Poster, RetrySchedule, sign
from goqueue.supervisor.webhooks.egress import EgressPolicy
from goqueue.supervisor.webhooks.sender import WebhookSender
from multidict import CIMultiDict

LOGGER = "goqueue.supervisor.webhooks.sender"
BODY = b'{"id":"6f1c2a9e-0000-4000-8000-000000000001","status":"done","result":{"ok":true}}'
JOB_ID = "6f1c2a9e-0000-4000-8000-000000000001"
LOOPBACK = EgressPolicy.of(["127.0.0.1"], None)
FAST = RetrySchedule(base=0.01, cap=0.05, max_age=60.0)


class Changes:
    """Lets a test wait, with a deadline, for a condition that callbacks make true."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def notify(self) -> None:
        self._event.set()

    async def wait_until(
        self, predicate: Callable[[], bool], what: str, timeout: float = 5.0
    ) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not predicate():
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise AssertionError(f"timed out after {timeout}s waiting for {what}")
            self._event.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._event.wait(), remaining)


@dataclass
class Hit:
    """One request as the receiver saw it: raw body bytes, headers, arrival time."""

    body: bytes
    headers: CIMultiDict[str]
    at: float


class Receiver:
    """A real webhook receiver: answers `statuses` in turn (the last one repeats), or with
    `hang=True` holds every request until `release` is set; `location` is sent along."""

    def __init__(
        self, statuses: Sequence[int] = (200,), *, hang: bool = False, location: str = ""
    ) -> None:
        self.statuses = list(statuses)
        self.hang = hang
        self.location = location
        self.hits: list[Hit] = []
        self.changed = Changes()
        self.release = asyncio.Event()
        self.url = ""
        self.port = 0
        self._runner: web.AppRunner | None = None

    async def __aenter__(self) -> Receiver:
        app = web.Application()
        app.router.add_post("/hook", self._handle)
        self._runner = web.AppRunner(app, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{self.port}/hook"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.release.set()
        assert self._runner is not None
        await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        index = len(self.hits)
        self.hits.append(Hit(body, request.headers.copy(), asyncio.get_running_loop().time()))
        self.changed.notify()
        if self.hang:
            await self.release.wait()
        status = self.statuses[min(index, len(self.statuses) - 1)]
        headers = {"Location": self.location} if self.location else None
        return web.Response(status=status, headers=headers)

    async def wait_for_hits(self, count: int, timeout: float = 5.0) -> None:
        await self.changed.wait_until(
            lambda: len(self.hits) >= count, f"{count} request(s) at {self.url}", timeout
        )


class Outcomes:
    """The `on_outcome` hook: records outcomes in order."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.changed = Changes()

    def __call__(self, outcome: str) -> None:
        self.seen.append(outcome)
        self.changed.notify()

    async def wait_for(self, outcome: str, count: int = 1, timeout: float = 5.0) -> None:
        await self.changed.wait_until(
            lambda: self.seen.count(outcome) >= count, f"{count} x {outcome!r}", timeout
        )


class LoopbackNames(AbstractResolver):
    """Resolves a few made-up names to 127.0.0.1 (a rebinding DNS would do the same)."""

    def __init__(self, *names: str) -> None:
        self.names = set(names)

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        if host not in self.names:
            raise OSError(f"{host} is not a test name")
        return [
            ResolveResult(
                hostname=host, host="127.0.0.1", port=port, family=socket.AF_INET, proto=0, flags=0
            )
        ]

    async def close(self) -> None:
        pass


@contextlib.asynccontextmanager
async def running_sender(
    outcomes: Outcomes,
    *,
    policy: EgressPolicy = LOOPBACK,
    timeout: float = 1.0,
    concurrency: int = 8,
    resolver: AbstractResolver | None = None,
    **options: Any,
) -> AsyncIterator[WebhookSender]:
    """A started sender with test-sized timings; closed (without draining) on exit."""
    poster = Poster(policy, timeout=timeout, concurrency=concurrency, resolver=resolver)
    settings: dict[str, Any] = {"secret": None, "node_id": "node-t", "schedule": FAST, **options}
    sender = WebhookSender(poster, on_outcome=outcomes, **settings)
    await sender.start()
    try:
        yield sender
    finally:
        await sender.close(0)


def submit(sender: WebhookSender, url: str, job_id: str = JOB_ID, body: bytes = BODY) -> None:
    sender.submit(url, body, job_id=job_id, event=WebhookEvent.DONE)


async def only_delivery(sender: WebhookSender, job_id: str = JOB_ID) -> Delivery:
    [delivery] = await sender.deliveries(job_id)
    return delivery


def dead_url() -> str:
    """A loopback URL nobody listens on: a port bound once, then closed."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/hook"


def webhook_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == LOGGER]


@pytest.mark.timeout(30)
def test_sign_matches_rfc4231_vector() -> None:
    # RFC 4231 test case 2 (HMAC-SHA256, key "Jefe").
    expected = "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
    assert sign(b"Jefe", b"what do ya want for nothing?") == f"sha256={expected}"


@pytest.mark.timeout(30)
def test_delivery_headers_and_signature_over_the_raw_body() -> None:
    secret = b"s3cr3t-\x00-bytes"

    async def scenario() -> None:
        outcomes = Outcomes()
        async with Receiver() as receiver, running_sender(outcomes, secret=secret) as sender:
            sender.submit(receiver.url, BODY, job_id=JOB_ID, event=WebhookEvent.CANCELLED)
            await outcomes.wait_for("delivered")
            delivery = await only_delivery(sender)
        [hit] = receiver.hits
        digest = hmac.new(secret, hit.body, hashlib.sha256).hexdigest()
        assert hit.body == BODY
        assert hit.headers["X-GoQueue-Signature"] == f"sha256={digest}"
        assert hit.headers["Content-Type"] == "application/json"
        assert hit.headers["User-Agent"] == "goqueue-webhook"
        assert hit.headers["X-GoQueue-Job-Id"] == JOB_ID
        assert hit.headers["X-GoQueue-Event"] == "job.cancelled"
        assert hit.headers["X-GoQueue-Delivery"] == delivery.id
        assert outcomes.seen == ["delivered"]
        assert delivery.event == "job.cancelled" and delivery.url == receiver.url
        [attempt] = delivery.attempts
        assert (attempt.status_code, attempt.error, attempt.node) == (200, None, "node-t")
        assert delivery.delivered_at == attempt.at
        assert delivery.next_attempt_at is None and not delivery.given_up

    asyncio.run(scenario())


@pytest.mark.timeout(30)
def test_no_secret_means_no_signature_header() -> None:
    async def scenario() -> None:
        outcomes = Outcomes()
        async with Receiver() as receiver, running_sender(outcomes) as sender:
            submit(sender, receiver.url)
            await outcomes.wait_for("delivered")
        [hit] = receiver.hits
        assert "X-GoQueue-Signature" not in hit.headers
        assert hit.body == BODY

    asyncio.run(scenario())


@pytest.mark.timeout(30)
def test_server_errors_are_retried_with_the_same_delivery_id(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)

    async def scenario() -> tuple[Receiver, Delivery]:
        outcomes = Outcomes()
        async with Receiver(statuses=[500, 503, 200]) as receiver, running_sender(outcomes) as s:
            submit(s, receiver.url)
            await outcomes.wait_for("delivered")
            delivery = await only_delivery(s)
        assert outcomes.seen == ["retried", "retried", "delivered"]
        return receiver, delivery

    receiver, delivery = asyncio.run(scenario())
    assert len(receiver.hits) == 3
    assert all(hit.body == BODY for hit in receiver.hits)
    assert {hit.headers["X-GoQueue-Delivery"] for hit in receiver.hits} == {delivery.id}
    assert [(a.status_code, a.error) for a in delivery.attempts] == [
        (500, "HTTP 500"),
        (503, "HTTP 503"),
        (200, None),
    ]
    failures = webhook_records(caplog)
    assert [(r.levelno, r.attempt, r.reason) for r in failures] == [  # type: ignore[attr-defined]
        (logging.WARNING, 1, "HTTP 500"),
        (logging.WARNING, 2, "HTTP 503"),
    ]
    assert all(r.job_id == JOB_ID and r.url == receiver.url for r in failures)  # type: ignore[attr-defined]


@pytest.mark.timeout(30)
def test_a_hanging_receiver_times_out_and_is_given_up_past_the_max_age(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)

    async def scenario() -> None:
        outcomes = Outcomes()
        short = RetrySchedule(base=0.01, cap=0.01, max_age=0.5)
        async with (
            Receiver(hang=True) as receiver,
            running_sender(outcomes, timeout=0.3, schedule=short) as sender,
        ):
            submit(sender, receiver.url)
            await outcomes.wait_for("failed")
            assert len(receiver.hits) == 2  # the second attempt ends past 0.5 s
            delivery = await only_delivery(sender)
        assert outcomes.seen == ["retried", "failed"]
        assert delivery.given_up and delivery.next_attempt_at is None
        assert [a.status_code for a in delivery.attempts] == [None, None]
        assert all("timed out after 0.3s" in (a.error or "") for a in delivery.attempts)

    asyncio.run(scenario())
    warning, error = webhook_records(caplog)
    assert (warning.levelno, warning.attempt) == (logging.WARNING, 1)  # type: ignore[attr-defined]
    assert (error.levelno, error.attempt) == (logging.ERROR, 2)  # type: ignore[attr-defined]
    assert "timed out" in error.reason  # type: ignore[attr-defined]


@pytest.mark.timeout(30)
def test_a_dead_port_is_an_attempt_without_a_status_code() -> None:
    async def scenario() -> None:
        outcomes = Outcomes()
        async with running_sender(outcomes) as sender:
            submit(sender, dead_url())
            await outcomes.wait_for("retried", count=2)
            delivery = await only_delivery(sender)
        first = delivery.attempts[0]
        assert first.status_code is None and "ClientConnectorError" in (first.error or "")
        assert not delivery.given_up

    asyncio.run(scenario())


@pytest.mark.timeout(30)
def test_redirects_are_not_followed() -> None:
    async def scenario() -> None:
        outcomes = Outcomes()
        async with (
            Receiver() as target,
            Receiver(statuses=[302], location="") as redirecting,
            running_sender(outcomes) as sender,
        ):
            redirecting.location = target.url
            submit(sender, redirecting.url)
            await outcomes.wait_for("retried")
            delivery = await only_delivery(sender)
            assert target.hits == []
        assert delivery.attempts[0].status_code == 302
        assert delivery.attempts[0].error == "HTTP 302 (redirects are not followed)"

    asyncio.run(scenario())


@pytest.mark.timeout(30)
def test_a_name_resolving_to_loopback_is_refused_when_connecting() -> None:
    async def scenario() -> None:
        outcomes = Outcomes()
        names = LoopbackNames("rebound.test")
        async with (
            Receiver() as receiver,
            running_sender(outcomes, policy=EgressPolicy(), resolver=names) as sender,
        ):
            url = f"http://rebound.test:{receiver.port}/hook"
            assert EgressPolicy().url_refusal(url) is None  # nothing to see at enqueue
            submit(sender, url)
            await outcomes.wait_for("refused")
            delivery = await only_delivery(sender)
            assert receiver.hits == []  # refused before connecting: nothing was sent
        assert outcomes.seen == ["refused"]  # and not retried
        [attempt] = delivery.attempts
        assert attempt.status_code is None
        assert attempt.error is not None and attempt.error.startswith("refused: rebound.test")
        assert "127.0.0.1 (a loopback address)" in attempt.error
        assert delivery.given_up

    asyncio.run(scenario())


@pytest.mark.timeout(30)
def test_an_allowed_network_opens_what_a_name_resolves_to() -> None:
    async def scenario() -> None:
        outcomes = Outcomes()
        names = LoopbackNames("receiver.test")
        policy = EgressPolicy.of(None, ["127.0.0.0/8"])
        async with (
            Receiver() as receiver,
            running_sender(outcomes, policy=policy, resolver=names) as sender,
        ):
            submit(sender, f"http://receiver.test:{receiver.port}/hook")
            await outcomes.wait_for("delivered")
        [hit] = receiver.hits
        assert hit.headers["Host"] == f"receiver.test:{receiver.port}"

    asyncio.run(scenario())


@pytest.mark.timeout(30)
def test_a_refused_ip_literal_sends_nothing() -> None:
    async def scenario() -> None:
        outcomes = Outcomes()
        async with (
            Receiver() as receiver,
            running_sender(outcomes, policy=EgressPolicy()) as sender,
        ):
            submit(sender, receiver.url)
            submit(sender, f"http://[::ffff:127.0.0.1]:{receiver.port}/hook", job_id="mapped")
            await outcomes.wait_for("refused", count=2)
            delivery = await only_delivery(sender)
            assert receiver.hits == []
        assert delivery.attempts[0].error == (
            "refused: webhook_url must not point at 127.0.0.1 (a loopback address)"
        )

    asyncio.run(scenario())


@pytest.mark.timeout(30)
def test_a_hanging_receiver_does_not_delay_a_healthy_one() -> None:
    slow_timeout = 5.0

    async def scenario() -> None:
        outcomes = Outcomes()
        async with (
            Receiver(hang=True) as slow,
            Receiver() as healthy,
            running_sender(outcomes, timeout=slow_timeout, concurrency=2) as sender,
        ):
            submit(sender, slow.url, job_id="slow")
            await slow.wait_for_hits(1)
            submitted = asyncio.get_running_loop().time()
            submit(sender, healthy.url, job_id="healthy")
            await healthy.wait_for_hits(1)
            waited = healthy.hits[0].at - submitted
            assert waited < slow_timeout / 5, f"healthy delivery took {waited:.2f}s"
            await outcomes.wait_for("delivered")
            assert outcomes.seen == ["delivered"], "the slow delivery must still be in flight"

    asyncio.run(scenario())


@pytest.mark.timeout(30)
def test_waiting_for_a_retry_holds_no_consumer() -> None:
    async def scenario() -> None:
        outcomes = Outcomes()
        slow_retry = RetrySchedule(base=10.0, cap=10.0, max_age=60.0)
        async with (
            Receiver() as healthy,
            running_sender(outcomes, concurrency=1, schedule=slow_retry) as sender,
        ):
            submit(sender, dead_url(), job_id="dead")
            await outcomes.wait_for("retried")
            submitted = asyncio.get_running_loop().time()
            submit(sender, healthy.url, job_id="healthy")
            await healthy.wait_for_hits(1)
            waited = healthy.hits[0].at - submitted
            # The only consumer is free while the dead URL waits out its >= 7.5 s backoff.
            assert waited < 1.0, f"healthy delivery took {waited:.2f}s"
            [dead] = await sender.deliveries("dead")
            assert dead.next_attempt_at is not None and not dead.given_up
        assert outcomes.seen == ["retried", "delivered", "dropped"]

    asyncio.run(scenario())


@pytest.mark.timeout(30)
def test_submit_never_waits_and_a_full_queue_drops(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    assert not inspect.iscoroutinefunction(WebhookSender.submit)
    assert not inspect.iscoroutinefunction(WebhookSender.notify)

    async def scenario() -> None:
        outcomes = Outcomes()
        async with (
            Receiver(hang=True) as receiver,
            running_sender(outcomes, concurrency=1, max_queued=3, timeout=10.0) as sender,
        ):
            submit(sender, receiver.url, job_id="in-flight")
            await receiver.wait_for_hits(1)  # the only consumer is busy: 1 of 3 slots used
            started = time.perf_counter()
            for i in range(3):
                submit(sender, receiver.url, job_id=f"q{i}")
            elapsed = time.perf_counter() - started
            assert elapsed < 0.05, f"three submits took {elapsed:.3f}s"
            assert outcomes.seen == ["dropped"]
            dropped = await only_delivery(sender, "q2")
            assert dropped.given_up and dropped.attempts == []
            receiver.release.set()
            await outcomes.wait_for("delivered", count=3)
            assert [hit.headers["X-GoQueue-Job-Id"] for hit in receiver.hits] == [
                "in-flight",
                "q0",
                "q1",
            ]

    asyncio.run(scenario())
    [dropped] = webhook_records(caplog)
    assert dropped.levelno == logging.WARNING
    assert dropped.job_id == "q2"  # type: ignore[attr-defined]


@pytest.mark.timeout(30)
def test_deliveries_waiting_for_a_retry_count_against_the_bound() -> None:
    async def scenario() -> None:
        outcomes = Outcomes()
        slow_retry = RetrySchedule(base=10.0, cap=10.0, max_age=60.0)
        async with (
            Receiver() as receiver,
            running_sender(outcomes, max_queued=1, schedule=slow_retry) as sender,
        ):
            submit(sender, dead_url(), job_id="dead")
            await outcomes.wait_for("retried")
            submit(sender, receiver.url, job_id="over-the-bound")
            assert outcomes.seen == ["retried", "dropped"]
        assert receiver.hits == []

    asyncio.run(scenario())


@pytest.mark.timeout(30)
def test_close_drains_what_it_can_then_drops_the_rest() -> None:
    async def scenario() -> None:
        outcomes = Outcomes()
        async with Receiver() as healthy, Receiver(hang=True) as slow:
            poster = Poster(LOOPBACK, timeout=10.0, concurrency=8)
            sender = WebhookSender(poster, secret=None, node_id="n", on_outcome=outcomes)
            await sender.start()
            for i in range(5):
                submit(sender, healthy.url, job_id=f"h{i}")
            submit(sender, slow.url, job_id="slow")
            started = asyncio.get_running_loop().time()
            await sender.close(0.5)
            elapsed = asyncio.get_running_loop().time() - started
            assert 0.4 < elapsed < 3.0, f"close took {elapsed:.2f}s"
            assert len(healthy.hits) == 5
            assert sorted(outcomes.seen) == ["delivered"] * 5 + ["dropped"]
            submit(sender, healthy.url, job_id="late")
            assert outcomes.seen[-1] == "dropped"
            assert len(healthy.hits) == 5

    asyncio.run(scenario())


@pytest.mark.timeout(30)
def test_the_view_remembers_the_last_jobs_only() -> None:
    async def scenario() -> None:
        outcomes = Outcomes()
        async with running_sender(outcomes, max_remembered=2, max_queued=1) as sender:
            for job_id in ("a", "b", "c"):
                submit(sender, dead_url(), job_id=job_id)
            assert await sender.deliveries("a") == []
            assert len(await sender.deliveries("b")) == len(await sender.deliveries("c")) == 1

    asyncio.run(scenario())


def test_the_default_schedule_retries_within_seconds_hourly_at_most_for_about_a_day() -> None:
    schedule = RetrySchedule()
    rng = random.Random(7)
    assert schedule.delay(1, rng) <= 2.5  # the first retry within seconds
    assert max(schedule.delay(n, rng) for n in range(1, 60)) <= 3600 * 1.25
    for jitter in (0.75, 1.25):  # the extremes of the ±25 % jitter
        elapsed, attempts = 0.0, 1
        while not schedule.gives_up(elapsed + min(3600, 2 * 2 ** (attempts - 1)) * jitter):
            elapsed += min(3600, 2 * 2 ** (attempts - 1)) * jitter
            attempts += 1
        assert 20 * 3600 < elapsed <= 24 * 3600
        assert 25 <= attempts <= 45, attempts


def test_sender_options_have_safe_defaults() -> None:
    defaults = {n: p.default for n, p in inspect.signature(WebhookSender).parameters.items()}
    assert defaults["max_queued"] >= 1000
    assert defaults["schedule"] is None  # the shared RetrySchedule()


@pytest.mark.timeout(30)
def test_close_does_not_wait_for_a_retry_hours_away() -> None:
    async def scenario() -> None:
        outcomes = Outcomes()
        hours = RetrySchedule(base=3600.0, cap=3600.0, max_age=86400.0)
        poster = Poster(LOOPBACK, timeout=1.0, concurrency=2)
        sender = WebhookSender(
            poster, secret=None, node_id="n", schedule=hours, on_outcome=outcomes
        )
        await sender.start()
        submit(sender, dead_url())
        await outcomes.wait_for("retried")
        loop = asyncio.get_running_loop()
        started = loop.time()
        await sender.close(10.0)
        assert loop.time() - started < 1.0  # nothing in flight: no grace to spend
        assert outcomes.seen == ["retried", "dropped"]

    asyncio.run(scenario())
