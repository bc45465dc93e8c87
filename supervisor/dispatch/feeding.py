"""Which worker gets what: the busy workers whose queue may take more (`low`), the
attempts in hand each of them is handed (`plan_queues`), and the attempts taken back
from a busy worker's queue for an idle one (`move_to`).

No worker should wait while work waits behind another's job, and no job should start
after one of a lower priority that was queued elsewhere: those two rules decide here.
"""

from __future__ import annotations

from collections.abc import Callable

from goqueue.supervisor.common.enums import WorkerState
from goqueue.supervisor.common.jobs import Job
from goqueue.supervisor.dispatch.attempts import Attempt, Attempts, Durations, Phase
from goqueue.supervisor.dispatch.policy import Depth
from goqueue.supervisor.workers.handle import Worker
from goqueue.supervisor.workers.pool import Pool


class Feeding:
    """Decides which worker gets which attempt, over the pool and the attempts held."""

    def __init__(
        self,
        pool: Pool,
        attempts: Attempts,
        durations: Durations,
        depth: Depth,
        monotonic: Callable[[], float],
    ) -> None:
        self.pool = pool
        self.attempts = attempts
        self.durations = durations
        self.depth = depth
        self.monotonic = monotonic

    def low(self) -> dict[Worker, int]:
        """Busy workers whose queue ran low, and how many attempts each may take: not one
        running a job that usually takes long here, or of a type not seen run yet."""
        if self.depth.limit <= 1:
            return {}
        rooms = {}
        recycle = self.pool.recycle
        short = self.durations.short
        for worker in self.pool:
            if worker.state == WorkerState.BUSY and not worker.retire:
                running = worker.lease
                if running is not None and self.durations.expected(running.job.type) >= short:
                    continue  # behind a long job (or one of unknown length) nothing waits
                if running is None:
                    at_most = self.depth.limit
                else:  # no more than about HELD_WORK of its usual work
                    at_most = self.durations.held_at_most(running.job.type)
                room = self.depth.room(worker.held, at_most)
                left = recycle.left(worker)
                if left is not None:
                    room = min(room, left)  # a worker due for recycling takes no more
                if room and worker.verdict is None:
                    rooms[worker] = room
        return rooms

    def room_beside(self, idle: list[Worker]) -> int:
        """How many attempts a claim for `idle` workers may take beyond one each, for
        their queues: while the queue is deep, for each that last ran a job that usually
        takes little here (the next one likely does too), up to its queue's depth."""
        if self.depth.current <= 1:
            return 0
        extra = 0
        recycle = self.pool.recycle
        for worker in idle:
            last = worker.last_type
            if last is None or self.durations.expected(last) >= self.durations.short:
                continue
            room = min(self.depth.current, self.durations.held_at_most(last)) - 1
            left = recycle.left(worker)
            if left is not None:
                room = min(room, left - 1)  # a worker due for recycling takes no more
            extra += max(0, room)
        return extra

    def plan_queues(
        self, short: frozenset[str], fresh: Callable[[Attempt], bool]
    ) -> dict[Worker, list[Attempt]]:
        """The attempts in hand to queue on busy workers with room, in their order (each
        to the one holding fewest): stop at the first that may not wait in a queue (a long
        or limited type, a rate window, a lease going stale: it waits for an idle worker,
        and the rest with it), and never queue one behind another worker's queued attempt
        of a higher priority (it would overtake it). One its claim started already goes
        at once."""
        rooms = self.low()
        batches: dict[Worker, list[Attempt]] = {}
        if not rooms:
            return batches
        for attempt in list(self.attempts.hand):
            job = attempt.lease.job
            if job.type not in short:
                break
            if attempt.window_end is not None or not fresh(attempt):
                break
            takers = [w for w in rooms if job.type in w.types]
            if not takers:
                break
            worker = min(takers, key=lambda w: w.held + len(batches.get(w, ())))
            if self._overtakes(job, worker, batches):
                break
            batches.setdefault(worker, []).append(attempt)
            rooms[worker] -= 1
            if not rooms[worker]:
                del rooms[worker]
                if not rooms:
                    break
        return batches

    def _overtakes(self, job: Job, worker: Worker, batches: dict[Worker, list[Attempt]]) -> bool:
        """True if `job`, queued last on `worker`, would be there in an earlier place than
        an attempt of a higher priority queued on another worker (it would likely start
        first)."""
        place = worker.held + len(batches.get(worker, ()))
        for other in self.pool:
            if other is worker:
                continue
            ahead = [e.lease.job for e in other.queued]
            ahead += [a.lease.job for a in batches.get(other, ())]
            start = other.lease is not None
            for i, queued in enumerate(ahead):
                if queued.priority > job.priority and start + i > place:
                    return True
        return False

    def move_to(self, idle: list[Worker]) -> int:
        """Idle workers while others hold attempts queued: take some of those back (they
        are handed to the idle ones once their worker says it has not started them), so
        that no worker waits while work waits behind another's job, and an idle worker
        never starts a job of a lower priority than one queued elsewhere. How many of
        `idle` (the first ones) will be served so, counting moves already under way."""
        attempts = self.attempts
        served = attempts.count(Phase.MOVING)
        if served >= len(idle) or not (
            attempts.count(Phase.QUEUED) or attempts.count(Phase.GRANTED)
        ):
            return min(served, len(idle))
        now = self.monotonic()
        wanted = len(idle) - served
        types = types_of(idle)
        for worker in self.pool:
            movable = [
                a
                for a in map(attempts.get, (e.lease.token for e in worker.queued))
                if a is not None and a.phase in (Phase.QUEUED, Phase.GRANTED) and a.type in types
            ]
            running = worker.lease
            expected = self.durations.expected(running.job.type) if running else 0.0
            overdue = running is not None and (
                expected >= self.durations.short or now - worker.attempt_started > 2 * expected
            )
            if not movable or (len(movable) < 2 and not overdue):
                continue
            take = movable if overdue else movable[len(movable) // 2 :]
            take = take[:wanted]
            for attempt in take:
                attempts.move(attempt, Phase.MOVING)
            self.pool.withdraw(worker, [a.lease.job.id for a in take])
            wanted -= len(take)
            if not wanted:
                break
        return min(attempts.count(Phase.MOVING), len(idle))


def types_of(workers: list[Worker]) -> frozenset[str]:
    """Every type any of `workers` runs."""
    return frozenset().union(*(w.types for w in workers)) if workers else frozenset()
