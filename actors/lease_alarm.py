"""The kernel's bound on a running job: SIGALRM at its default action, due at the end of
the job's allowance and moved on by every `Extend`.

A frozen supervisor stops renewing the job's lease, and another node may take the job
over once the lease runs out. A timer in a thread of this process cannot stop the job in
time: if the whole process was stopped (SIGSTOP, `docker pause`, a debugger), the job's
thread may run on after SIGCONT before that thread is scheduled. The kernel's interval
timer (ITIMER_REAL) counts wall time while the process is stopped, so its signal is
already pending when the process resumes, and SIGALRM at its default action ends the
process before any of its threads runs another instruction. No Python handler runs: the
supervisor names the death from the exit status (killed by SIGALRM).

A handler must not use SIGALRM itself (`signal.alarm`, `setitimer(ITIMER_REAL)`): the
process has one such timer, and it is the lease's.
"""

from __future__ import annotations

import signal
from typing import Protocol

MIN_SECONDS = 0.001  # setitimer(0) would disarm: an allowance already spent fires at once


class Alarm(Protocol):
    """A deadline that ends the worker process when it passes."""

    def arm(self, seconds: float) -> None:
        """End the process `seconds` from now, unless re-armed or disarmed first."""

    def disarm(self) -> None:
        """Let the process live on (the job ended)."""


class KernelAlarm:
    """The process's ITIMER_REAL, with SIGALRM at its default action (terminate)."""

    def __init__(self) -> None:
        # signal.signal must run in the main thread: build this before starting threads
        signal.signal(signal.SIGALRM, signal.SIG_DFL)

    def arm(self, seconds: float) -> None:
        signal.setitimer(signal.ITIMER_REAL, max(seconds, MIN_SECONDS))

    def disarm(self) -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)
