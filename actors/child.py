"""A worker process: `python -m goqueue.actors.child FD SUPERVISOR_PID`.

The supervisor spawns it directly (no forkserver between them) with one end of a socket
pair as descriptor FD. It ties itself to the supervisor (PDEATHSIG, then the pipe: see
`inbox.py`), reads its `Boot` frame, imports the actors, then runs the attempts the pipe
hands it, one at a time, in order. The supervisor owns every decision (deadlines,
retries, recycling); this loop only runs handlers and reports. It is killed, never
asked, when an attempt overruns its deadline. asyncio is imported only when an
`async def` handler first runs, to keep the boot (and so a replacement after a kill)
fast.
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
from goqueue.actors.inbox import Inbox, Wait
from goqueue.actors.job_context import Context
from goqueue.actors.lease_alarm import KernelAlarm
from goqueue.actors.logs import JobLog
from goqueue.actors.pipe import Pipe
from goqueue.actors.protocol import (
    WORKER_BOOT_ERROR,
    WORKER_OK,
    Boot,
    BootFailed,
    FromWorker,
    JobDone,
    JobFailed,
    Ready,
    RunJob,
    Started,
)
from goqueue.actors.registry import Registry
from goqueue.actors.tracebacks import DEFAULT_MAX_TRACEBACK_BYTES, bounded
from goqueue.actors.typed import PayloadMisfit

if TYPE_CHECKING:
    import asyncio

    from goqueue.actors.tracing import AttemptTracer

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
    log = JobLog.install(boot.log_level)
    extend_path(boot.paths)
    loaded = load(boot.modules)
    if isinstance(loaded, BootFailed):
        pipe.send(loaded)
        _exit(WORKER_BOOT_ERROR)
    tracer = _tracer(boot)
    pipe.send(Ready(os.getpid(), loaded.infos()))
    inbox = Inbox(pipe, KernelAlarm())
    inbox.start()
    worker = Worker(
        pipe,
        inbox,
        loaded,
        max_result_bytes=boot.max_result_bytes,
        max_traceback_bytes=boot.max_traceback_bytes,
        max_rss_kb=boot.max_rss_kb,
        log=log,
        tracer=tracer,
    )
    worker.serve()
    if tracer is not None:
        tracer.close()
    _exit(WORKER_OK)


def _tracer(boot: Boot) -> AttemptTracer | None:
    """With --otel, the attempts' spans (OpenTelemetry is imported only then)."""
    if not boot.otel:
        return None
    from goqueue.actors.tracing import AttemptTracer

    return AttemptTracer(boot.node)


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


class _Statm:
    """This process's resident memory, read from /proc/self/statm with one `pread` of a
    descriptor kept open (after every attempt: it tells the supervisor when to recycle)."""

    def __init__(self) -> None:
        self._fd = os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC)

    def rss_kb(self) -> int:
        return int(os.pread(self._fd, 128, 0).split()[1]) * _PAGE_KB


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
        max_rss_kb: int | None = None,
        log: JobLog | None = None,
        tracer: AttemptTracer | None = None,
    ) -> None:
        self.pipe = pipe
        self.log = log
        self.tracer = tracer
        self.error: BaseException | None = None  # what the last attempt raised
        self.inbox = inbox
        self.registry = registry
        self.max_result_bytes = max_result_bytes
        self.max_traceback_bytes = max_traceback_bytes
        self.max_rss_kb = max_rss_kb
        self.link = PipeLink(pipe, inbox)
        self._rss_kb = _Statm().rss_kb
        self._loop: asyncio.AbstractEventLoop | None = None

    def serve(self) -> None:
        """Run attempts until told to stop (the inbox ends the process if the supervisor
        goes). What is to be said (an outcome, the next attempt's `Started`, attempts
        dropped) goes out in one write, before the next attempt runs or the worker waits."""
        outbox: list[FromWorker] = []
        while True:
            job = self.inbox.take(outbox, wait=False)
            if isinstance(job, Wait):
                self._flush(outbox)
                job = self.inbox.take(outbox, wait=True)
            if not isinstance(job, RunJob):
                break
            if job.announce:
                outbox.append(Started(job.job_id))
            self._flush(outbox)
            outcome = self.run(job)
            self.link.job_ended()
            if not self.inbox.finished():
                return  # the inbox gave this attempt up and is ending the process
            outbox.append(outcome)
            if self.max_rss_kb is not None and outcome.rss_kb > self.max_rss_kb:
                self.inbox.drop_all(outbox)  # to be recycled: it starts nothing more
        self._flush(outbox)

    def _flush(self, outbox: list[FromWorker]) -> None:
        if outbox:
            self.pipe.send_all(outbox)
            outbox.clear()

    def run(self, job: RunJob) -> JobDone | JobFailed:
        """Run one attempt and describe its outcome; its log lines name the job."""
        if self.log is not None:
            self.log.begin(job.job_id, job.type, job.attempt, job.queue)
        try:
            return self._attempt(job) if self.tracer is None else self._traced(job, self.tracer)
        finally:
            if self.log is not None:
                self.log.end()

    def _traced(self, job: RunJob, tracer: AttemptTracer) -> JobDone | JobFailed:
        from goqueue.actors.tracing import ended, ids

        with tracer.attempt(job) as span:
            if self.log is not None:
                self.log.tag(**ids(span))
            outcome = self._attempt(job)
            ended(span, outcome, self.error)
        return outcome

    def _attempt(self, job: RunJob) -> JobDone | JobFailed:
        self.error = None
        started = time.monotonic()
        try:
            result = self._call(job)
        except Retry as exc:
            return self._failed(job, started, str(exc), retry=True, delay=exc.delay)
        except Fail as exc:
            self.error = exc
            return self._failed(job, started, f"Fail: {exc}", retry=False)
        except PayloadMisfit as exc:  # it will never fit: no retry
            self.error = exc
            return self._failed(job, started, f"payload does not fit: {exc}", retry=False)
        except Exception as exc:
            self.error = exc
            return self._failed(
                job, started, _describe(exc), tb=bounded(exc, self.max_traceback_bytes, _OWN_FILES)
            )
        try:
            encoded = self._encode(job, result)
        except (TypeError, ValueError, msgspec.EncodeError) as exc:
            return self._failed(job, started, f"result is not JSON: {exc}", retry=False)
        limit = self.max_result_bytes
        if limit is not None and len(encoded) > limit:
            error = f"result is {len(encoded)} bytes, over the limit of {limit}"
            return self._failed(job, started, error, retry=False)
        return JobDone(job.job_id, encoded, time.monotonic() - started, self._rss_kb())

    def _call(self, job: RunJob) -> Any:
        handler = self.registry.get(job.type)
        if handler is None:
            raise Fail(f"no actor named {job.type!r} in this worker")
        parents = {} if job.parents is None else msgspec.json.decode(job.parents)
        ctx = Context(job.job_id, job.attempt, job.type, job.queue, self.link, parents)
        called = handler.signature.call(handler.fn, job.payload, ctx)
        if handler.is_async:
            return self._event_loop().run_until_complete(called)
        return called

    def _encode(self, job: RunJob, result: Any) -> bytes:
        """The result as JSON; converted first to the handler's return annotation, when it
        has one (a Struct, a datetime), so that is how it is written."""
        handler = self.registry.get(job.type)
        wanted = None if handler is None else handler.signature.result
        if wanted is not None:
            try:
                result = msgspec.convert(result, wanted, from_attributes=True)
            except msgspec.ValidationError as exc:
                raise ValueError(f"it does not fit the return annotation: {exc}") from None
        return msgspec.json.encode(result)

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
        return JobFailed(job.job_id, error, duration, retry, delay, tb, self._rss_kb())


_OWN_FILES = frozenset({__file__})  # frames left out of a handler's traceback


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


if __name__ == "__main__":
    main()
