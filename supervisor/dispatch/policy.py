"""How dispatch decides: what the operator decides (`Policy`, replaced whole on a reload),
and what the node learns as it runs about what a worker's own queue may hold: how many
attempts (`Depth`), and of which types (`attempts.Durations`, learnt as attempts end):
short ones, with no limit of their own.

A worker runs the attempts it holds back to back, so the round trip through the
supervisor between two of them is off its path. That pays for short jobs only: behind
a long one, queued attempts would wait while another worker may be free. So only types
whose attempts usually take under `SHORT` seconds here, with no concurrency or rate limit,
are queued; any other job goes to an idle worker alone, as its first attempt.

How deep: `Depth` starts at one attempt per worker and doubles (up to `1 + --prefetch`)
each time a batch claimed for the queues comes back full, and falls back to one when a
claim finds the queue shallow. A worker's queue is refilled once it is down to half.
Its depth bounds what a newly enqueued job of a higher priority may wait behind (the
attempts already queued: `depth * SHORT` seconds at worst) and how many leases a node
holds that other nodes cannot take.

With a store that outlives the node, a queued attempt waits for its start to be written
before it runs (a job that kills its node is then charged for it), and the dispatcher
writes those starts ahead only for the attempts due to start within `GO_AHEAD` seconds
of work: a node that dies charges at most about that much work that never ran. The
claim itself starts the jobs at its head whose type's whole queue starts within that
(`attempts.Durations.soon`): one write a job fewer.
"""

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


class Depth:
    """How many attempts each worker may hold (the one it runs included), between one
    and `limit`, adapting to how deep the queue is."""

    def __init__(self, limit: int) -> None:
        self.limit = max(1, limit)
        self.current = 1

    def room(self, held: int, at_most: int) -> int:
        """How many more a worker holding `held` should take now, holding no more than
        `at_most`: none until its queue is down to half, then enough to fill it."""
        depth = min(self.current, at_most)
        if held > depth // 2:
            return 0
        return depth - held

    def deep(self) -> None:
        """A batch came back full: more is waiting."""
        self.current = min(self.limit, self.current * 2)

    def shallow(self) -> None:
        """A claim found fewer jobs than asked for."""
        self.current = 1
