"""Backoff: base * 2^(attempt-1), capped, jittered within ±25 %; one formula for every
retry (jobs, webhooks, reconnect loops)."""

import random

import pytest
from goqueue.supervisor.common.backoff import Backoff, backoff

pytestmark = pytest.mark.timeout(10)


@pytest.mark.parametrize(("attempt", "nominal"), [(1, 1.0), (2, 2.0), (3, 4.0), (10, 512.0)])
def test_backoff_doubles_within_jitter(attempt: int, nominal: float) -> None:
    rng = random.Random(7)
    delays = [backoff(attempt, 1.0, 3600.0, rng) for _ in range(500)]
    assert min(delays) >= nominal * 0.75 and max(delays) <= nominal * 1.25
    assert max(delays) - min(delays) > nominal * 0.3  # it really is jittered


def test_backoff_is_capped() -> None:
    rng = random.Random(7)
    assert all(backoff(30, 1.0, 60.0, rng) <= 75.0 for _ in range(100))
    assert all(backoff(10_000, 0.5, 15.0, rng) <= 18.75 for _ in range(100))  # no overflow


def test_a_loop_backs_off_then_starts_over_after_a_success() -> None:
    delays = Backoff(0.2, 5.0, random.Random(7))
    first = [delays.next() for _ in range(7)]
    nominal = [0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0]
    assert all(0.75 * n <= d <= 1.25 * n for d, n in zip(first, nominal, strict=True))
    delays.reset()
    assert 0.15 <= delays.next() <= 0.25
