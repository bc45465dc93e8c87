"""What the operator decides about dispatch: the queues served, the default deadline,
the retry backoff and the lease term. Replaced whole on a reload."""

from __future__ import annotations

from dataclasses import dataclass

from goqueue.supervisor.settings.config import DEFAULTS, Settings


@dataclass(frozen=True, slots=True)
class Policy:
    """What the operator decides about dispatch; replaced whole on a reload."""

    queues: frozenset[str] | None = None  # None: every queue
    default_timeout: float = DEFAULTS.default_timeout
    retry_base: float = DEFAULTS.retry_base
    retry_cap: float = DEFAULTS.retry_cap
    lease_seconds: float = DEFAULTS.lease_seconds

    @classmethod
    def of(cls, settings: Settings) -> Policy:
        """The policy `settings` ask for."""
        queues = frozenset(settings.queues) if settings.queues else None
        return cls(
            queues,
            settings.default_timeout,
            settings.retry_base,
            settings.retry_cap,
            settings.lease_seconds,
        )


DEFAULT_POLICY = Policy.of(DEFAULTS)  # what a node configured with nothing decides
