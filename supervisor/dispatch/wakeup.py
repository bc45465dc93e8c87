"""The dispatcher's wake-up: made before the store (which calls `wake` when work may be
claimable) and given to both, so neither is wired to the other afterwards; and its
timer for the next due job."""

from __future__ import annotations

import asyncio
from datetime import datetime


class Wakeup:
    """The dispatcher's wake-up: made before the store (which calls `wake` when work may
    be claimable) and given to both, so neither is wired to the other afterwards. It
    also notes what the last short claims saw: nothing new since means nothing to ask."""

    __slots__ = ("_due_at", "_due_timer", "event", "news", "seen", "seen_short")

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.news = 1  # bumped by wake(): work may have arrived
        self.seen = 0  # `news` as of the last claim for idle workers that came back short
        self.seen_short = 0  # likewise for the last claim for the workers' queues
        self._due_timer: asyncio.TimerHandle | None = None
        self._due_at: datetime | None = None  # what the due timer is set for

    def wake(self) -> None:
        """New work may be claimable (enqueued, due, a slot freed): claim on the next pass."""
        self.news += 1
        self.event.set()

    def drained(self) -> bool:
        """True while nothing may have arrived since a claim found nothing more."""
        return self.seen == self.news

    def wake_at(self, due: datetime | None, now: datetime) -> None:
        """Wake when the store's next job becomes due (or a paced key may start again):
        `due`, None for no time known. A timer whose time came before it fired is not
        lost to the new one: the store answers only times still ahead, so its wake is
        made here."""
        timer, came = self._due_timer, self._due_at
        self._due_timer = self._due_at = None
        if timer is not None:
            timer.cancel()
            if came is not None and came <= now:
                self.wake()
        if due is not None:
            delay = max(0.0, (due - now).total_seconds())
            self._due_timer = asyncio.get_running_loop().call_later(delay + 0.001, self._came)
            self._due_at = due

    def _came(self) -> None:
        """The due timer fired."""
        self._due_timer = self._due_at = None
        self.wake()
