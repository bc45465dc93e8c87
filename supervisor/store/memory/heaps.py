"""The memory store's pending jobs in claim order: one ready heap per (queue, type, key),
jobs without a key in a heap of their own, best first (priority, then run_at, then
enqueue order), and one heap of delayed jobs by due time. A claim looks at a window of
each (queue, type)'s keys, least lately taken first, not at every key. A job that stops
being pending (cancelled, claimed) leaves its entry behind; the entry is skipped when it
reaches the top. So is the entry of a job pending again at another time (a late
outcome's retry replacing its reaping's): an entry is live only while its job is pending
at the entry's own time."""

from __future__ import annotations

import heapq
import operator
from collections import Counter
from collections.abc import Callable, Container, Mapping
from datetime import UTC, datetime

from goqueue.supervisor.common.enums import Status
from goqueue.supervisor.common.jobs import Job

ReadyKey = tuple[str, str, str | None]  # (queue, type, concurrency_key)
Group = tuple[str, str]  # (queue, type)
ReadyEntry = tuple[int, float, int, str]  # (-priority, run_at, seq, job id)
# A key's turn in a claim, or None when the key is at its limit (`flow.KeyTurns.turn`)
Turn = Callable[[str, str | None], int | None]
# (-priority, turn, the key's place in the claim's window, run_at, seq, job id)
Order = tuple[int, int, int, float, int, str]
_RUN_AT = operator.itemgetter(1)


class PendingHeaps:
    """Pending jobs, due and delayed, over the store's jobs by id (read, never written)."""

    def __init__(self, jobs: Mapping[str, Job]) -> None:
        self.jobs = jobs
        self.ready: dict[ReadyKey, list[ReadyEntry]] = {}
        # each (queue, type)'s heaps by key (None: its jobs without turns, first), the keys
        # least lately taken first (`took` moves a key to the end: keys take turns)
        self.groups: dict[Group, dict[str | None, None]] = {}
        self.delayed: list[tuple[float, int, str]] = []
        self.stale: Counter[ReadyKey] = Counter()  # entries of due jobs cancelled in place
        self.places: dict[ReadyKey, int] = {}  # each key's place in the last claim's window

    @staticmethod
    def ready_key(job: Job) -> ReadyKey:
        """The ready heap of a due job."""
        return (job.queue, job.type, job.concurrency_key)

    def add(self, job: Job, now_ts: float) -> None:
        """A job became pending: ready if due at `now_ts`, delayed otherwise."""
        run_ts = job.run_at.timestamp()
        if run_ts <= now_ts:
            self._push(job, (-job.priority, run_ts, job.seq, job.id))
        else:
            heapq.heappush(self.delayed, (run_ts, job.seq, job.id))

    def promote(self, now_ts: float) -> float | None:
        """Move delayed jobs that are due at `now_ts` into their ready heaps; when the
        first of them was due (None with none)."""
        delayed = self.delayed
        first = None
        while delayed and delayed[0][0] <= now_ts:
            run_ts, _, job_id = heapq.heappop(delayed)
            if self._is_pending(job_id, run_ts):
                self._push_ready(self.jobs[job_id])
                first = run_ts if first is None else first
        return first

    def candidates(
        self,
        queues: frozenset[str] | None,
        free: Mapping[str, int],
        paused: Container[str],
        turn: Turn,
        window: int,
    ) -> list[tuple[Order, ReadyKey]]:
        """The heaps whose top is claimable, as a heap of (its top's order, the heap):
        its type has a free slot, its queue is served (`queues`, None for all) and not
        paused, and its key (`turn`) may start a job: its jobs without a key, and the
        first `window` keys that may, least lately taken first. `next_of` orders a heap
        again once its top was taken."""
        out: list[tuple[Order, ReadyKey]] = []
        self.places = places = {}
        for group, members in list(self.groups.items()):
            queue, job_type = group
            if free.get(job_type, 0) <= 0 or queue in paused:
                continue
            if queues is not None and queue not in queues:
                continue
            if None in members and (order := self.next_of((queue, job_type, None), turn)):
                out.append((order, (queue, job_type, None)))
            found = 0
            emptied = []
            for flow_key in members:
                if flow_key is None:
                    continue
                key = (queue, job_type, flow_key)
                places[key] = found + 1
                order = self.next_of(key, turn)
                if order is not None:
                    out.append((order, key))
                    found += 1
                    if found >= window:
                        break
                elif not self.ready[key]:
                    emptied.append(key)  # a key's heap goes once empty: keys come and go
            for key in emptied:
                del self.ready[key], members[key[2]]
                self.stale.pop(key, None)
            if not members:
                del self.groups[group]
        heapq.heapify(out)
        return out

    def took(self, key: ReadyKey) -> None:
        """A claim took a job of `key`'s heap: a key goes behind the others of its type."""
        if key[2] is not None:
            members = self.groups[key[:2]]
            del members[key[2]]
            members[key[2]] = None

    def next_of(self, key: ReadyKey, turn: Turn) -> Order | None:
        """The claim order of the heap's top job: highest priority, then its key's turn
        (the fewest of its jobs claimed or running: keys take turns) and its place in the
        claim's window (least lately taken first), then oldest run_at, then enqueue order;
        None when the heap is empty or its key may start no job (at its limit, or its pace
        not due: its jobs wait, the others go on)."""
        heap = self.ready.get(key)
        while heap and not self._is_pending(heap[0][3], heap[0][1]):
            heapq.heappop(heap)  # cancelled while waiting
            self.stale[key] -= 1
        if not heap:
            return None
        rank = turn(key[1], key[2])
        if rank is None:
            return None
        top = heap[0]
        return (top[0], rank, self.places.get(key, 0), top[1], top[2], top[3])

    def pop(self, key: ReadyKey) -> Job:
        """Take the top job of a heap `candidates` chose."""
        _, _, _, job_id = heapq.heappop(self.ready[key])
        return self.jobs[job_id]

    def discard(self, job: Job, now_ts: float) -> None:
        """A pending job is about to stop being pending in place (cancelled): count its
        entry as stale if it is in a ready heap, so the ready counts stay right."""
        self.promote(now_ts)  # so a due job's entry is surely in its ready heap
        if job.run_at.timestamp() <= now_ts:
            self.stale[self.ready_key(job)] += 1

    def ready_by_queue(self, now_ts: float) -> tuple[Counter[str], dict[str, float]]:
        """Due jobs per queue, and the earliest run_at among each queue's due jobs. One
        pass over the ready entries, in C (about 25 ms for 75,000 due jobs)."""
        self.promote(now_ts)
        ready: Counter[str] = Counter()
        oldest: dict[str, float] = {}
        for key, heap in self.ready.items():
            queue = key[0]
            ready[queue] += len(heap) - self.stale[key]
            first = self._oldest(heap)
            if first is not None and first < oldest.get(queue, now_ts + 1):
                oldest[queue] = first
        return ready, oldest

    def _oldest(self, heap: list[ReadyEntry]) -> float | None:
        if not heap:
            return None
        first = min(heap, key=_RUN_AT)
        if self._is_pending(first[3], first[1]):
            return first[1]
        live = [entry[1] for entry in heap if self._is_pending(entry[3], entry[1])]
        return min(live) if live else None

    def next_due(self, now_ts: float) -> datetime | None:
        """When the earliest delayed job becomes due. Jobs due by `now_ts` are made
        ready, and the first one's time answered (once: a timer set for a time past
        wakes the dispatcher at once, and a dispatcher with no free worker must not spin
        on it)."""
        came = self.promote(now_ts)
        if came is not None:
            return datetime.fromtimestamp(came, UTC)
        while self.delayed and not self._is_pending(self.delayed[0][2], self.delayed[0][0]):
            heapq.heappop(self.delayed)
        if not self.delayed:
            return None
        return self.jobs[self.delayed[0][2]].run_at

    def _push_ready(self, job: Job) -> None:
        self._push(job, (-job.priority, job.run_at.timestamp(), job.seq, job.id))

    def _push(self, job: Job, entry: ReadyEntry) -> None:
        key = self.ready_key(job)
        heap = self.ready.get(key)
        if heap is None:
            heap = self.ready[key] = []
            self.groups.setdefault((key[0], key[1]), {})[key[2]] = None
        heapq.heappush(heap, entry)

    def _is_pending(self, job_id: str, run_ts: float) -> bool:
        """True while the job of an entry due at `run_ts` is pending at that time."""
        job = self.jobs.get(job_id)
        return job is not None and job.status == Status.PENDING and job.run_at.timestamp() == run_ts


AgeEntry = tuple[float, int, str]  # (run_at, seq, job id)
_MIN_COMPACT = 64


class OldestByQueue:
    """Each queue's pending jobs by run_at, so the longest-waiting due job of a queue is
    found in O(1) amortized for a metrics scrape (the ready heaps are in claim order, and
    scanning them costs a pass over every due job). An entry whose job stopped being
    pending, or came back with another run_at, is dropped when it reaches the top; a heap
    is rebuilt from its live entries whenever it doubles, so stale ones never pile up."""

    def __init__(self, jobs: Mapping[str, Job]) -> None:
        self.jobs = jobs
        self.heaps: dict[str, list[AgeEntry]] = {}
        self._compact_at: dict[str, int] = {}

    def add(self, job: Job) -> None:
        """A job became pending (enqueued, retried, released or returned by the reaper)."""
        heap = self.heaps.setdefault(job.queue, [])
        heapq.heappush(heap, (job.run_at.timestamp(), job.seq, job.id))
        if len(heap) >= self._compact_at.get(job.queue, _MIN_COMPACT):
            heap[:] = [entry for entry in heap if self._live(entry)]
            heapq.heapify(heap)
            self._compact_at[job.queue] = max(_MIN_COMPACT, 2 * len(heap))

    def forget(self, queue: str) -> None:
        """The queue has no pending job any more: its entries are all stale."""
        self.heaps.pop(queue, None)
        self._compact_at.pop(queue, None)

    def oldest_due(self, queue: str, now_ts: float) -> float | None:
        """The earliest run_at among the queue's pending jobs if it is due by `now_ts`."""
        heap = self.heaps.get(queue)
        while heap and not self._live(heap[0]):
            heapq.heappop(heap)
        if not heap or heap[0][0] > now_ts:
            return None
        return heap[0][0]

    def _live(self, entry: AgeEntry) -> bool:
        job = self.jobs.get(entry[2])
        return (
            job is not None and job.status == Status.PENDING and job.run_at.timestamp() == entry[0]
        )
