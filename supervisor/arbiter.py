"""The arbiter: a node's main loop, in the manner of a pre-fork server.

It receives a node already built (`goqueue.supervisor.node.Node`) and only runs its
lifecycle. Signal handlers only queue the signal; the loop drains the queue into small
`handle_*` methods, then once per tick runs `manage_workers()` and the chores (gauges, a
claim sweep, the lease chores). It hears the pool's worker lifecycle events (boot,
reload probe, respawn); attempts' outcomes go from the pool to the dispatcher, never
through here. Deadlines are timers in the pool, so a hung attempt is killed on time
whatever the tick is doing.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import random
import signal
import time
from dataclasses import replace
from functools import partial

from goqueue.actors.protocol import BootFailed, Ready
from goqueue.supervisor.common.backoff import Backoff, backoff
from goqueue.supervisor.common.enums import RESTART_AFTER, KillReason, RestartReason, WorkerState
from goqueue.supervisor.common.errors import BootError, ConfigError, StoreUnavailable
from goqueue.supervisor.common.lifecycle import NodePhase
from goqueue.supervisor.node import Node
from goqueue.supervisor.settings.config import Settings
from goqueue.supervisor.shutdown import abort, drain, kill_busy
from goqueue.supervisor.startup import (
    FirstWorker,
    adopt,
    announce,
    boot_step,
    catalog_of,
    reap_first,
    register,
)
from goqueue.supervisor.workers.handle import Worker
from goqueue.supervisor.workers.pool import Recycle, WorkerConfig, describe_exit
from goqueue.supervisor.workers.scaling import Bounds, Scaler, longest_wait

log = logging.getLogger("goqueue.arbiter")

EXIT_OK = 0
EXIT_FAILED = 1  # something failed that retrying would not mend (see the log)
EXIT_CONFIG = 2  # the settings are wrong (as for a bad command line): the store refused them
EXIT_BOOT_ERROR = 3
TICK = 0.5
SPAWN_RETRY_BASE = 0.5  # seconds before retrying a worker spawn that failed (EMFILE, ...)
SPAWN_RETRY_CAP = 30.0
SIGNALS = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGTTIN,
    signal.SIGTTOU,
)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT)


class Arbiter:
    """Runs one node's lifecycle: boot, signals, ticks, reload, drain and stop."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.settings = node.settings
        self.store = node.store
        self.pool = node.pool
        self.dispatcher = node.dispatcher
        self.metrics = node.metrics
        self.leases = node.leases
        self.catalog = node.dispatcher.catalog  # empty until the first worker is Ready
        self.scaler = Scaler(Bounds(*node.settings.worker_bounds), node.settings.scale_down_after)
        self.target = self.scaler.target
        self._note_count()
        self.generation = 0
        self.exit_code = EXIT_OK
        self.rng = random.Random()
        self._signals: list[int] = []
        self._wakeup = asyncio.Event()
        self._stopping: asyncio.Task[None] | None = None
        self._done = asyncio.Event()
        self._probe: Worker | None = None
        self._pending_settings: Settings | None = None
        self._first_worker = FirstWorker()
        self._spawn_failures = 0
        self._spawn_delays = Backoff(SPAWN_RETRY_BASE, SPAWN_RETRY_CAP, self.rng)
        self._next_spawn = 0.0
        self._booted = False
        self._tasks: list[asyncio.Task[None]] = []
        node.pool.listen(replace(node.listeners, workers=self))  # the pool reports to us too

    # -- start -----------------------------------------------------------------------

    async def run(self) -> int:
        """Start the node, loop until stopped, return the exit code. Whatever fails on
        the way, what was opened is closed and the exit code says so: a node never hangs."""
        loop = asyncio.get_running_loop()
        for sig in SIGNALS:
            loop.add_signal_handler(sig, self._queue_signal, sig)
        try:
            return await self._run()
        except BootError as exc:
            log.error(f"cannot start: {exc}")
            await self._abort()
            return EXIT_BOOT_ERROR
        except ConfigError as exc:
            log.error(f"cannot start: {exc}")
            await self._abort()
            return EXIT_CONFIG
        except Exception:
            log.exception("the node failed; closing what it opened")
            await self._abort()
            return EXIT_FAILED
        finally:
            for sig in SIGNALS:
                loop.remove_signal_handler(sig)

    async def _run(self) -> int:
        # What only this node may hold (a SQLite file) first: a second node refuses before
        # it listens. Then HTTP: /health answers and /ready says what is missing while the
        # rest boots.
        await self.store.reserve()
        try:
            await self.node.http.start()
        except OSError as exc:  # the port is taken, or the address is not ours
            where = f"{self.settings.host}:{self.settings.port}"
            log.error(f"cannot start: cannot listen on {where}: {exc.strerror or exc}")
            await self._abort()
            return EXIT_FAILED
        if not await self._boot_unless_stopped():
            log.info("stopped while starting")
            await self._abort()
            return self.exit_code
        await self.node.webhooks.start()
        self._booted = True
        self.manage_workers()
        await reap_first(self.leases)
        self._tasks.append(asyncio.ensure_future(self.dispatcher.run()))
        self.node.scheduler.start()
        announce(self.settings, self.store.node_id, self.catalog, self.target)
        gc.freeze()  # boot-time objects never die: keep them out of every future collection
        self.dispatcher.wake()
        await self._main_loop()
        return self.exit_code

    async def _boot_unless_stopped(self) -> bool:
        """Boot, unless a stop signal comes first (then False). Other signals wait for the
        main loop."""
        boot = asyncio.ensure_future(self._boot())
        try:
            while not boot.done():
                woken = asyncio.ensure_future(self._wakeup.wait())
                await asyncio.wait({boot, woken}, return_when=asyncio.FIRST_COMPLETED)
                woken.cancel()
                self._wakeup.clear()
                if any(sig in STOP_SIGNALS for sig in self._signals):
                    self._signals = [sig for sig in self._signals if sig not in STOP_SIGNALS]
                    return False
            boot.result()  # raises what the boot raised
            return True
        finally:
            if not boot.done():
                boot.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await boot

    async def _boot(self) -> None:
        """Open the store (waiting for it if it is not up yet), spawn the first worker,
        learn the actors from its Ready message, and declare the node to the store."""
        open_store = partial(self.store.open, self.node.links)
        await boot_step("opening the store", open_store, StoreUnavailable, self.rng)
        ready = await self._first_worker.spawn(self.pool, self.generation, self.rng)
        self.catalog = catalog_of(ready, self.settings)
        problems = adopt(self.node, self.catalog, self.settings)
        if problems:
            raise BootError(problems[0])
        declare = partial(register, self.store, self.catalog)
        await boot_step("registering the node", declare, StoreUnavailable, self.rng)
        self.node.lifecycle.enter(NodePhase.SERVING)

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
        handler = {
            "SIGTERM": self.handle_term,
            "SIGINT": self.handle_int,
            "SIGQUIT": self.handle_quit,
            "SIGHUP": self.handle_hup,
            "SIGTTIN": self.handle_ttin,
            "SIGTTOU": self.handle_ttou,
        }[name]
        handler()

    def handle_term(self) -> None:
        """Graceful shutdown; a second TERM/INT stops now."""
        if self._stopping is None:
            self._stopping = asyncio.ensure_future(self._shutdown(self.settings.shutdown_grace))
        else:
            log.warning("second stop signal: stopping now")
            kill_busy(self.pool, KillReason.SHUTDOWN)

    handle_int = handle_term

    def handle_quit(self) -> None:
        """Fast exit: running attempts are killed at once and handed back."""
        if self._stopping is None:
            self._stopping = asyncio.ensure_future(self._shutdown(0.0))
        else:
            kill_busy(self.pool, KillReason.SHUTDOWN)

    def handle_hup(self) -> None:
        """Reload: re-read config, boot a probe worker with fresh actor modules."""
        if self._stopping is not None or self._probe is not None:
            log.warning("reload ignored: a reload or a shutdown is already under way")
            return
        try:
            settings = self.node.reload_settings()
        except Exception as exc:
            log.error(f"reload aborted: {exc}")
            return
        self._pending_settings = settings
        try:
            self._probe = self.pool.spawn(self.generation + 1, WorkerConfig.of(settings))
        except OSError as exc:
            log.error(f"reload aborted: cannot start a worker: {exc}")
            return

    def handle_ttin(self) -> None:
        """One worker more: both bounds up by one."""
        self.target = self.scaler.rebound(self.scaler.bounds.raised())
        self._note_count()
        bounds = str(self.scaler.bounds)
        log.info("worker count raised", extra={"workers": self.target, "bounds": bounds})

    def handle_ttou(self) -> None:
        """One worker fewer: both bounds down by one (never below one)."""
        self.target = self.scaler.rebound(self.scaler.bounds.lowered())
        self._note_count()
        bounds = str(self.scaler.bounds)
        log.info("worker count lowered", extra={"workers": self.target, "bounds": bounds})

    # -- workers ---------------------------------------------------------------------

    def manage_workers(self) -> None:
        """Spawn up to the target; retire extras, preferring idle ones. After a reload the
        old generation makes way one worker at a time, as new workers become ready, so
        the node never has fewer than its target serving while new ones boot."""
        if self._stopping is not None or not self._booted:
            return
        live = [
            w
            for w in self.pool
            if w.state != WorkerState.STOPPING and not w.retire and w is not self._probe
        ]
        current = [w for w in live if w.generation >= self.generation]
        old = [w for w in live if w.generation < self.generation]
        ready = sum(1 for w in current if w.state != WorkerState.BOOTING)
        for worker in _idle_first(old)[: max(0, len(old) + ready - self.target)]:
            self.metrics.worker_restart(RestartReason.RELOAD)
            self._retire(worker)
        for worker in _idle_first(current)[: max(0, len(current) - self.target)]:
            self._retire(worker)
        self._spawn(self.target - len(current))

    def _spawn(self, count: int) -> None:
        """Start `count` workers, unless spawning is backing off."""
        now = time.monotonic()
        for _ in range(max(0, count)):
            if now < self._next_spawn:
                return
            try:
                self.pool.spawn(self.generation)
            except OSError as exc:  # out of descriptors, memory or processes: wait, retry
                delay = self._spawn_delays.next()
                self._next_spawn = now + delay
                log.error(
                    f"cannot start a worker; retrying in {delay:.2g}s: {exc}",
                    extra={"errno": exc.errno},
                )
                return

    def _retire(self, worker: Worker) -> None:
        worker.retire = True
        if worker.state == WorkerState.IDLE:
            self.pool.stop(worker)

    async def _chores(self) -> None:
        """Gauges, history and scaling every tick; the lease chores when due (`Leases.tick`)."""
        self._refresh_gauges()
        self.node.history.sample()
        await self._scale()
        await self.leases.tick(time.monotonic(), self.settings, self.catalog)

    async def _scale(self) -> None:
        """With --workers MIN:MAX, move the target with the load (see `scaling.py`)."""
        if not self.scaler.bounds.fixed and self._probe is None and self._stopping is None:
            current = (w for w in self.pool if w.generation >= self.generation)
            target = await self.scaler.look(current, self._waited, time.monotonic())
            if target != self.target:
                extra = {
                    "workers": target,
                    "before": self.target,
                    "bounds": str(self.scaler.bounds),
                }
                log.info("worker count scaled", extra=extra)
                self.target = target
                self.manage_workers()
        self._note_count()

    async def _waited(self) -> float:
        """Seconds the longest-waiting due job has waited: in the store, or claimed here
        and not started yet."""
        queues = self.dispatcher.policy.queues
        return max(await longest_wait(self.store, queues), self.dispatcher.longest_wait())

    def _note_count(self) -> None:
        """Show the worker count aimed for and its bounds (the dashboard, the gauge) as
        soon as they change."""
        bounds = self.scaler.bounds
        self.node.history.note_workers(self.target, bounds.minimum, bounds.maximum)
        self.metrics.set_worker_bounds(self.target, bounds.minimum, bounds.maximum)

    def _refresh_gauges(self) -> None:
        counts = self.node.engine.workers()
        self.metrics.set_workers(counts)
        self.metrics.set_running(counts[WorkerState.BUSY])

    # -- pool events (WorkerEvents) --------------------------------------------------

    def worker_ready(self, worker: Worker, message: Ready) -> None:
        """A worker booted: the first defines the catalog, a probe completes a reload."""
        self._spawn_failures = 0
        self._spawn_delays.reset()
        if self._first_worker.awaited:
            self._first_worker.ready(message)
            return
        if worker is self._probe:
            self._finish_reload(worker, message)
            return
        self.manage_workers()  # during a reload, an old worker may now make way
        self.dispatcher.wake()

    def worker_boot_failed(self, worker: Worker, message: BootFailed) -> None:
        """A worker cannot import the actors: halt at start, abort a reload."""
        log.debug("worker boot traceback", extra={"exc": message.traceback})
        if self._first_worker.awaited:
            self._first_worker.failed(message.error)
        elif worker is self._probe:
            log.error(f"reload aborted, keeping the running code: {message.error}")
        elif self.pool.count(WorkerState.IDLE, WorkerState.BUSY) > 0:
            # The code on disk changed under us; keep serving with the workers we have
            # and retry with backoff instead of spinning (SIGHUP makes a change official).
            self._spawn_failures += 1
            delay = backoff(self._spawn_failures, 1.0, 30.0, self.rng)
            self._next_spawn = time.monotonic() + delay
            log.error(f"worker cannot boot; retrying later: {message.error}")
        else:
            log.error(f"no worker can boot; stopping the node: {message.error}")
            self.exit_code = EXIT_BOOT_ERROR
            self.handle_quit()

    def worker_recycled(self, worker: Worker) -> None:
        """The pool is replacing a worker after its job: count it, start its successor."""
        self.metrics.worker_restart(RestartReason.RECYCLE)
        self.manage_workers()

    def worker_exited(self, worker: Worker) -> None:
        """A child is gone (its attempt already settled): count the restart, replace it."""
        if worker is self._probe:
            self._probe = None
        if self._first_worker.awaited:
            error = f"worker {worker.pid} {describe_exit(worker.exitcode)} during boot"
            self._first_worker.failed(error)
            return
        if not self._booted:
            return  # the node is not up (a failed boot): nothing to replace
        self.node.history.worker_exited(worker)
        tracing = self.node.engine.tracing
        if tracing is not None and worker.lease is not None:  # its span died with it
            ran = time.monotonic() - worker.attempt_started
            tracing.killed(worker.lease.job, worker.kill_reason, ran)
        restart = RESTART_AFTER.get(worker.kill_reason)
        if restart is not None:
            self.metrics.worker_restart(restart)
            extra = {"worker_pid": worker.pid, "reason": restart}
            log.warning("worker exited", extra={**extra, "exit": describe_exit(worker.exitcode)})
        if restart == RestartReason.CRASH:
            self._spawn_failures += 1
            delay = backoff(self._spawn_failures, 0.2, 5.0, self.rng)
            # a few crashes in a row respawn at once; past that, back off
            self._next_spawn = time.monotonic() + (delay if self._spawn_failures > 3 else 0.0)
        self.manage_workers()
        self.dispatcher.wake()

    # -- reload ----------------------------------------------------------------------

    def _finish_reload(self, probe: Worker, message: Ready) -> None:
        settings = self._pending_settings or self.settings
        self._probe = None
        self.generation = probe.generation
        self.settings = settings
        self.pool.reconfigure(
            WorkerConfig.of(settings), Recycle.of(settings), settings.max_worker_rss_mb
        )
        self.scaler.scale_down_after = settings.scale_down_after
        self.target = self.scaler.rebound(Bounds(*settings.worker_bounds))
        self._note_count()
        self.catalog = catalog_of(message, settings)
        adopt(self.node, self.catalog, settings)
        self._tasks.append(asyncio.ensure_future(register(self.store, self.catalog)))
        extra = {"generation": self.generation, "types": sorted(self.catalog.types)}
        log.info("reloaded", extra=extra)
        self.manage_workers()
        self.dispatcher.wake()

    # -- stop ------------------------------------------------------------------------

    async def _abort(self) -> None:
        """Close whatever is open after a failed or interrupted start, or a failure of
        the loop (see `shutdown.abort`)."""
        await abort(self.node, self.settings.shutdown_grace, self._tasks)

    async def _shutdown(self, grace: float) -> None:
        """Drain within `grace` (see `shutdown.drain`), then end the main loop."""
        await drain(self.node, grace, self._tasks)
        log.info("stopped", extra={"exit_code": self.exit_code})
        self._done.set()
        self._wakeup.set()


def _idle_first(workers: list[Worker]) -> list[Worker]:
    """Idle workers first: they can go at once, busy ones only after their job."""
    return sorted(workers, key=lambda w: w.state != WorkerState.IDLE)
