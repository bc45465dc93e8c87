"""The engine: what the API may ask of a node, in one place.

It validates job types against the actors that live nodes run, resolves defaults
(the job's own fields win over the actor's, which win over the server's: `resolve_spec`),
and answers reads, waits, stats and readiness. What follows a write (metrics, logs,
webhooks, waking waiters) is the hooks' business. It knows nothing of HTTP.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

import msgspec
from goqueue.supervisor.common.bulk import CancelFilter, Cancelled, Purged, Replayed
from goqueue.supervisor.common.catalog import Catalog
from goqueue.supervisor.common.deliveries import Delivery
from goqueue.supervisor.common.enums import TERMINAL, Status, WorkerState
from goqueue.supervisor.common.errors import (
    Draining,
    InvalidJob,
    StoreError,
    StoreUnavailable,
    TooManyQueues,
    UnknownJobType,
)
from goqueue.supervisor.common.hooks import Hook
from goqueue.supervisor.common.jobs import (
    DEFAULT_MAX_RETRIES,
    Enqueued,
    Job,
    JobSpec,
    new_id,
    resolve_spec,
    spec_problem,
    utcnow,
)
from goqueue.supervisor.common.lifecycle import Lifecycle
from goqueue.supervisor.common.reads import QueueStats, Stats
from goqueue.supervisor.common.steps import Workflow, WorkflowRequest
from goqueue.supervisor.common.summaries import (
    REPORT_WORKERS,
    DeadFilter,
    LiveStats,
    NodeReport,
    QueueDepth,
    QueueSummary,
    WorkerSummary,
    rss_kb,
)
from goqueue.supervisor.observe.history import History
from goqueue.supervisor.observe.metrics import Metrics
from goqueue.supervisor.observe.shared_reads import Coalesced
from goqueue.supervisor.queue_budget import QueueBudget
from goqueue.supervisor.schedules.scheduler import Scheduler
from goqueue.supervisor.store.base import NewJob, Store
from goqueue.supervisor.store.new_workflow import WorkflowCreated, prepare_workflow
from goqueue.supervisor.waiters import Waiters
from goqueue.supervisor.webhooks.delivery import Webhooks
from goqueue.supervisor.workers.pool import Pool

if TYPE_CHECKING:  # imported only with --otel on
    from goqueue.supervisor.observe.tracing import Tracing

_TYPES_TTL = 2.0
BOOT_WAIT = 5.0  # seconds an enqueue waits for a booting node before 503
LIVE_STATS_TTL = 2.0  # store counts shared by every dashboard for this long
QUEUES_TTL = 2.0  # likewise the queue summaries (pausing a queue forgets them)
BUSIEST = 10


class Engine:
    """A node's operations as the API sees them."""

    def __init__(
        self,
        store: Store,
        pool: Pool,
        catalog: Catalog,
        hooks: Hook,
        metrics: Metrics,
        *,
        history: History,
        kill: Callable[[str], bool],
        webhooks: Webhooks,
        waiters: Waiters,
        schedules: Scheduler,
        lifecycle: Lifecycle,
        budget: QueueBudget,
        dispatch: Callable[[NewJob], Awaitable[Enqueued]] | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        self.store = store
        self.budget = budget  # --max-queues: every queue a job names is admitted first
        self.tracing = tracing  # --otel: a PRODUCER span for each enqueue
        self.pool = pool
        self.catalog = catalog
        self.hooks = hooks
        self.metrics = metrics  # for a scrape: the gauges, and the exposition
        self.kill = kill  # ends the attempt holding a lease token; False if none here
        self.waiters = waiters  # one of the hooks: outcomes recorded here wake them
        # periodic jobs (GET /schedules, enabling and disabling); the jobs they fire are
        # told to the enqueue hooks as the engine's own are
        self.schedules = schedules
        # stores a new job, starting it at once on a worker that waits for it (the
        # dispatcher's `enqueue`; the store's own without one)
        self.dispatch = dispatch or store.enqueue
        self.lifecycle = lifecycle  # the node's phase, moved by the arbiter
        self._types: frozenset[str] = frozenset()
        self._types_at = 0.0
        self.history = history
        self.webhooks = webhooks
        self._live = Coalesced(self._read_live_stats, LIVE_STATS_TTL)
        self._queues = Coalesced(self.store.queue_summaries, QUEUES_TTL)

    @property
    def draining(self) -> bool:
        """True once the node is shutting down: it accepts no new jobs."""
        return self.lifecycle.winding_down

    def set_catalog(self, catalog: Catalog, reserved: frozenset[str]) -> None:
        """Adopt the actors of a reload (and forget the cached list of known types), and
        the queues the node is there for, never refused by the queue budget."""
        self.catalog = catalog
        self._types_at = 0.0
        self.budget.reserve(reserved)

    # -- writes ----------------------------------------------------------------------

    async def enqueue(
        self,
        spec: JobSpec,
        *,
        idempotency_key: str | None = None,
        request_hash: str | None = None,
        strict: bool = True,
        parent_id: str | None = None,
    ) -> Enqueued:
        """Validate and store one job (`strict=False`: a type no live node runs yet)."""
        new = await self._prepare(spec, idempotency_key, request_hash, strict, parent_id)
        enqueued = await self.dispatch(new)
        if enqueued.created:
            self.hooks.after_enqueue(enqueued.job)
        return enqueued

    async def enqueue_child(self, spec: JobSpec, parent_id: str) -> str:
        """A job a running job asked for (`ctx.enqueue`), checked as POST /jobs checks
        one, with `parent_id` set; its id."""
        problem = spec_problem(spec)
        if problem is not None:
            raise InvalidJob(*problem)
        return (await self.enqueue(spec, parent_id=parent_id)).job.id

    def progress(self, job_id: str) -> msgspec.Raw | None:
        """The latest progress a running job reported, if it runs on this node."""
        return self.pool.progress_of(job_id)

    async def enqueue_many(
        self, specs: Sequence[JobSpec], *, strict: bool = True
    ) -> list[Enqueued | Exception]:
        """Validate and store several jobs, each answered on its own."""
        news: list[NewJob] = []
        answers: list[Enqueued | Exception | None] = []
        for spec in specs:
            try:
                news.append(await self._prepare(spec, None, None, strict))
                answers.append(None)
            except (UnknownJobType, InvalidJob, TooManyQueues) as exc:
                answers.append(exc)
        stored = iter(await self.store.enqueue_many(news) if news else [])
        out: list[Enqueued | Exception] = []
        for answer in answers:
            result = answer if answer is not None else next(stored)
            if isinstance(result, Enqueued) and result.created:
                self.hooks.after_enqueue(result.job)
            out.append(result)
        return out

    async def _prepare(
        self,
        spec: JobSpec,
        idempotency_key: str | None,
        request_hash: str | None,
        strict: bool,
        parent_id: str | None = None,
    ) -> NewJob:
        """Check types (templates too) and resolve the defaults."""
        if self.lifecycle.winding_down:
            raise Draining("the node is shutting down and accepts no new jobs")
        if not self.lifecycle.settled.is_set():
            await self.until_started()
        known = await self._known_types() if strict else None
        resolved = resolve_spec(spec, self.catalog.actors.get, known)
        await self.budget.admit_spec(resolved)
        new = NewJob(
            spec=resolved,
            max_retries=resolved.max_retries,
            idempotency_key=idempotency_key,
            request_hash=request_hash,
            parent_id=parent_id,
        )
        if self.tracing is not None:
            self.tracing.produced(new)
        return new

    @property
    def starting(self) -> bool:
        """True while the node boots (store, first worker, registration): an enqueue then
        waits up to `BOOT_WAIT` seconds for the boot to end, and is refused (503) after."""
        return self.lifecycle.booting

    async def until_started(self) -> None:
        """Return once the node has booted: at once if it has, else within `BOOT_WAIT`
        seconds, or raise StoreUnavailable (503), or Draining (503) as soon as the node
        gives its boot up."""
        settled = self.lifecycle.settled
        if settled.is_set():
            return
        try:
            async with asyncio.timeout(BOOT_WAIT):
                await settled.wait()
        except TimeoutError:
            raise StoreUnavailable("the node is starting and accepts no jobs yet") from None
        if self.draining:  # the boot failed or was stopped
            raise Draining("the node is shutting down and accepts no new jobs")

    def with_defaults(self, spec: JobSpec) -> JobSpec:
        """`spec` (and its templates) with queue, priority and retries filled in as they
        will be stored: the job's own, else its actor's, else the server's."""
        return resolve_spec(spec, self.catalog.actors.get, None, check=False)

    async def _known_types(self) -> frozenset[str]:
        """Types this node or (with a shared store) any live node can run; cached briefly."""
        now = time.monotonic()
        if now - self._types_at > _TYPES_TTL:
            self._types = self.catalog.types | await self.store.known_types()
            self._types_at = now
        return self._types | self.catalog.types

    async def submit_workflow(
        self,
        request: WorkflowRequest,
        *,
        idempotency_key: str | None = None,
        request_hash: str | None = None,
        strict: bool = True,
    ) -> WorkflowCreated:
        """Validate a workflow (`supervisor/store/new_workflow.py`) and store it whole."""

        async def prepare(spec: JobSpec) -> NewJob:
            return await self._prepare(spec, None, None, strict)

        new = await prepare_workflow(
            request,
            prepare,
            workflow_id=new_id(),
            idempotency_key=idempotency_key,
            request_hash=request_hash,
        )
        return await self.store.create_workflow(new)

    async def cancel_workflow(self, workflow_id: str) -> Workflow:
        """Cancel a workflow's unfinished steps; the running ones' workers are killed."""
        workflow, cancelled = await self.store.cancel_workflow(workflow_id)
        for job, token in cancelled:
            if token is not None:
                self.kill(token)
            self.hooks.after_cancel(job, token is not None)
        return workflow

    async def cancel(self, job_id: str, force: bool) -> Job:
        """Cancel a job; a running one (with `force`) has its worker killed, no retry."""
        job, token = await self.store.cancel(job_id, force)
        if token is not None and not self.kill(token):
            # another node holds the lease (behind a load balancer, the usual case): it
            # hears at once instead of at its next lease check
            await self.store.cancel_elsewhere(job.id, token)
        self.hooks.after_cancel(job, force)
        return job

    async def cancel_many(self, filters: CancelFilter, limit: int) -> Cancelled:
        """Cancel up to `limit` matching jobs; those running (forced) have their workers
        killed, as a single cancel's, and any lease held here is dropped."""
        cancelled = await self.store.cancel_many(filters, limit)
        for token in cancelled.tokens:
            self.kill(token)
        forced = Status.RUNNING in filters.statuses
        for job in cancelled.jobs:
            self.hooks.after_cancel(job, forced)
        return cancelled

    async def replay(self, dead_id: str) -> Job:
        """Re-enqueue a dead letter as a fresh job."""
        if self.draining:
            raise Draining("the node is shutting down and accepts no new jobs")
        dead = await self.store.get_dead(dead_id)
        if dead is not None:
            await self.budget.admit_spec(self.with_defaults(dead.job.replay_spec()), "job.")
        retries = dead.job.max_retries if dead else DEFAULT_MAX_RETRIES
        job = await self.store.replay_dead(dead_id, retries)
        self.hooks.after_enqueue(job)
        return job

    # -- reads -----------------------------------------------------------------------

    async def wait(self, job_id: str, seconds: float) -> Job | None:
        """One job, once it has finished or when `seconds` have passed (its state then).
        Waiting holds no store connection: see `Waiters`."""
        with self.waiters.watching(job_id) as finished:
            job = await self.store.get(job_id)
            if job is None or job.status in TERMINAL:
                return job
            try:
                async with asyncio.timeout(seconds):
                    done = await finished
            except TimeoutError:
                done = None
        return done or await self.store.get(job_id) or job

    async def deliveries(self, job_id: str) -> list[Delivery] | None:
        """A job's webhook deliveries, oldest first; None when there is no such job."""
        found = await self.webhooks.deliveries(job_id)
        if not found and await self.store.get(job_id) is None:
            return None
        return found

    async def stats(self) -> tuple[Stats, dict[str, int]]:
        """Store counts plus this node's workers by state."""
        return await self.store.stats(), self.workers()

    async def set_paused(self, queue: str, paused: bool) -> QueueStats:
        """Pause or resume a queue; answers its stats. A paused queue counts in the
        queue budget even empty, so pausing admits it first."""
        if paused:
            await self.budget.admit(queue, "name")
        await self.store.set_paused(queue, paused)
        self._queues.invalidate()
        return await self.store.queue_stats(queue)

    async def purge_dead(self, dead_id: str) -> bool:
        """Delete a dead letter."""
        return await self.store.purge_dead(dead_id)

    async def replay_many(self, filters: DeadFilter, limit: int) -> Replayed:
        """Re-enqueue up to `limit` matching dead letters, oldest first: their queues are
        admitted first (read just before the replay: a guard, not a lock), so a refusal
        names the first queue refused and replays none."""
        if self.draining:
            raise Draining("the node is shutting down and accepts no new jobs")
        first = await self.store.dead_briefs(filters, limit, 0, 1)
        page = first
        if first.total > limit:  # listed newest first: the oldest `limit` are the last ones
            page = await self.store.dead_briefs(filters, limit, first.total - limit, 1)
        for queue in dict.fromkeys(brief.queue for brief in page.items):
            await self.budget.admit(queue)
        replayed = await self.store.replay_dead_many(filters, limit)
        for job in replayed.jobs:
            self.hooks.after_enqueue(job)
        return replayed

    async def purge_many(self, filters: DeadFilter, limit: int) -> Purged:
        """Delete up to `limit` matching dead letters, oldest first."""
        return await self.store.purge_dead_many(filters, limit)

    async def refresh_gauges(self) -> None:
        """Bring the gauges up to date for a scrape. Queue depth is read from the store
        here, on demand, not on a timer, and bounded: the deepest queues only."""
        self.metrics.set_workers(self.workers())
        self.metrics.set_upkeep(self.store.upkeep())
        try:
            async with asyncio.timeout(5):
                depths = await self.store.queue_depths(self.metrics.depth_queues)
        except (StoreError, TimeoutError):
            return  # the scrape still answers; depth keeps its last value
        self.metrics.set_depth(depths)
        self.history.note_depth(depths.pending)
        try:
            async with asyncio.timeout(5):
                flows = await self.store.workflow_counts()
        except (StoreError, TimeoutError):
            return
        self.metrics.set_workflows(flows.by_status, flows.steps_waiting)

    def workers(self) -> dict[str, int]:
        """Workers by state (busy, idle, booting, stopping)."""
        counts: dict[str, int] = dict.fromkeys(WorkerState, 0)
        for worker in self.pool:
            counts[worker.state] += 1
        return counts

    def store_warning(self) -> str | None:
        """What the store says holds its upkeep back (a long transaction), if anything."""
        return self.store.upkeep().warning

    async def readiness(self) -> dict[str, bool]:
        """The checks behind /ready: store reachable, a worker up, not draining."""
        try:
            store_ok = await self.store.ping()
        except Exception:
            store_ok = False
        workers_up = self.pool.count(WorkerState.IDLE, WorkerState.BUSY) > 0
        accepting = not (self.draining or self.starting)
        return {"store": store_ok, "workers": workers_up, "accepting": accepting}

    # -- summaries for operators (the dashboard) -------------------------------------
    # Cheap to ask often: store reads are shared between callers for a second or two, and
    # the rest comes from memory (the history ring buffer, the pool).

    async def live_stats(self) -> LiveStats:
        """Store counts at most `LIVE_STATS_TTL` old, one read shared by every caller."""
        return await self._live.get()

    async def _read_live_stats(self) -> LiveStats:
        stats = await self.store.stats()
        self.history.note_depth(stats.counts.get("pending", 0))
        depths = [QueueDepth(name, sum(d.values())) for name, d in stats.queues.items()]
        depths = [d for d in depths if d.pending]
        depths.sort(key=lambda d: (-d.pending, d.name))
        return LiveStats(utcnow(), stats.counts, stats.dead_letters, depths[:BUSIEST])

    async def queue_summaries(self) -> list[QueueSummary]:
        """Every queue with work or paused, at most `QUEUES_TTL` old."""
        return await self._queues.get()

    def node_report(self) -> NodeReport:
        """What this node publishes with its heartbeat: its workers, its last minute."""
        done, failed = self.history.recent(60)
        return NodeReport(self.worker_summaries()[:REPORT_WORKERS], done, failed)

    def worker_summaries(self) -> list[WorkerSummary]:
        """This node's worker processes by slot, with the attempt each is running."""
        now = time.monotonic()
        out = []
        for worker in sorted(self.pool, key=lambda w: (w.slot, w.pid)):
            lease = worker.lease
            job = lease.job if lease is not None else None
            busy = job is not None and worker.state == WorkerState.BUSY
            out.append(
                WorkerSummary(
                    pid=worker.pid,
                    slot=worker.slot,
                    generation=worker.generation,
                    state=worker.state,
                    retiring=worker.retire,
                    job_id=job.id if job is not None else None,
                    job_type=job.type if job is not None else None,
                    attempt=job.attempts if job is not None else None,
                    running_seconds=max(0.0, now - worker.attempt_started) if busy else None,
                    rss_kb=rss_kb(worker.pid) or worker.rss_kb or None,
                    jobs_run=worker.jobs_run,
                )
            )
        return out
