"""A worker process: import the actors, then run one job at a time as the pipe says.

The supervisor owns every decision (deadlines, retries, recycling); this loop only runs
handlers and reports. It is killed, never asked, when an attempt overruns its deadline.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import signal
import sys
import time
import traceback
from multiprocessing.connection import Connection
from typing import Any

import msgspec
from goqueue.actors.errors import Fail, Retry
from goqueue.actors.protocol import (
    WORKER_BOOT_ERROR,
    WORKER_OK,
    BootFailed,
    JobDone,
    JobFailed,
    Ready,
    RunJob,
    Shutdown,
    WorkerCodec,
)
from goqueue.actors.registry import Context, Registry, load_actors

_PR_SET_PDEATHSIG = 1
_PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024


def main(conn: Connection, modules: list[str]) -> None:
    """Entry point of a worker process (the target given to multiprocessing)."""
    _detach_signals()
    codec = WorkerCodec()
    try:
        registry = load_actors(modules)
    except BaseException as exc:  # any import-time failure is a boot failure
        message = f"cannot load actor modules {','.join(modules)}: {exc!r}"
        _send(conn, codec, BootFailed(message, traceback.format_exc()))
        os._exit(WORKER_BOOT_ERROR)
    _send(conn, codec, Ready(os.getpid(), registry.infos()))
    Worker(conn, codec, registry).serve()
    os._exit(WORKER_OK)


def _detach_signals() -> None:
    """Leave terminal signals to the supervisor; die with the process that forked us."""
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTTIN, signal.SIGTTOU, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if sys.platform == "linux":
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _send(conn: Connection, codec: WorkerCodec, message: Any) -> None:
    conn.send_bytes(codec.encode(message))


def _rss_kb() -> int:
    with open("/proc/self/statm", "rb") as f:
        return int(f.read().split()[1]) * _PAGE_KB


class Worker:
    """The loop of one worker process."""

    def __init__(self, conn: Connection, codec: WorkerCodec, registry: Registry) -> None:
        self.conn = conn
        self.codec = codec
        self.registry = registry
        self._loop: asyncio.AbstractEventLoop | None = None

    def serve(self) -> None:
        """Run jobs until told to stop or the supervisor goes away."""
        while True:
            try:
                frame = self.conn.recv_bytes()
            except (EOFError, OSError):
                return
            match self.codec.decode(frame):
                case RunJob() as job:
                    _send(self.conn, self.codec, self.run(job))
                case Shutdown():
                    return

    def run(self, job: RunJob) -> JobDone | JobFailed:
        """Run one attempt and describe its outcome."""
        started = time.monotonic()
        try:
            result = self._call(job)
        except Retry as exc:
            return self._failed(job, started, str(exc), retry=True, delay=exc.delay)
        except Fail as exc:
            return self._failed(job, started, f"Fail: {exc}", retry=False)
        except Exception as exc:
            return self._failed(job, started, _describe(exc), tb=traceback.format_exc())
        try:
            encoded = msgspec.json.encode(result)
        except (TypeError, ValueError, msgspec.EncodeError) as exc:
            return self._failed(job, started, f"result is not JSON: {exc}", retry=False)
        return JobDone(job.job_id, encoded, time.monotonic() - started, _rss_kb())

    def _call(self, job: RunJob) -> Any:
        handler = self.registry.get(job.type)
        if handler is None:
            raise Fail(f"no actor named {job.type!r} in this worker")
        payload = msgspec.json.decode(job.payload)
        ctx = Context(job_id=job.job_id, attempt=job.attempt, type=job.type, queue=job.queue)
        if handler.is_async:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
            return self._loop.run_until_complete(handler.fn(payload, ctx))
        return handler.fn(payload, ctx)

    def _failed(
        self,
        job: RunJob,
        started: float,
        error: str,
        *,
        retry: bool = True,
        delay: float | None = None,
        tb: str = "",
    ) -> JobFailed:
        duration = time.monotonic() - started
        return JobFailed(job.job_id, error, duration, retry, delay, tb, _rss_kb())


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
