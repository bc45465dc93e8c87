"""The arbiter: a node's main loop, in the manner of a pre-fork server.

Signal handlers only queue the signal; the loop drains the queue into small `handle_*`
methods, then once per tick runs `manage_workers()` and the lease chores. Deadlines are
timers in the pool, so a hung attempt is killed on time whatever the tick is doing.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta

from goqueue.actors.protocol import BootFailed, JobDone, JobFailed, Ready
from goqueue.supervisor.catalog import Catalog
from goqueue.supervisor.config import Settings
from goqueue.supervisor.dispatch import Dispatcher
from goqueue.supervisor.engine import Engine
from goqueue.supervisor.errors import StoreUnavailable
from goqueue.supervisor.jobs import utcnow
from goqueue.supervisor.metrics import Metrics
from goqueue.supervisor.pool import BUSY, IDLE, STOPPING, Pool, Worker, describe_exit
from goqueue.supervisor.store.base import Store
from goqueue.supervisor.webhooks import WebhookSender

log = logging.getLogger("goqueue.arbiter")

EXIT_OK = 0
EXIT_BOOT_ERROR = 3
TICK = 0.5
SWEEP = 5.0  # seconds between claims that no notification asked for
PRUNE_EVERY = 60.0  # seconds between deletions of expired finished jobs
PRUNE_BATCH = 10_000
SIGNALS = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGTTIN,
    signal.SIGTTOU,
)


class BootError(Exception):
    """The first worker could not import the actor modules."""


@dataclass
class Hooks:
    """What the command that starts a node plugs in: the HTTP server and config reload."""

    start_http: Callable[[Engine], Awaitable[None]]
    stop_http: Callable[[], Awaitable[None]]
    reload_settings: Callable[[], Settings]


class Arbiter:
    """Owns the worker processes, the dispatcher and the node's lifecycle."""

    def __init__(self, settings: Settings, store: Store, hooks: Hooks) -> None:
        self.settings = settings
        self.store = store
        self.hooks = hooks
        self.metrics = Metrics()
        self.target = settings.workers
        self.generation = 0
        self.exit_code = EXIT_OK
        self._signals: list[int] = []
        self._wakeup = asyncio.Event()
        self._changed = asyncio.Event()  # a job finished or a worker exited
        self._stopping: asyncio.Task[None] | None = None
        self._done = asyncio.Event()
        self._probe: Worker | None = None
        self._pending_settings: Settings | None = None
        self._first_ready: asyncio.Future[Ready] | None = None
        self._spawn_failures = 0
        self._next_spawn = 0.0
        self._last_heartbeat = 0.0
        self._last_sweep = 0.0
        self._last_prune = 0.0
        self._tasks: list[asyncio.Task[None]] = []

    # -- start -----------------------------------------------------------------------

    async def run(self) -> int:
        """Start the node, loop until stopped, return the exit code."""
        loop = asyncio.get_running_loop()
        self.webhooks = WebhookSender(
            secret=self.settings.webhook_secret.encode() if self.settings.webhook_secret else None,
            timeout=self.settings.webhook_timeout,
            allow_hosts=frozenset(self.settings.webhook_allow_hosts or ()) or None,
            on_outcome=self.metrics.webhook,
        )
        self.pool = Pool(loop, self, self.settings.actors, kill_grace=self.settings.kill_grace)
        try:
            catalog = await self._boot()
        except BootError as exc:
            log.error(f"cannot start: {exc}")
            await self.pool.shutdown(2.0)
            return EXIT_BOOT_ERROR
        self.catalog = catalog
        self.metrics.declare_types(catalog.types)
        self.dispatcher = self._make_dispatcher(catalog)
        self.engine = Engine(
            self.store, self.pool, catalog, self.metrics, self.webhooks, kill=self._kill_token
        )
        self.store.set_waker(self.dispatcher.wake)
        await self.store.register_node(catalog.limits())
        await self.webhooks.start()
        self.manage_workers()
        self._tasks.append(asyncio.ensure_future(self.dispatcher.run()))
        for sig in SIGNALS:
            loop.add_signal_handler(sig, self._queue_signal, sig)
        await self.hooks.start_http(self.engine)
        log.info(
            "node started",
            extra={
                "workers": self.target,
                "node": self.store.node_id,
                "types": sorted(catalog.types),
            },
        )
        gc.freeze()  # boot-time objects never die: keep them out of every future collection
        self.dispatcher.wake()
        await self._main_loop()
        for sig in SIGNALS:
            loop.remove_signal_handler(sig)
        return self.exit_code

    async def _boot(self) -> Catalog:
        """Open the store (waiting for it if it is not up yet), spawn the first worker and
        learn the actors from its Ready message."""
        delay = 0.5
        while True:
            try:
                await self.store.open()
                break
            except StoreUnavailable as exc:
                log.warning(f"store unavailable at start; retrying in {delay:g}s: {exc}")
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)
        self._first_ready = asyncio.get_running_loop().create_future()
        self.pool.spawn(self.generation)
        ready = await self._first_ready
        return Catalog(ready.actors, self.settings.limits)

    def _make_dispatcher(self, catalog: Catalog) -> Dispatcher:
        queues = frozenset(self.settings.queues) if self.settings.queues else None
        return Dispatcher(
            self.store,
            self.pool,
            catalog,
            queues=queues,
            default_timeout=self.settings.default_timeout,
            retry_base=self.settings.retry_base,
            retry_cap=self.settings.retry_cap,
            on_outcome=lambda outcome: self.engine.finished(outcome),
            on_attempt=self.metrics.attempt,
            # a store whose claims cost a round trip keeps a worker's worth in hand
            prefetch=self.target if getattr(self.store, "claim_ahead", False) else 0,
        )

    # -- the loop --------------------------------------------------------------------

    def _queue_signal(self, sig: int) -> None:
        self._signals.append(sig)
        self._wakeup.set()

    async def _main_loop(self) -> None:
        while not self._done.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), TICK)
            self._wakeup.clear()
            while self._signals:
                self._handle(self._signals.pop(0))
            if self._done.is_set():
                break
            try:
                self.manage_workers()
                await self._chores()
            except Exception:  # keep supervising; the next tick tries again
                log.exception("supervisor tick failed")

    def _handle(self, sig: int) -> None:
        name = signal.Signals(sig).name
        log.info("signal received", extra={"signal": name})
        handler = getattr(self, f"handle_{name[3:].lower()}")
        handler()

    def handle_term(self) -> None:
        """Graceful shutdown; a second TERM/INT stops now."""
        if self._stopping is None:
            self._stopping = asyncio.ensure_future(self._shutdown(self.settings.shutdown_grace))
        else:
            log.warning("second stop signal: stopping now")
            self._kill_busy("shutdown")

    handle_int = handle_term

    def handle_quit(self) -> None:
        """Fast exit: running attempts are killed at once and handed back."""
        if self._stopping is None:
            self._stopping = asyncio.ensure_future(self._shutdown(0.0))
        else:
            self._kill_busy("shutdown")

    def handle_hup(self) -> None:
        """Reload: re-read config, boot a probe worker with fresh actor modules."""
        if self._stopping is not None or self._probe is not None:
            log.warning("reload ignored: a reload or a shutdown is already under way")
            return
        try:
            settings = self.hooks.reload_settings()
        except Exception as exc:
            log.error(f"reload aborted: {exc}")
            return
        self._pending_settings = settings
        self._probe = self.pool.spawn(self.generation + 1, settings.actors)

    def handle_ttin(self) -> None:
        """One worker more."""
        self.target += 1
        log.info("worker count raised", extra={"workers": self.target})

    def handle_ttou(self) -> None:
        """One worker fewer (never below one)."""
        if self.target > 1:
            self.target -= 1
        log.info("worker count lowered", extra={"workers": self.target})

    # -- workers ---------------------------------------------------------------------

    def manage_workers(self) -> None:
        """Spawn up to the target; retire extras, preferring idle ones."""
        if self._stopping is not None:
            return
        live = [
            w for w in self.pool if w.state != STOPPING and not w.retire and w is not self._probe
        ]
        excess = len(live) - self.target
        for worker in sorted(live, key=lambda w: w.state != IDLE)[: max(0, excess)]:
            self._retire(worker)
        now = time.monotonic()
        for _ in range(max(0, -excess)):
            if now < self._next_spawn:
                return
            self.pool.spawn(self.generation)

    def _retire(self, worker: Worker) -> None:
        worker.retire = True
        if worker.state == IDLE:
            self.pool.stop(worker)

    def _kill_busy(self, reason: str) -> None:
        for worker in self.pool:
            if worker.state == BUSY or (worker.state == STOPPING and worker.lease):
                self.pool.kill(worker, reason)

    def _kill_token(self, token: str) -> bool:
        worker = self.pool.holding(token)
        if worker is None:
            return self.dispatcher.drop(token)
        self.pool.kill(worker, "cancel")
        return True

    async def _chores(self) -> None:
        """Heartbeat leases, reap expired ones, refresh gauges (a third of a lease apart)."""
        now = time.monotonic()
        self._refresh_gauges()
        if now - self._last_sweep >= SWEEP:
            self._last_sweep = now
            self.dispatcher.wake()  # a safety net under notifications, never for latency
        if self.settings.retention_seconds and now - self._last_prune >= PRUNE_EVERY:
            self._last_prune = now
            await self._prune(self.settings.retention_seconds)
        if now - self._last_heartbeat < self.settings.lease_seconds / 3:
            return
        self._last_heartbeat = now
        leases = [w.lease for w in self.pool if w.lease is not None]
        leases += self.dispatcher.buffer
        try:
            lost = await self.store.heartbeat(leases, self.settings.lease_seconds)
            if await self.store.reap_expired():
                self.dispatcher.wake()
            await self.store.register_node(self.catalog.limits())
        except StoreUnavailable as exc:
            log.warning("heartbeat failed: store unavailable", extra={"err": str(exc)})
            return
        for token in lost:
            self.dispatcher.drop(token)
            worker = self.pool.holding(token)
            if worker is not None:
                log.warning("lease lost; killing its worker", extra={"worker_pid": worker.pid})
                self.pool.kill(worker, "lease_lost")

    async def _prune(self, retention: float) -> None:
        """Delete finished jobs past their retention (one batch per pass)."""
        cutoff = utcnow() - timedelta(seconds=retention)
        try:
            pruned = await self.store.prune(cutoff, PRUNE_BATCH)
        except StoreUnavailable as exc:
            log.warning("pruning skipped: store unavailable", extra={"err": str(exc)})
            return
        if pruned:
            log.info("pruned finished jobs", extra={"count": pruned, "before": cutoff.isoformat()})

    def _refresh_gauges(self) -> None:
        counts = self.engine.workers()
        self.metrics.set_workers(counts)
        self.metrics.set_running(counts["busy"])

    # -- pool events -----------------------------------------------------------------

    def worker_ready(self, worker: Worker, message: Ready) -> None:
        """A worker booted: the first defines the catalog, a probe completes a reload."""
        self._spawn_failures = 0
        if self._first_ready is not None and not self._first_ready.done():
            self._first_ready.set_result(message)
            return
        if worker is self._probe:
            self._finish_reload(worker, message)
            return
        self.dispatcher.wake()

    def worker_boot_failed(self, worker: Worker, message: BootFailed) -> None:
        """A worker cannot import the actors: halt at start, abort a reload."""
        log.debug("worker boot traceback", extra={"exc": message.traceback})
        if self._first_ready is not None and not self._first_ready.done():
            self._first_ready.set_exception(BootError(message.error))
        elif worker is self._probe:
            log.error(f"reload aborted, keeping the running code: {message.error}")
        elif self.pool.count(IDLE, BUSY) > 0:
            # The code on disk changed under us; keep serving with the workers we have
            # and retry with backoff instead of spinning (SIGHUP makes a change official).
            self._spawn_failures += 1
            self._next_spawn = time.monotonic() + min(30.0, 0.5 * 2**self._spawn_failures)
            log.error(f"worker cannot boot; retrying later: {message.error}")
        else:
            log.error(f"no worker can boot; stopping the node: {message.error}")
            self.exit_code = EXIT_BOOT_ERROR
            self.handle_quit()

    def job_done(self, worker: Worker, message: JobDone) -> None:
        """Record a success, then recycle the worker if it is due."""
        self.dispatcher.job_done(worker, message)
        self._after_job(worker)
        self._changed.set()

    def job_failed(self, worker: Worker, message: JobFailed) -> None:
        """Record a failure, then recycle the worker if it is due."""
        self.dispatcher.job_failed(worker, message)
        self._after_job(worker)
        self._changed.set()

    def _after_job(self, worker: Worker) -> None:
        settings = self.settings
        if worker.retire:
            self.pool.stop(worker)
            return
        limit_jobs = settings.max_jobs_per_worker
        limit_kb = (settings.max_worker_rss_mb or 0) * 1024
        if (limit_jobs and worker.jobs_run >= limit_jobs) or (
            limit_kb and worker.rss_kb > limit_kb
        ):
            worker.kill_reason = "recycle"
            self.metrics.worker_restart("recycle")
            self.pool.stop(worker)
            self.manage_workers()

    def worker_exited(self, worker: Worker) -> None:
        """A child is gone: settle its attempt, count the restart, replace it."""
        self._changed.set()
        if worker is self._probe:
            self._probe = None
        if self._first_ready is not None and not self._first_ready.done():
            error = f"worker {worker.pid} {describe_exit(worker.exitcode)} during boot"
            self._first_ready.set_exception(BootError(error))
            return
        self.engine.history.worker_exited(worker)
        reason = worker.kill_reason
        if worker.lease is not None:
            self.dispatcher.worker_lost(worker)
        if reason in (None, "timeout", "cancel", "lease_lost"):
            self.metrics.worker_restart(reason or "crash")
            log.warning(
                "worker exited",
                extra={
                    "worker_pid": worker.pid,
                    "reason": reason or "crash",
                    "exit": describe_exit(worker.exitcode),
                },
            )
            if reason is None:
                self._spawn_failures += 1
                backoff = min(5.0, 0.1 * 2 ** min(self._spawn_failures, 6))
                self._next_spawn = time.monotonic() + (backoff if self._spawn_failures > 3 else 0)
        self.manage_workers()
        self.dispatcher.wake()

    # -- reload ----------------------------------------------------------------------

    def _finish_reload(self, probe: Worker, message: Ready) -> None:
        settings = self._pending_settings or self.settings
        self._probe = None
        self.generation = probe.generation
        self.settings = settings
        self.pool.modules = list(settings.actors)
        self.target = settings.workers
        catalog = Catalog(message.actors, settings.limits)
        self.catalog = catalog
        self.dispatcher.reconfigure(
            catalog,
            queues=frozenset(settings.queues) if settings.queues else None,
            default_timeout=settings.default_timeout,
            retry_base=settings.retry_base,
            retry_cap=settings.retry_cap,
        )
        self.engine.set_catalog(catalog)
        self.metrics.declare_types(catalog.types)
        for worker in self.pool:
            if worker.generation < self.generation:
                self.metrics.worker_restart("reload")
                self._retire(worker)
        self._tasks.append(asyncio.ensure_future(self.store.register_node(catalog.limits())))
        extra = {"generation": self.generation, "types": sorted(catalog.types)}
        log.info("reloaded", extra=extra)
        self.manage_workers()
        self.dispatcher.wake()

    # -- stop ------------------------------------------------------------------------

    async def _shutdown(self, grace: float) -> None:
        """Drain: refuse new jobs, let running attempts finish within `grace`, hand back
        the rest, stop the children, then the HTTP server and the store."""
        self.engine.draining = True
        self.dispatcher.dispatching = False
        self.dispatcher.release_buffer()  # let other nodes have them now
        log.info("draining", extra={"grace": grace})
        deadline = time.monotonic() + grace
        while self.pool.count(BUSY) and (left := deadline - time.monotonic()) > 0:
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), left)
        self._kill_busy("shutdown")
        await self.pool.shutdown(timeout=5.0)
        await self.dispatcher.flush(timeout=10.0)
        for task in self._tasks:
            task.cancel()
        await self.webhooks.close(drain_timeout=2.0)
        await self.hooks.stop_http()
        await self.store.close()
        log.info("stopped", extra={"exit_code": self.exit_code})
        self._done.set()
        self._wakeup.set()
