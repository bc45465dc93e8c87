"""The store interface: everything the engine and the API ask of a store.

Ordering (priority, then `run_at`, then enqueue order), delays and retries live in what
`claim` returns; a retry is `fail(..., retry_at=...)` making the job due again later.
Every write about an attempt is fenced by the lease token: a stale holder gets `None`.

Except one that is late, not stale: when an outcome (`complete`, `fail`) arrives after
its lease was reaped and no later attempt has started, the store writes it in one atomic
step. The reaping's dead letter is removed, or its pending retry dropped (or its claim by
a node that has not started it yet voided), the reaping's error is dropped from the job's
errors, a `late_outcome` event (`LATE_OUTCOME`) is written, and the job then ends as the
attempt did, as if the outcome had come in time. It is refused (None) as before when a
later attempt has started (the job's attempts moved on), when the reaping dead-lettered
a job that has an `on_failure` (that follow-up is already enqueued), when its dead
letter is gone (replayed, purged), when its unique key is held by another job again, or
when the job was cancelled. The attempt stays counted either way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Protocol

import msgspec
from goqueue.supervisor.common.bulk import CancelFilter, Cancelled, Purged, Replayed
from goqueue.supervisor.common.jobs import DeadLetter, Enqueued, Event, Job, JobSpec, Lease, Outcome
from goqueue.supervisor.common.rates import Rate, Taken
from goqueue.supervisor.common.reads import JobFilter, Page, QueueDepths, QueueStats, Stats
from goqueue.supervisor.common.schedule import Fired, ScheduleState
from goqueue.supervisor.common.summaries import (
    DeadFilter,
    NodeReport,
    NodeSummary,
    QueueSummary,
    TypeStats,
)

MAX_KEY_HOLDS = 10_000  # keys at their limit a summary reads, at most
LATE_OUTCOME = "the outcome arrived after its lease was reaped"  # its event's detail
EVENTS_KEPT = 100  # a job's audit trail in the embedded stores: its first events, at most
RUN_TIMES_SAMPLE = 10_000  # the latest finished jobs the Types page's percentiles come from
SCHEDULE_WALK = 1_000  # jobs the Queues page walks on one side of now before the other

if TYPE_CHECKING:  # `workflows` builds on `NewJob`, defined here
    from goqueue.supervisor.common.enums import WorkflowStatus
    from goqueue.supervisor.common.steps import Workflow, WorkflowCounts
    from goqueue.supervisor.store.new_workflow import NewWorkflow, WorkflowCreated


class StartNow(msgspec.Struct, frozen=True, gc=False):
    """What a waiting worker could run instead of a job it asks to start at its enqueue:
    a due pending job of one of these types, in these queues (None: any), is ahead."""

    types: frozenset[str]
    queues: frozenset[str] | None = None


class NewJob(msgspec.Struct, kw_only=True):
    """An enqueue request after defaults are resolved by the engine."""

    spec: JobSpec
    max_retries: int
    idempotency_key: str | None = None
    request_hash: str | None = None
    parent_id: str | None = None  # set on a job a running job enqueued (`ctx.enqueue`)
    # A worker of this node waits for it: store it already started as this node's
    # attempt (`Enqueued.lease`) when it may run now (see `Store.enqueue`).
    start: StartNow | None = None
    # the enqueue's trace context (W3C `traceparent`...), with --otel: stored with the job
    trace_context: dict[str, str] | None = None


def _cancels_nothing(token: str) -> bool:
    return False


def _no_report() -> NodeReport | None:
    return None


@dataclass(frozen=True, slots=True)
class NodeLinks:
    """What a store calls back into its node for, beside the dispatcher's wake-up: made
    whole by the node's builder once the parts that answer are built, and given to the
    store when it is opened (`Store.open`). A store opened without them cancels nothing
    and publishes no report."""

    cancel: Callable[[str], bool] = _cancels_nothing
    """The dispatcher's `cancel_lease`: another node cancelled a job whose attempt holds
    this token here (PostgreSQL: a NOTIFY). False if no attempt here holds it."""
    report: Callable[[], NodeReport | None] = _no_report
    """The engine's `node_report`: what this node publishes with each heartbeat (its
    workers, its last minute), which `nodes` answers for every node."""


@dataclass(frozen=True, slots=True)
class Upkeep:
    """How a store is looking after itself, as of its last look (no I/O to ask): on
    PostgreSQL the jobs table's dead row versions, the age of the database's oldest open
    snapshot, the VACUUMs this node ran and, when a snapshot holds cleanup back, a
    warning naming it. A store with nothing to look after answers the defaults."""

    dead_rows: int | None = None
    oldest_snapshot_seconds: float | None = None
    vacuums: int = 0
    warning: str | None = None


@dataclass(frozen=True, slots=True)
class StoreTraits:
    """What a store is like, as far as dispatch cares: one value per store class
    (`Store.traits`), read once by the dispatcher when it is made. A new store picks
    the fields that describe it, or one of the values below when one fits."""

    durable: bool
    """The store outlives the node (a file, a database): an attempt queued on a worker
    runs only once its start is written, so a job that kills its node is charged for it.
    False in memory, where nothing outlives the node: it starts when its worker says so."""
    answers_at_once: bool
    """No call ever waits (in memory): an outcome is written in the step that hears of
    it, with no task. False when every call is a round trip."""
    sees_ahead: bool
    """`enqueue` checks itself, for every node's jobs, that no job a waiting worker could
    run is due ahead of one it asks to start (`NewJob.start`). False when only the
    dispatcher's own last claim can tell (one process owns the store)."""


IN_PROCESS = StoreTraits(durable=False, answers_at_once=True, sees_ahead=False)
"""A store in the node's own memory (`MemoryStore`)."""
SHARED = StoreTraits(durable=True, answers_at_once=False, sees_ahead=True)
"""A database several nodes share (`PostgresStore`)."""
EMBEDDED = StoreTraits(durable=True, answers_at_once=False, sees_ahead=False)
"""A file one node owns (`SqliteStore`): every write waits for its commit, as with a
database, but the node's own last claim tells what waits ahead, as in memory."""


class ClaimStarts:
    """Which of a claim's jobs start at once, asked job by job in claim order
    (`Store.claim`): the best `start` (all when None), and those that lead the claim
    with a type in `start_types`."""

    __slots__ = ("_asked", "_leading", "start", "start_types")

    def __init__(self, start: int | None, start_types: frozenset[str]) -> None:
        self.start = start
        self.start_types = start_types
        self._asked = 0
        self._leading = True  # every job so far is of one of `start_types`

    def __call__(self, job_type: str) -> bool:
        """Whether the next job, of `job_type`, starts."""
        best = self.start is None or self._asked < self.start
        self._asked += 1
        self._leading = self._leading and job_type in self.start_types
        return best or self._leading


class Store(Protocol):
    """What a job store provides. Every implementation passes `tests/e2e/store`.

    A store is given, when it is made, the dispatcher's wake-up: a zero-argument
    callable it calls when work may be claimable (a job enqueued or made due, here or,
    with a shared store, on another node); it is given its node's `NodeLinks` when it is
    opened."""

    node_id: str
    traits: StoreTraits

    async def reserve(self) -> None:
        """Take what only this node may hold, before it listens (the SQLite file's lock);
        BootError naming it when another node holds it. Quick, and nothing else."""

    async def open(self, links: NodeLinks | None = None) -> None:
        """Connect / create the schema, and keep `links`; called once before use."""

    async def close(self) -> None:
        """Release connections and background tasks."""

    async def ping(self) -> bool:
        """True when the store answers (readiness)."""

    def upkeep(self) -> Upkeep:
        """How the store is looking after itself (`Upkeep`), without a round trip."""

    async def register_node(
        self,
        limits: Mapping[str, int | None],
        *,
        key_limits: Mapping[str, int] | None = None,
        key_rates: Mapping[str, Rate] | None = None,
    ) -> None:
        """Declare this node alive with the job types it runs and their concurrency
        limits (None = unlimited), and the per-key limits and rates of the types that
        have one (`key_concurrency`, `key_rate_limit`: claims bound and pace the jobs of
        a type sharing a `concurrency_key`, `common/flow.py`). Called at start, on reload
        and periodically; with PostgreSQL the smallest limit (the slowest rate) among live
        nodes holds for a type globally, and for its keys."""

    async def key_holds(self, limits: Mapping[str, int]) -> list[tuple[str, str, int, int]]:
        """The keys of the types in `limits` (type -> key_concurrency) with at least
        that many jobs claimed or running: (type, key, claimed and running, pending);
        at most `MAX_KEY_HOLDS` of them (`common/flow.py: type_keys` sums them up)."""

    def key_waits(self) -> list[str]:
        """The types of which a claim that came back short held jobs back by their key
        (at its limit, or its pace not due), one entry per such claim, since last asked
        (the metric `goqueue_key_limit_waits_total`)."""

    async def known_types(self) -> frozenset[str]:
        """Job types some live node can run (this node's alone for the memory store)."""

    async def enqueue(self, new: NewJob) -> Enqueued:
        """Store one job. Dedupe and idempotency are checked in the same atomic step.

        Raises DuplicateJob, IdempotencyMismatch, StoreFull, StoreUnavailable.
        A repeat of an idempotency key with the same `request_hash` returns the
        original job with `created=False`.

        With `new.start`, a job created due now, in a queue not paused and of a type under
        no global limit, with (where `traits.sees_ahead`) no pending job `new.start` names due
        ahead of it (at least its priority), is stored running: its first attempt
        started, leased to this node (`Enqueued.lease`), in the same atomic step, and no
        claim is woken for it.
        Otherwise (or when the store does not do it for this job) it is stored pending.
        """

    async def enqueue_many(self, news: Sequence[NewJob]) -> list[Enqueued | Exception]:
        """Store several jobs; each answered on its own (an Exception instance on refusal)."""

    async def claim(
        self,
        limit: int,
        queues: frozenset[str] | None,
        slots: Mapping[str, int],
        start: int | None = None,
        start_types: frozenset[str] = frozenset(),
    ) -> list[Lease]:
        """Take up to `limit` due jobs, highest priority first, as leases.

        Only types present in `slots` are taken, at most `slots[type]` of each (the
        node's free per-type capacity). `queues=None` means every queue. Paused queues
        are skipped. The best `start` of them (all when None) start at once: `running`,
        `attempts` incremented, `started_at` set, a `started` event. So may those that
        lead the claim, in its order, with a type in `start_types` (the run of them
        ending at the first job of another type): every store starts all of them. The others
        are `claimed`: held under the lease, no attempt charged, no `started_at`, until
        `start` is called for them.
        """

    async def start(self, lease: Lease) -> Lease | None:
        """Start the attempt of a `claimed` lease (as a claim starts one) and extend the
        lease, durably, before a worker gets it; the lease with the job as it now is, or
        None if it is stale."""

    async def heartbeat(self, leases: Sequence[Lease], lease_seconds: float) -> list[str]:
        """Extend the leases (running or claimed); return the tokens no longer held
        (cancelled or taken over)."""

    async def reap_expired(self, retry_delay: Callable[[int], float] | None = None) -> list[Job]:
        """Take back the jobs whose lease expired; returns the jobs touched. A `claimed`
        job goes back to pending in its place (its `run_at` unchanged), at no cost. A
        running one lost its attempt: pending again after `retry_delay(attempts)`
        seconds (at once when None), or dead-lettered when that was its last retry."""

    async def complete(self, lease: Lease, result: msgspec.Raw | None) -> Outcome | None:
        """Record success and enqueue `on_success` atomically; None if the lease is stale
        (a late outcome is written if it may be: see the module)."""

    async def fail(
        self, lease: Lease, error: str, retry_at: datetime | None, traceback: str | None = None
    ) -> Outcome | None:
        """Record a failed attempt (its error, and `traceback` with it and in its
        `attempt_failed` event): pending again at `retry_at`, or (None) dead-lettered
        with `on_failure` enqueued atomically. None if the lease is stale (a late outcome
        is written if it may be: see the module)."""

    async def release(self, lease: Lease) -> bool:
        """Hand a running or claimed job back to pending in its place, without counting
        the attempt (shutdown, a lease in hand gone stale)."""

    async def cancel(self, job_id: str, force: bool) -> tuple[Job, str | None]:
        """Cancel a pending or claimed job, or a running one with `force`.

        Returns the job and the token of the lease it had (when it was running or
        claimed) so the engine can kill the worker or drop the lease in hand. Raises
        NotFound, or InvalidState when terminal or when running without `force`.
        """

    async def cancel_many(self, filters: CancelFilter, limit: int) -> Cancelled:
        """Cancel up to `limit` unfinished jobs passing `filters`, oldest first, in one
        statement (one transaction on PostgreSQL); each gets a `cancelled` event whose
        detail says it was a bulk cancel. A job another request is changing is skipped
        and counted as remaining."""

    async def get(self, job_id: str) -> Job | None:
        """One job by id."""

    async def list_jobs(self, filters: JobFilter, limit: int, offset: int) -> Page:
        """Jobs newest first."""

    async def stats(self) -> Stats:
        """Counts by status, pending depth by queue and priority, dead letters."""

    async def queue_stats(self, queue: str) -> QueueStats:
        """One queue's counts (all zero for a queue never seen)."""

    async def queue_depths(self, top: int) -> QueueDepths:
        """Pending jobs by priority of the `top` deepest queues and of all others summed:
        a bounded answer for metrics, however many queues there are."""

    async def queue_names(self, limit: int) -> frozenset[str]:
        """Up to `limit` names of queues holding pending jobs or paused (the queues that
        `--max-queues` counts)."""

    async def set_paused(self, queue: str, paused: bool) -> None:
        """Pause or resume dispatch from a queue (for every node sharing the store)."""

    async def list_dead(self, limit: int, offset: int, filters: DeadFilter | None = None) -> Page:
        """Dead letters newest first; with `filters`, those passing them (the letters a
        bulk action with the same filters would take, listed the other way round)."""

    async def get_dead(self, dead_id: str) -> DeadLetter | None:
        """One dead letter by its own id, else by its job's id (a job has at most one)."""

    async def replay_dead(self, dead_id: str, max_retries: int) -> Job:
        """Enqueue a fresh job from a dead letter and remove the letter, atomically.
        Raises NotFound, StoreFull, StoreUnavailable (the letter then stays)."""

    async def purge_dead(self, dead_id: str) -> bool:
        """Delete a dead letter; False if there was none."""

    async def replay_dead_many(self, filters: DeadFilter, limit: int) -> Replayed:
        """Replay up to `limit` letters passing `filters`, oldest first: each becomes a
        fresh job (its own retries, no dedupe or unique key) and goes, atomically (in one
        transaction on PostgreSQL). `remaining` counts matching letters left."""

    async def purge_dead_many(self, filters: DeadFilter, limit: int) -> Purged:
        """Delete up to `limit` letters passing `filters`, oldest first."""

    async def events(self, job_id: str) -> list[Event]:
        """A job's audit trail, oldest first."""

    async def prune(self, finished_before: datetime, limit: int) -> int:
        """Delete up to `limit` finished jobs (done, failed, cancelled) that finished before
        `finished_before`, with their audit trails; dead letters stay. Returns how many."""

    def next_due_at(self) -> datetime | None:
        """When the earliest not-yet-due pending job becomes due (None if unknown/none);
        lets the dispatcher sleep instead of polling."""

    async def cancel_elsewhere(self, job_id: str, token: str) -> None:
        """Tell the other nodes that `job_id`, whose lease `token` no attempt here holds,
        was cancelled, so its holder kills the worker now rather than at its next lease
        check. A store no other node shares does nothing."""

    # -- rate limits -------------------------------------------------------------------

    async def take_starts(self, job_type: str, rate: Rate, want: int) -> Taken:
        """Take up to `want` of the starts of `job_type` due now under `rate` (GCRA, see
        `common/rates.py`; PostgreSQL: across every node, on the database's clock;
        memory: this node's). Raises StoreUnavailable."""

    async def return_starts(self, job_type: str, tat: float, count: int) -> None:
        """Give back `count` starts a take left at TAT `tat` and did not use; nothing if
        starts were taken since."""

    # -- periodic jobs -----------------------------------------------------------------

    async def schedule_states(self) -> dict[str, ScheduleState]:
        """What the store remembers of each schedule, by name (one never fired nor
        switched is absent). PostgreSQL: every node's; memory: this node's since it
        started."""

    async def fire_schedule(
        self, name: str, tick: datetime, new: NewJob, *, missed: bool = False
    ) -> tuple[Fired, Job | None]:
        """Store `new` as the job of schedule `name`'s tick at `tick`, and make it the
        schedule's last fire, atomically and at most once per tick however many nodes
        try: (FIRED, the job); (TAKEN, None) if this tick or a later one was fired
        already; (DISABLED, None) if the schedule is disabled. The job's `enqueued`
        event names the schedule and the tick (and says `missed` when the tick passed
        while no node ran). Raises StoreFull, StoreUnavailable."""

    async def set_schedule_enabled(self, name: str, enabled: bool) -> ScheduleState:
        """Enable or disable a schedule (PostgreSQL: for every node, and kept across
        restarts); returns its state."""

    # -- workflows (see `store/new_workflow.py`) --------------------------------------
    # `complete` makes pending, in its atomic step, each waiting step whose last parent
    # it completes (`Outcome.released`), handing it the parent's result (`Job.parents`);
    # a dead-lettering (`fail`, `reap_expired`) or a `cancel` cancels, in its atomic step,
    # every waiting step depending on the job, naming it; `replay_dead` of a step puts
    # the fresh job in its place and makes the steps its failure cancelled wait again.

    async def create_workflow(self, new: NewWorkflow) -> WorkflowCreated:
        """Store every step of `new` at once or none: roots pending, the others waiting
        with their count of unfinished parents. An Idempotency-Key repeated with the same
        `request_hash` answers the first workflow (`created=False`), with another one
        raises IdempotencyMismatch. Raises StoreFull, StoreUnavailable."""

    async def get_workflow(self, workflow_id: str) -> Workflow | None:
        """One workflow with its steps' live statuses."""

    async def list_workflows(self, status: WorkflowStatus | None, limit: int, offset: int) -> Page:
        """Workflows (`Workflow`) newest first, of `status` when given."""

    async def cancel_workflow(
        self, workflow_id: str
    ) -> tuple[Workflow, list[tuple[Job, str | None]]]:
        """Cancel every unfinished step (a running one too); the jobs cancelled, each with
        the lease token it had (to kill its worker). Raises NotFound, InvalidState."""

    async def workflow_counts(self) -> WorkflowCounts:
        """Workflows by status, and steps waiting (for metrics)."""

    # -- summaries for operators (the dashboard): compact, previews cut by the store --

    async def queue_summaries(self) -> list[QueueSummary]:
        """Every queue with pending or running jobs, and every paused queue, by name."""

    async def nodes(self) -> list[NodeSummary]:
        """The nodes sharing this store that heartbeated within the last hour (this node
        alone for the memory store), by id."""

    async def type_stats(self) -> list[TypeStats]:
        """Every job type among the jobs kept: counts by status, p50/p95 run time of the
        finished ones, failure rate (the dashboard's Types page)."""

    async def job_briefs(self, filters: JobFilter, limit: int, offset: int, preview: int) -> Page:
        """Like `list_jobs`, as `JobBrief` rows whose payload, result and error are cut to
        `preview` characters."""

    async def dead_briefs(self, filters: DeadFilter, limit: int, offset: int, preview: int) -> Page:
        """Dead letters newest first, filtered, as `DeadBrief` rows."""
