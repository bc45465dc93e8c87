"""Flow control by key, the rules every store's claim applies (`docs/guide/flow-control.md`).

A job may carry a `concurrency_key`. For a type with a per-key limit (`key_concurrency`),
at most that many of its jobs sharing a key are claimed or running at once, and its keys
take turns: among due jobs of one priority, the job whose key has the fewest claimed or
running jobs goes first (then the oldest `run_at`, then enqueue order), so a key with a
long backlog never holds up a key with a short one, and one key's jobs start in enqueue
order. A job without a key is a key of its own, with nothing running. Types without a
per-key limit ignore keys when claiming.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

KeyOf = tuple[str, str]  # (type, concurrency_key)


class KeyTurns:
    """The turns of keys in one claim: `busy` holds the claimed and running jobs of each
    (type, key) before it, `limits` the per-key limit of each type that has one; each job
    the claim takes is `taken`."""

    __slots__ = ("busy", "limits", "taken")

    def __init__(self, limits: Mapping[str, int], busy: Mapping[KeyOf, int]) -> None:
        self.limits = limits
        self.busy = busy
        self.taken: Counter[KeyOf] = Counter()

    def turn(self, job_type: str, key: str | None) -> int | None:
        """How many jobs of `key` are claimed or running (its place in the turns: fewer
        goes first), or None when the key is at its type's limit. 0 for a job without a
        key, or of a type without a per-key limit."""
        if key is None:
            return 0
        limit = self.limits.get(job_type)
        if limit is None:
            return 0
        held = self.busy.get((job_type, key), 0) + self.taken[(job_type, key)]
        return None if held >= limit else held

    def take(self, job_type: str, key: str | None) -> None:
        """The claim took a job of `key`."""
        if key is not None and job_type in self.limits:
            self.taken[(job_type, key)] += 1
