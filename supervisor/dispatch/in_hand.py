"""Attempts in hand: claimed (or started), on no worker yet, best first. Each is run by
the next idle worker that takes its type: one merely claimed has its start written first
(`begin`: a job that kills its node is charged for it), while the worker is kept for it.
One whose lease may lapse before the next heartbeat could extend it goes back to the
store instead (`give_back`), and so does one of a rate-limited type whose window ended
(`unclaim`): its start would count in the next window, where other nodes may have used
every start already."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from goqueue.supervisor.common.enums import Status
from goqueue.supervisor.common.errors import StoreUnavailable
from goqueue.supervisor.common.jobs import Lease
from goqueue.supervisor.common.lifecycle import Lifecycle
from goqueue.supervisor.dispatch.attempts import Attempt, Attempts, Phase
from goqueue.supervisor.dispatch.outcomes import Outcomes
from goqueue.supervisor.store.base import Store
from goqueue.supervisor.workers.handle import Worker
from goqueue.supervisor.workers.pool import Pool

log = logging.getLogger("goqueue.dispatch")

RETRY_START = 1.0  # seconds before claiming again after a start found the store down


class InHand:
    """Runs, starts and hands back the attempts in hand. `kept` holds the ids of idle
    workers kept for a start being written; `run` runs a started lease on an idle worker;
    `lease_seconds` is the policy's lease (replaced on a reload)."""

    def __init__(
        self,
        store: Store,
        pool: Pool,
        attempts: Attempts,
        outcomes: Outcomes,
        kept: set[int],
        *,
        lifecycle: Lifecycle,
        lease_seconds: float,
        run: Callable[[Lease, Worker, Attempt], None],
        wake: Callable[[], None],
        nudge: Callable[[], None],
        monotonic: Callable[[], float],
    ) -> None:
        self.store = store
        self.pool = pool
        self.attempts = attempts
        self.outcomes = outcomes
        self.kept = kept
        self.lifecycle = lifecycle
        self.renew(lease_seconds)
        self.run = run
        self.wake = wake
        self.nudge = nudge
        self.monotonic = monotonic

    def renew(self, lease_seconds: float) -> None:
        """Take the policy's lease (boot, reload), and `fresh_for` with it: the seconds
        an attempt may wait after its lease was extended and still be run (a heartbeat's
        interval, a third of the lease, must be left)."""
        self.lease_seconds = lease_seconds
        self.fresh_for = lease_seconds * 2 / 3

    def fresh(self, attempt: Attempt) -> bool:
        """True while `attempt` may still be run (`fresh_for`)."""
        return self.fresh_since(attempt.renewed)

    def fresh_since(self, renewed: float) -> bool:
        """True while a lease extended (or taken, or asked for) at `renewed` may still be
        run."""
        return self.monotonic() - renewed < self.fresh_for

    def next_for(self, worker: Worker) -> Attempt | None:
        """The attempt in hand `worker` should run next, stale ones handed back on the way."""
        while True:
            attempt = self.attempts.next_for(worker.types)
            if attempt is None:
                return None
            if not self.fresh(attempt):
                self.give_back(attempt)
            elif attempt.window_end is not None and self.monotonic() >= attempt.window_end:
                self.unclaim(attempt)
            else:
                return attempt

    def give_back(self, attempt: Attempt) -> None:
        """Hand an attempt that went stale in hand back to the store."""
        log.warning(
            "handing back a lease claimed ahead that went stale",
            extra={"job_id": attempt.lease.job.id, "type": attempt.type},
        )
        self.attempts.move(attempt, Phase.GONE)
        self.outcomes.released(attempt.lease)

    def unclaim(self, attempt: Attempt) -> None:
        """Hand back a claimed lease whose rate window ended, and claim again once it is
        pending (taking a start from the window now open)."""
        self.attempts.move(attempt, Phase.GONE)
        done = self.outcomes.released(attempt.lease)
        done.add_done_callback(lambda _: self.wake())

    def release_stale(self) -> int:
        """Hand back the attempts that waited a whole lease in hand, or went stale; how
        many."""
        limit = self.monotonic() - self.lease_seconds
        stale = [a for a in self.attempts.hand if a.taken <= limit or not self.fresh(a)]
        for attempt in stale:
            self.give_back(attempt)
        return len(stale)

    def begin(self, attempt: Attempt, worker: Worker) -> None:
        """Start a claimed attempt in the store (durably: a job that kills its node is
        charged for it), then run it on `worker`, kept for it meanwhile."""
        self.attempts.move(attempt, Phase.STARTING, worker=worker)
        self.kept.add(id(worker))
        self.outcomes.track(self._begin_write(attempt, worker))

    async def _begin_write(self, attempt: Attempt, worker: Worker) -> None:
        held: Lease | None = None
        asked = self.monotonic()
        refused = False
        try:
            held = await self.store.start(attempt.lease)
            attempt.renewed = asked  # the start extends the lease
        except StoreUnavailable as exc:
            log.warning("start failed: store unavailable", extra={"err": str(exc)})
            held = attempt.lease  # still claimed: back in hand, tried again later
            refused = True
            asyncio.get_running_loop().call_later(RETRY_START, self.wake)
        except Exception:
            log.exception("starting a claimed job failed")
        finally:
            self.kept.discard(id(worker))
        if held is None:
            log.warning("lease lost before the job started", extra={"job_id": attempt.lease.job.id})
            self.attempts.move(attempt, Phase.GONE)
        elif self.lifecycle.winding_down or not self.fresh(attempt):
            self.attempts.move(attempt, Phase.GONE)
            self.outcomes.released(held)  # it may lapse while running
        else:
            if held.job.status == Status.RUNNING:
                self.attempts.started(attempt, held)
            if attempt.written and self.pool.is_idle(worker):
                self.run(held, worker, attempt)
            else:  # not started, or the worker is gone: the next idle one takes it
                window_end = attempt.window_end
                self.attempts.move(attempt, Phase.IN_HAND, window_end=window_end, first=True)
        if not refused:  # (a pass now would only ask the store again: the wake above)
            self.nudge()
