"""Per-type stats: the percentile both stores agree on, and the failure rate."""

from __future__ import annotations

import pytest
from goqueue.supervisor.common.summaries import percentile, type_stats


def test_percentile_interpolates_as_percentile_cont() -> None:
    assert percentile([], 0.5) is None
    assert percentile([4.0], 0.95) == 4.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == pytest.approx(2.5)
    assert percentile([float(n) for n in range(1, 101)], 0.95) == pytest.approx(95.05)


def test_type_stats_list_every_status_and_rate_only_finished_jobs() -> None:
    (stats,) = type_stats({"email": {"done": 3, "failed": 1, "pending": 5}}, {"email": (0.2, 0.9)})
    assert stats.counts["cancelled"] == 0 and stats.counts["pending"] == 5
    assert stats.failure_rate == pytest.approx(0.25)
    assert (stats.p50_seconds, stats.p95_seconds) == (0.2, 0.9)
