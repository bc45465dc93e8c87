"""Periodic jobs in the in-memory store: this node's alone, forgotten when it stops."""

from __future__ import annotations

from datetime import datetime

import msgspec
from goqueue.supervisor.common.schedule import Fired, ScheduleState


class ScheduleBook:
    """Each schedule's state: enabled, last fire and its job. A tick fires at most once,
    and never after a later one (the last fire only moves forward)."""

    def __init__(self) -> None:
        self._states: dict[str, ScheduleState] = {}

    def states(self) -> dict[str, ScheduleState]:
        """Every schedule fired or switched since the node started, by name."""
        return dict(self._states)

    def refusal(self, name: str, tick: datetime) -> Fired | None:
        """Why `tick` may not fire now (disabled, or fired already), or None."""
        state = self._states.get(name)
        if state is None:
            return None
        if not state.enabled:
            return Fired.DISABLED
        if state.last_fire is not None and tick <= state.last_fire:
            return Fired.TAKEN
        return None

    def fired(self, name: str, tick: datetime, job_id: str) -> None:
        """Record that `tick` made job `job_id`."""
        state = self._states.get(name) or ScheduleState(name=name)
        self._states[name] = msgspec.structs.replace(state, last_fire=tick, last_job_id=job_id)

    def switch(self, name: str, enabled: bool, now: datetime) -> ScheduleState:
        """Enable or disable `name`; enabling again (re)starts its count of missed ticks."""
        state = self._states.get(name) or ScheduleState(name=name)
        if state.enabled != enabled:
            at = now if enabled else state.enabled_at
            state = msgspec.structs.replace(state, enabled=enabled, enabled_at=at)
        self._states[name] = state
        return state
