"""The webhook outbox claims a retry it recorded when the retry falls due, not at its next
poll: with a poll far longer than the backoff, the second attempt still comes on time."""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import pytest
from goqueue.supervisor.common.deliveries import Due
from goqueue.supervisor.webhooks.delivery import Answer, RetrySchedule
from goqueue.supervisor.webhooks.outbox import Outbox

pytestmark = pytest.mark.timeout(10)

BASE = 0.1  # the first retry's backoff, jittered to 0.075 .. 0.125 s
POLL = 30.0  # never reached by the test: only a wake-up can claim the retry


class Rows:
    """One delivery in memory: due at `next_at` (monotonic), leased when claimed."""

    def __init__(self) -> None:
        self.next_at: float | None = time.monotonic()
        self.attempts = 0

    async def claim(self, limit: int, lease_seconds: float) -> list[Due]:
        if self.next_at is None or self.next_at > time.monotonic():
            return []
        self.next_at = None  # leased
        due = Due(
            id="d1", job_id="j1", event="job.done", url="http://h/", body=b"{}",
            attempts=self.attempts, token="t",
        )  # fmt: skip
        return [due]

    async def record(
        self, due: Due, answer: Answer, *, delay: float, max_age: float, final: bool = False
    ) -> bool | None:
        self.attempts += 1
        if not answer.delivered:
            self.next_at = time.monotonic() + delay
        return False

    async def of_job(self, job_id: str) -> list[Any]:
        return []


class Poster:
    """503 first, then 200; remembers when each attempt was made."""

    timeout = 1.0
    concurrency = 4

    def __init__(self) -> None:
        self.at: list[float] = []

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def post(self, url: str, body: bytes, headers: dict[str, str]) -> Answer:
        self.at.append(time.monotonic())
        return Answer(status_code=503 if len(self.at) == 1 else 200)


async def test_a_recorded_retry_is_claimed_when_due_not_at_the_next_poll() -> None:
    rows, poster = Rows(), Poster()
    outbox = Outbox(
        rows,  # type: ignore[arg-type]
        poster,  # type: ignore[arg-type]
        secret=None,
        schedule=RetrySchedule(base=BASE),
        poll=POLL,
        rng=random.Random(7),
    )
    await outbox.start()
    try:
        async with asyncio.timeout(5):
            while len(poster.at) < 2:
                await asyncio.sleep(0.01)
    finally:
        await outbox.close(1.0)
    gap = poster.at[1] - poster.at[0]
    assert BASE * 0.75 <= gap <= BASE * 1.25 + 0.1, gap
