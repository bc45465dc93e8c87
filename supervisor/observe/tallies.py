"""Counters and histograms kept as plain counts for the series that move on every request
or job, turned into Prometheus families only when scraped."""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from collections.abc import Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString


class Tally:
    """A labelled counter kept as plain counts, for series that move on every request or
    job: an update is one dict operation (no lock, no child lookup), and the Prometheus
    family is built only when scraped. Registered on a registry as a custom collector."""

    def __init__(self, name: str, documentation: str, labels: Sequence[str]) -> None:
        self.name = name
        self.documentation = documentation
        self.labels = list(labels)
        self.counts: defaultdict[tuple[str, ...], float] = defaultdict(float)

    def inc(self, key: tuple[str, ...], amount: float = 1) -> None:
        """Count `amount` for the label values `key`."""
        self.counts[key] += amount

    def declare(self, key: tuple[str, ...]) -> None:
        """Export the series for `key` at zero until it moves."""
        self.counts.setdefault(key, 0)

    def describe(self) -> list[Metric]:
        """The family, without samples (for the registry's name check)."""
        return [CounterMetricFamily(self.name, self.documentation, labels=self.labels)]

    def collect(self) -> Iterator[Metric]:
        """The family with one sample per label set seen."""
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labels)
        for key, count in list(self.counts.items()):
            family.add_metric([str(value) for value in key], count)
        yield family


class TallyHistogram:
    """A labelled histogram kept as plain counts per bucket (see `Tally`)."""

    def __init__(
        self, name: str, documentation: str, labels: Sequence[str], buckets: Sequence[float]
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labels = list(labels)
        self.bounds = tuple(buckets)
        self.buckets: dict[tuple[str, ...], list[int]] = {}  # one count per bound, then +Inf
        self.sums: dict[tuple[str, ...], float] = {}

    def observe(self, key: tuple[str, ...], value: float) -> None:
        """One observation for the label values `key`."""
        buckets = self.buckets.get(key)
        if buckets is None:
            buckets = self.declare(key)
        buckets[bisect_left(self.bounds, value)] += 1
        self.sums[key] += value

    def declare(self, key: tuple[str, ...]) -> list[int]:
        """Export the series for `key` at zero until it moves; its bucket counts."""
        if key not in self.buckets:
            self.buckets[key] = [0] * (len(self.bounds) + 1)
            self.sums[key] = 0.0
        return self.buckets[key]

    def describe(self) -> list[Metric]:
        """The family, without samples (for the registry's name check)."""
        return [HistogramMetricFamily(self.name, self.documentation, labels=self.labels)]

    def collect(self) -> Iterator[Metric]:
        """The family with cumulative buckets per label set."""
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labels)
        bounds = [*map(floatToGoString, self.bounds), "+Inf"]
        for key, counts in list(self.buckets.items()):
            cumulative, total = [], 0
            for bound, count in zip(bounds, counts, strict=True):
                total += count
                cumulative.append((bound, total))
            family.add_metric([str(value) for value in key], cumulative, self.sums[key])
        yield family
