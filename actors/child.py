"""A worker process: `python -m goqueue.actors.child FD SUPERVISOR_PID`.

The supervisor spawns it directly (no forkserver between them) with one end of a socket
pair as descriptor FD. It ties itself to the supervisor (PDEATHSIG, then the pipe: see
`inbox.py`), reads its `Boot` frame, imports the actors, then runs one job at a time as
the pipe says. The supervisor owns every decision (deadlines, retries, recycling); this
loop only runs handlers and reports. It is killed, never asked, when an attempt overruns
its deadline. asyncio is imported only when an `async def` handler first runs, to keep
the boot (and so a replacement after a kill) fast.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NoReturn

import msgspec
from goqueue.actors.boot import extend_path, load
from goqueue.actors.context import PipeLink
from goqueue.actors.errors import Fail, Retry
from goqueue.actors.inbox import Inbox
from goqueue.actors.lease_alarm import KernelAlarm
from goqueue.actors.pipe import Pipe
from goqueue.actors.protocol import (
    WORKER_BOOT_ERROR,
    WORKER_OK,
    Boot,
    BootFailed,
    JobDone,
    JobFailed,
    Ready,
    RunJob,
)
from goqueue.actors.registry import Context, Registry
from goqueue.actors.tracebacks import DEFAULT_MAX_TRACEBACK_BYTES, bounded

if TYPE_CHECKING:
    import asyncio

_PR_SET_PDEATHSIG = 1
_PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024


def main(argv: Sequence[str] | None = None) -> NoReturn:
    """Entry point of a worker process."""
    args = sys.argv[1:] if argv is None else argv
    fd, supervisor = int(args[0]), int(args[1])
    _tie_to(supervisor)
    _detach_signals()
    os.set_inheritable(fd, False)  # a handler's own subprocesses do not get the pipe
    pipe = Pipe(socket.socket(fileno=fd))
    boot = pipe.read()
    if not isinstance(boot, Boot):
        _exit(WORKER_OK)  # the supervisor went away before saying anything
    extend_path(boot.paths)
    loaded = load(boot.modules)
    if isinstance(loaded, BootFailed):
        pipe.send(loaded)
        _exit(WORKER_BOOT_ERROR)
    pipe.send(Ready(os.getpid(), loaded.infos()))
    inbox = Inbox(pipe, KernelAlarm())
    inbox.start()
    worker = Worker(
        pipe,
        inbox,
        loaded,
        max_result_bytes=boot.max_result_bytes,
        max_traceback_bytes=boot.max_traceback_bytes,
    )
    worker.serve()
    _exit(WORKER_OK)


def _tie_to(supervisor: int) -> None:
    """Die with the supervisor (SIGKILL when the thread that spawned us exits), and
    leave at once if it is already gone (the check follows the prctl: no gap)."""
    if sys.platform == "linux":
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != supervisor:
        _exit(WORKER_OK)


def _detach_signals() -> None:
    """Leave terminal signals to the supervisor (Ctrl-C reaches the whole process group)."""
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTTIN, signal.SIGTTOU, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _exit(code: int) -> NoReturn:
    """Leave now, without interpreter teardown (user threads must not hold us up)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


def _rss_kb() -> int:
    with open("/proc/self/statm", "rb") as f:
        return int(f.read().split()[1]) * _PAGE_KB


class Worker:
    """The loop of one worker process: take a job from the inbox, run it, report."""

    def __init__(
        self,
        pipe: Pipe,
        inbox: Inbox,
        registry: Registry,
        *,
        max_result_bytes: int | None = None,
        max_traceback_bytes: int = DEFAULT_MAX_TRACEBACK_BYTES,
    ) -> None:
        self.pipe = pipe
        self.inbox = inbox
        self.registry = registry
        self.max_result_bytes = max_result_bytes
        self.max_traceback_bytes = max_traceback_bytes
        self.link = PipeLink(pipe, inbox)
        self._loop: asyncio.AbstractEventLoop | None = None

    def serve(self) -> None:
        """Run jobs until told to stop (the inbox ends the process if the supervisor goes)."""
        while (job := self.inbox.jobs.get()) is not None:
            outcome = self.run(job)
            self.link.job_ended()
            if not self.inbox.finished():
                return  # the inbox gave this attempt up and is ending the process
            self.pipe.send(outcome)

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
            return self._failed(
                job, started, _describe(exc), tb=bounded(exc, self.max_traceback_bytes, _OWN_FILES)
            )
        try:
            encoded = msgspec.json.encode(result)
        except (TypeError, ValueError, msgspec.EncodeError) as exc:
            return self._failed(job, started, f"result is not JSON: {exc}", retry=False)
        limit = self.max_result_bytes
        if limit is not None and len(encoded) > limit:
            error = f"result is {len(encoded)} bytes, over the limit of {limit}"
            return self._failed(job, started, error, retry=False)
        return JobDone(job.job_id, encoded, time.monotonic() - started, _rss_kb())

    def _call(self, job: RunJob) -> Any:
        handler = self.registry.get(job.type)
        if handler is None:
            raise Fail(f"no actor named {job.type!r} in this worker")
        payload = msgspec.json.decode(job.payload)
        ctx = Context(job.job_id, job.attempt, job.type, job.queue, self.link)
        if handler.is_async:
            return self._event_loop().run_until_complete(handler.fn(payload, ctx))
        return handler.fn(payload, ctx)

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            import asyncio

            self._loop = asyncio.new_event_loop()
        return self._loop

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


_OWN_FILES = frozenset({__file__})  # frames left out of a handler's traceback


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


if __name__ == "__main__":
    main()
