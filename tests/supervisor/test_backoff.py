"""Retry backoff: base * 2^(attempt-1), capped, jittered within ±25 %."""

import random

import pytest
from goqueue.supervisor.dispatch import backoff

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
