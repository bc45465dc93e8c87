"""What the operator decides about dispatch: the queues served, the default deadline,
the retry backoff and the lease term. Replaced whole on a reload."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from goqueue.supervisor.settings.config import Settings


@dataclass(frozen=True, slots=True)
class Policy:
    """What the operator decides about dispatch; replaced whole on a reload."""

    queues: frozenset[str] | None = None  # None: every queue
    default_timeout: float = 300.0
    retry_base: float = 1.0
    retry_cap: float = 3600.0
    lease_seconds: float = 30.0

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


DEFAULT_POLICY = Policy()  # all queues, 300 s deadlines, backoff 1 s to 1 h, 30 s leases
