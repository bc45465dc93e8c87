"""What this node knows about its job types: the actors' declared defaults plus the
operator's overrides (`[limits]`). Rebuilt on every reload from a new worker's Ready.
A job's queue, priority and retries are resolved from `actors` by `jobs.resolve_spec`."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Literal

from goqueue.actors.protocol import ActorInfo
from goqueue.supervisor.common.jobs import Job
from goqueue.supervisor.common.rates import Rate, parse_rate

DeadlineSource = Literal["job", "actor", "node"]


class Catalog:
    """Actor declarations by type, with per-type limit overrides applied."""

    def __init__(
        self,
        actors: Iterable[ActorInfo],
        limits: Mapping[str, int],
        rates: Mapping[str, str] | None = None,
        *,
        key_limits: Mapping[str, int] | None = None,
        key_rates: Mapping[str, str] | None = None,
    ) -> None:
        self.actors = {a.name: a for a in actors}
        self.overrides = dict(limits)
        self.types = frozenset(self.actors)
        self.rates: dict[str, Rate] = {}  # the config's `[rate_limits]` win over actors'
        for name, info in self.actors.items():
            if info.rate_limit is not None:
                self.rates[name] = parse_rate(info.rate_limit)
        self.rates.update((t, parse_rate(rate)) for t, rate in (rates or {}).items())
        # flow control by key: the config's `[key_limits]`, `[key_rate_limits]` win
        self.key_limits: dict[str, int] = {
            name: info.key_concurrency
            for name, info in self.actors.items()
            if info.key_concurrency is not None
        } | dict(key_limits or {})
        self.key_rates: dict[str, Rate] = {
            name: parse_rate(info.key_rate_limit)
            for name, info in self.actors.items()
            if info.key_rate_limit is not None
        } | {t: parse_rate(rate) for t, rate in (key_rates or {}).items()}
        limits_of = {t: self._declared_limit(t) for t in self.types}
        self._limited = {t: n for t, n in limits_of.items() if n is not None}
        self._unlimited = [t for t, n in limits_of.items() if n is None]
        self._limits = {**self._limited, **self.overrides}  # read on every job

    def limit(self, job_type: str) -> int | None:
        """Concurrency limit for a type on this node (None = only the worker count)."""
        return self._limits.get(job_type)

    def _declared_limit(self, job_type: str) -> int | None:
        override = self.overrides.get(job_type)
        if override is not None:
            return override
        info = self.actors.get(job_type)
        return info.concurrency if info else None

    def limits(self) -> dict[str, int | None]:
        """Every type and its limit, as declared to the store."""
        return {t: self.limit(t) for t in self.actors}

    def deadline(self, job: Job, default: float) -> tuple[float, DeadlineSource]:
        """The deadline in seconds an attempt of `job` gets on this node, and where it
        comes from: the job's own `timeout_seconds`, else its actor's declared timeout,
        else `default` (the node's). The dispatcher arms it; `GET /jobs/{id}` shows it."""
        if job.timeout_seconds:
            return job.timeout_seconds, "job"
        info = self.actors.get(job.type)
        if info is not None and info.timeout:
            return info.timeout, "actor"
        return default, "node"

    def free_slots(self, capacity: int, *held: Mapping[str, int]) -> dict[str, int]:
        """How many more attempts of each type may start now, at most `capacity`, with
        the attempts counted in `held` (running, in hand) taken from each type's limit.
        Runs on every dispatch pass: only the limited types look at `held`."""
        if capacity <= 0:
            return {}
        slots = dict.fromkeys(self._unlimited, capacity)
        for job_type, limit in self._limited.items():
            free = min(capacity, limit - sum(counts.get(job_type, 0) for counts in held))
            if free > 0:
                slots[job_type] = free
        return slots
