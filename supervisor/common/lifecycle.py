"""The node's phase: booting, serving, draining, stopped. The arbiter owns it (and moves
it, through its start-up and `shutdown.py`); the parts it is handed to only read it."""

from __future__ import annotations

import asyncio
from enum import StrEnum


class NodePhase(StrEnum):
    """Where a node is in its life."""

    BOOTING = "booting"  # the store opens, the first worker boots: no jobs accepted yet
    SERVING = "serving"  # jobs accepted and dispatched
    DRAINING = "draining"  # a stop was asked (or the start failed): nothing new is taken
    STOPPED = "stopped"  # every part is closed


class Lifecycle:
    """The one place a node's phase lives; `settled` is set once the boot is over
    (the node serves, or gave its boot up)."""

    def __init__(self) -> None:
        self.phase = NodePhase.BOOTING
        self.settled = asyncio.Event()  # set once it leaves BOOTING (never cleared)
        # True once the node drains or stopped: it takes and hands out no new work (an
        # attribute, not a property: the dispatcher reads it several times per job)
        self.winding_down = False

    @property
    def booting(self) -> bool:
        """True until the node first serves (or winds down without ever serving)."""
        return self.phase is NodePhase.BOOTING

    def enter(self, phase: NodePhase) -> None:
        """Move to `phase` (forward only: a node that drains never serves again)."""
        order = list(NodePhase)
        if order.index(phase) < order.index(self.phase):
            return
        self.phase = phase
        self.winding_down = phase in (NodePhase.DRAINING, NodePhase.STOPPED)
        if phase is not NodePhase.BOOTING:
            self.settled.set()
