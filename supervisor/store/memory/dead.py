"""The memory store's dead letters: by their own id, in the order they were written,
with an index by job id (a job has at most one letter), and the filtered selections
that listing and the bulk actions need."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from goqueue.supervisor.common.bulk import Purged
from goqueue.supervisor.common.jobs import DeadLetter
from goqueue.supervisor.common.reads import Page
from goqueue.supervisor.common.summaries import DeadFilter


class DeadLetters:
    """Dead letters, oldest first in memory (listed newest first)."""

    def __init__(self) -> None:
        self._by_id: dict[str, DeadLetter] = {}
        self._by_job: dict[str, str] = {}  # job id -> dead letter id

    def __len__(self) -> int:
        return len(self._by_id)

    def add(self, dead: DeadLetter) -> None:
        """Keep a new letter."""
        self._by_id[dead.id] = dead
        self._by_job[dead.job_id] = dead.id

    def get(self, dead_id: str) -> DeadLetter | None:
        """A letter by its own id."""
        return self._by_id.get(dead_id)

    def find(self, some_id: str) -> DeadLetter | None:
        """A letter by its own id or by its job's id."""
        dead = self._by_id.get(some_id)
        if dead is None and some_id in self._by_job:
            dead = self._by_id.get(self._by_job[some_id])
        return dead

    def pop(self, dead_id: str) -> DeadLetter | None:
        """Remove a letter by its own id; None if there was none."""
        dead = self._by_id.pop(dead_id, None)
        if dead is not None and self._by_job.get(dead.job_id) == dead_id:
            del self._by_job[dead.job_id]
        return dead

    def newest_first(self, filters: DeadFilter | None = None) -> Iterator[DeadLetter]:
        """Letters newest first, those passing `filters` if given."""
        letters = reversed(self._by_id.values())
        return letters if filters is None else filter(filters.matches, letters)

    def page(self, limit: int, offset: int, filters: DeadFilter | None = None) -> Page:
        """A page of letters, newest first (those passing `filters`)."""
        if filters is None or filters.empty:
            letters = list(itertools.islice(self.newest_first(), offset, offset + limit))
            return Page(letters, len(self._by_id))
        matches = list(self.newest_first(filters))
        return Page(matches[offset : offset + limit], len(matches))

    def purge_matching(self, filters: DeadFilter, limit: int) -> Purged:
        """Delete up to `limit` letters passing `filters`, oldest first."""
        letters, more = self.oldest_matching(filters, limit)
        for dead in letters:
            self.pop(dead.id)
        return Purged(len(letters), more)

    def oldest_matching(self, filters: DeadFilter, limit: int) -> tuple[list[DeadLetter], int]:
        """Up to `limit` letters passing `filters`, oldest first, and how many more pass."""
        matches = [dead for dead in self._by_id.values() if filters.matches(dead)]
        return matches[:limit], max(0, len(matches) - limit)
