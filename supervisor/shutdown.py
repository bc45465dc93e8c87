"""How a node stops: `drain` after a stop signal (running attempts get the shutdown
grace, the rest are handed back), `abort` after a failed or interrupted start. Both close
every part in order: workers, webhooks, the HTTP server, the store.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from functools import partial

from goqueue.supervisor.common.enums import KillReason, WorkerState
from goqueue.supervisor.common.lifecycle import NodePhase
from goqueue.supervisor.node import Node
from goqueue.supervisor.workers.pool import Pool

log = logging.getLogger("goqueue.arbiter")  # the arbiter's steps, logged as its own

ABORT_FLOOR = 2.0  # seconds closing after a failure may take even with no shutdown grace


def kill_busy(pool: Pool, reason: KillReason) -> None:
    """Kill every worker running an attempt (those stopping with one too)."""
    for worker in pool:
        if worker.state == WorkerState.BUSY or (
            worker.state == WorkerState.STOPPING and worker.lease
        ):
            pool.kill(worker, reason)


async def abort(node: Node, grace: float, tasks: Sequence[asyncio.Task[None]]) -> None:
    """Close whatever is open after a failed or interrupted start (or a failure of the
    loop): workers, webhooks, HTTP, the store; within the shutdown `grace` (at least
    `ABORT_FLOOR`), whatever hangs (a database that does not answer)."""
    node.lifecycle.enter(NodePhase.DRAINING)
    node.engine.waiters.release_all()  # a long wait must not hold the HTTP server open
    for task in tasks:
        task.cancel()
    await node.scheduler.stop()
    # HTTP first: a node that will not run must stop answering at once (a client then
    # tries another node instead of hearing 503 while the workers stop)
    steps: list[tuple[str, Callable[[], Awaitable[None]]]] = [
        ("stopping the HTTP server", node.http.stop),
        ("stopping the workers", partial(node.pool.shutdown, 2.0)),
        ("closing the webhook sender", partial(node.webhooks.close, 0.0)),
        ("closing the store", node.store.close),
    ]
    try:
        async with asyncio.timeout(max(grace, ABORT_FLOOR)):
            for what, step in steps:
                try:
                    await step()
                except Exception as exc:
                    log.error(f"{what} failed: {exc!r}")
    except TimeoutError:
        log.error("closing took longer than the shutdown grace; exiting anyway")
        for worker in node.pool:
            node.pool.kill(worker, KillReason.SHUTDOWN)


async def drain(node: Node, grace: float, tasks: Sequence[asyncio.Task[None]]) -> None:
    """Refuse new jobs, let running attempts finish within `grace`, hand back the rest,
    stop the children, then the HTTP server and the store."""
    deadline = time.monotonic() + grace
    node.lifecycle.enter(NodePhase.DRAINING)
    node.engine.waiters.release_all()  # a long wait must not hold the HTTP server open
    await node.scheduler.stop()  # a draining node enqueues nothing
    handed = node.dispatcher.release_buffer()  # let other nodes have them now
    if handed:
        log.info(
            f"handing back {len(handed)} {'job' if len(handed) == 1 else 'jobs'} claimed ahead",
            extra={"job_ids": handed},
        )
    log.info("draining", extra={"grace": grace})
    await node.pool.wait_idle(grace)
    running = [w.lease.job for w in node.pool if w.lease is not None and not w.gone]
    if running:
        log.warning(
            f"the shutdown grace ran out: killing {len(running)} running "
            + ("job and handing it back" if len(running) == 1 else "jobs and handing them back"),
            extra={"job_ids": [job.id for job in running], "types": [j.type for j in running]},
        )
    kill_busy(node.pool, KillReason.SHUTDOWN)
    await node.pool.shutdown(timeout=5.0)
    await node.dispatcher.flush(timeout=10.0)
    for task in tasks:
        task.cancel()
    # webhooks in flight since the signal get what is left of the grace
    await node.webhooks.close(max(0.0, deadline - time.monotonic()))
    await node.http.stop()
    await node.store.close()
    node.lifecycle.enter(NodePhase.STOPPED)
