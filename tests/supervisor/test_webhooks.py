"""WebhookSender against real aiohttp receivers on 127.0.0.1 (ephemeral ports, no mocks).

pytest-asyncio is not a dependency, so each test is sync and drives its scenario with
`asyncio.run`; the receivers and the sender share that one loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import inspect
import logging
import socket
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from aiohttp import web
from goqueue.supervisor.webhooks import WebhookSender, sign
from multidict import CIMultiDict

LOGGER = "goqueue.supervisor.webhooks"
BODY = b'{"id":"6f1c2a9e-0000-4000-8000-000000000001","status":"done","result":{"ok":true}}'
JOB_ID = "6f1c2a9e-0000-4000-8000-000000000001"


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
    `hang=True` holds every request until `release` is set."""

    def __init__(self, statuses: Sequence[int] = (200,), *, hang: bool = False) -> None:
        self.statuses = list(statuses)
        self.hang = hang
        self.hits: list[Hit] = []
        self.changed = Changes()
        self.release = asyncio.Event()
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def __aenter__(self) -> Receiver:
        app = web.Application()
        app.router.add_post("/hook", self._handle)
        self._runner = web.AppRunner(app, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}/hook"
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
        return web.Response(status=self.statuses[min(index, len(self.statuses) - 1)])

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


@contextlib.asynccontextmanager
async def running_sender(outcomes: Outcomes, **options: Any) -> AsyncIterator[WebhookSender]:
    """A started sender with test-sized timings; closed (without draining) on exit."""
    settings: dict[str, Any] = {
        "secret": None,
        "timeout": 1.0,
        "backoff": 0.01,
        "backoff_cap": 0.05,
        **options,
    }
    sender = WebhookSender(on_outcome=outcomes, **settings)
    await sender.start()
    try:
        yield sender
    finally:
        await sender.close(drain_timeout=0)


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
def test_delivery_is_signed_over_the_raw_body() -> None:
    secret = b"s3cr3t-\x00-bytes"

    async def scenario() -> None:
        outcomes = Outcomes()
        async with Receiver() as receiver, running_sender(outcomes, secret=secret) as sender:
            sender.submit(receiver.url, BODY, job_id=JOB_ID)
            await outcomes.wait_for("delivered")
        [hit] = receiver.hits
        digest = hmac.new(secret, hit.body, hashlib.sha256).hexdigest()
        assert hit.body == BODY
        assert hit.headers["X-GoQueue-Signature"] == f"sha256={digest}"
        assert hit.headers["Content-Type"] == "application/json"
        assert hit.headers["User-Agent"] == "goqueue-webhook"
        assert hit.headers["X-GoQueue-Job-Id"] == JOB_ID
        assert outcomes.seen == ["delivered"]

    asyncio.run(scenario())


@pytest.mark.timeout(30)
def test_no_secret_means_no_signature_header() -> None:
    async def scenario() -> None:
        outcomes = Outcomes()
        async with Receiver() as receiver, running_sender(outcomes) as sender:
            sender.submit(receiver.url, BODY, job_id=JOB_ID)
            await outcomes.wait_for("delivered")
        [hit] = receiver.hits
        assert "X-GoQueue-Signature" not in hit.headers
        assert hit.body == BODY

    asyncio.run(scenario())


@pytest.mark.timeout(30)
def test_server_errors_are_retried_until_a_2xx(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)

    async def scenario() -> Receiver:
        outcomes = Outcomes()
        async with (
            Receiver(statuses=[500, 500, 200]) as receiver,
            running_sender(outcomes, attempts=4) as sender,
        ):
            sender.submit(receiver.url, BODY, job_id=JOB_ID)
            await outcomes.wait_for("delivered")
        assert outcomes.seen == ["retried", "retried", "delivered"]
        return receiver

    receiver = asyncio.run(scenario())
    assert len(receiver.hits) == 3
    assert all(hit.body == BODY for hit in receiver.hits)
    failures = webhook_records(caplog)
    assert [(r.levelno, r.attempt, r.reason) for r in failures] == [  # type: ignore[attr-defined]
        (logging.WARNING, 1, "HTTP 500"),
        (logging.WARNING, 2, "HTTP 500"),
    ]
    assert all(r.job_id == JOB_ID and r.url == receiver.url for r in failures)  # type: ignore[attr-defined]


@pytest.mark.timeout(30)
def test_a_hanging_receiver_times_out_and_is_retried(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)

    async def scenario() -> None:
        outcomes = Outcomes()
        async with (
            Receiver(hang=True) as receiver,
            running_sender(outcomes, timeout=0.3, attempts=2) as sender,
        ):
            sender.submit(receiver.url, BODY, job_id=JOB_ID)
            await outcomes.wait_for("failed")
            assert len(receiver.hits) == 2
        assert outcomes.seen == ["retried", "failed"]

    asyncio.run(scenario())
    warning, error = webhook_records(caplog)
    assert (warning.levelno, warning.attempt) == (logging.WARNING, 1)  # type: ignore[attr-defined]
    assert (error.levelno, error.attempt) == (logging.ERROR, 2)  # type: ignore[attr-defined]
    assert "timed out" in error.reason  # type: ignore[attr-defined]
    assert error.job_id == JOB_ID  # type: ignore[attr-defined]


@pytest.mark.timeout(30)
def test_a_dead_port_fails_after_every_attempt(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)

    async def scenario() -> None:
        outcomes = Outcomes()
        async with running_sender(outcomes, attempts=3) as sender:
            sender.submit(dead_url(), BODY, job_id=JOB_ID)
            await outcomes.wait_for("failed")
        assert outcomes.seen == ["retried", "retried", "failed"]

    asyncio.run(scenario())
    records = webhook_records(caplog)
    assert [r.attempt for r in records] == [1, 2, 3]  # type: ignore[attr-defined]
    assert records[-1].levelno == logging.ERROR


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
            sender.submit(slow.url, BODY, job_id="slow")
            await slow.wait_for_hits(1)
            submitted = asyncio.get_running_loop().time()
            sender.submit(healthy.url, BODY, job_id="healthy")
            await healthy.wait_for_hits(1)
            waited = healthy.hits[0].at - submitted
            assert waited < slow_timeout / 5, f"healthy delivery took {waited:.2f}s"
            await outcomes.wait_for("delivered")
            assert outcomes.seen == ["delivered"], "the slow delivery must still be in flight"

    asyncio.run(scenario())


@pytest.mark.timeout(30)
def test_waiting_for_a_retry_holds_no_consumer() -> None:
    backoff = 10.0

    async def scenario() -> None:
        outcomes = Outcomes()
        async with (
            Receiver() as healthy,
            running_sender(
                outcomes, concurrency=1, attempts=2, backoff=backoff, backoff_cap=backoff
            ) as sender,
        ):
            sender.submit(dead_url(), BODY, job_id="dead")
            await outcomes.wait_for("retried")
            submitted = asyncio.get_running_loop().time()
            sender.submit(healthy.url, BODY, job_id="healthy")
            await healthy.wait_for_hits(1)
            waited = healthy.hits[0].at - submitted
            # The only consumer is free while the dead URL waits out its >= 7.5 s backoff.
            assert waited < 1.0, f"healthy delivery took {waited:.2f}s"
        assert outcomes.seen == ["retried", "delivered", "dropped"]

    asyncio.run(scenario())


@pytest.mark.timeout(30)
def test_submit_never_waits_and_a_full_queue_drops(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    assert not inspect.iscoroutinefunction(WebhookSender.submit)

    async def scenario() -> None:
        outcomes = Outcomes()
        async with (
            Receiver(hang=True) as receiver,
            running_sender(outcomes, concurrency=1, max_queued=3, timeout=10.0) as sender,
        ):
            sender.submit(receiver.url, BODY, job_id="in-flight")
            await receiver.wait_for_hits(1)  # the only consumer is busy: 1 of 3 slots used
            started = time.perf_counter()
            results = [sender.submit(receiver.url, BODY, job_id=f"q{i}") for i in range(3)]
            elapsed = time.perf_counter() - started
            assert results == [None, None, None]
            assert elapsed < 0.05, f"three submits took {elapsed:.3f}s"
            assert outcomes.seen == ["dropped"]
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
def test_allow_hosts_rejects_hosts_not_listed() -> None:
    async def scenario() -> None:
        outcomes = Outcomes()
        async with (
            Receiver() as receiver,
            running_sender(outcomes, allow_hosts=frozenset({"127.0.0.1"})) as sender,
        ):
            port = receiver.url.split(":")[2].split("/")[0]
            sender.submit(f"http://localhost:{port}/hook", BODY, job_id="other-host")
            sender.submit("ftp://127.0.0.1/hook", BODY, job_id="bad-scheme")
            assert outcomes.seen == ["rejected", "rejected"]
            sender.submit(receiver.url, BODY, job_id="listed")
            await outcomes.wait_for("delivered")
        assert [hit.headers["X-GoQueue-Job-Id"] for hit in receiver.hits] == ["listed"]

    asyncio.run(scenario())


@pytest.mark.timeout(30)
def test_close_drains_what_it_can_then_drops_the_rest() -> None:
    async def scenario() -> None:
        outcomes = Outcomes()
        async with Receiver() as healthy, Receiver(hang=True) as slow:
            sender = WebhookSender(secret=None, timeout=10.0, on_outcome=outcomes)
            await sender.start()
            for i in range(5):
                sender.submit(healthy.url, BODY, job_id=f"h{i}")
            sender.submit(slow.url, BODY, job_id="slow")
            started = asyncio.get_running_loop().time()
            await sender.close(drain_timeout=0.5)
            elapsed = asyncio.get_running_loop().time() - started
            assert 0.4 < elapsed < 3.0, f"close took {elapsed:.2f}s"
            assert len(healthy.hits) == 5
            assert sorted(outcomes.seen) == ["delivered"] * 5 + ["dropped"]
            sender.submit(healthy.url, BODY, job_id="late")
            assert outcomes.seen[-1] == "dropped"
            assert len(healthy.hits) == 5

    asyncio.run(scenario())


@pytest.mark.timeout(30)
def test_defaults_give_three_attempts_within_a_minute() -> None:
    defaults = {name: p.default for name, p in inspect.signature(WebhookSender).parameters.items()}
    assert defaults["attempts"] >= 3
    # Worst case: every attempt times out and every jitter lands high.
    worst = 3 * defaults["timeout"] + sum(
        1.25 * min(defaults["backoff_cap"], defaults["backoff"] * 2 ** (n - 1)) for n in (1, 2)
    )
    assert worst < 60.0


@pytest.mark.timeout(30)
def test_deliveries_waiting_for_a_retry_count_against_the_bound() -> None:
    async def scenario() -> None:
        outcomes = Outcomes()
        async with (
            Receiver() as receiver,
            running_sender(outcomes, max_queued=1, backoff=10.0, backoff_cap=10.0) as sender,
        ):
            sender.submit(dead_url(), BODY, job_id="dead")
            await outcomes.wait_for("retried")
            sender.submit(receiver.url, BODY, job_id="over-the-bound")
            assert outcomes.seen == ["retried", "dropped"]
        assert receiver.hits == []

    asyncio.run(scenario())
