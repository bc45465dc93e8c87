"""The dispatcher's wake-up: made before the store (which calls `wake` when work may be
claimable) and given to both, so neither is wired to the other afterwards."""

from __future__ import annotations

import asyncio


class Wakeup:
    """The dispatcher's wake-up: made before the store (which calls `wake` when work may
    be claimable) and given to both, so neither is wired to the other afterwards. It
    also notes what the last short claims saw: nothing new since means nothing to ask."""

    __slots__ = ("event", "news", "seen", "seen_short")

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.news = 1  # bumped by wake(): work may have arrived
        self.seen = 0  # `news` as of the last claim for idle workers that came back short
        self.seen_short = 0  # likewise for the last claim for the workers' queues

    def wake(self) -> None:
        """New work may be claimable (enqueued, due, a slot freed): claim on the next pass."""
        self.news += 1
        self.event.set()

    def drained(self) -> bool:
        """True while nothing may have arrived since a claim found nothing more."""
        return self.seen == self.news
