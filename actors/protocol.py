"""Every message between the supervisor and its worker processes, and nothing else.

Frames are a 4-byte big-endian length, then one msgpack-encoded tagged union, over the
socket pair the supervisor made when it spawned the worker. New fields get defaults so
the protocol can evolve. Every message is an array-like struct untracked by the garbage
collector (it holds only scalars, text, bytes and lists of those); each side has one
encoder and one decoder (`SupervisorCodec`, `WorkerCodec`) and encodes a frame, length
prefix included, into one buffer (`frame`), so a frame is never copied to be sent.

A worker's life on the pipe: the supervisor sends `Boot` first; the worker answers
`Ready` (or `BootFailed` and exits with WORKER_BOOT_ERROR). Then the supervisor hands it
attempts, one or several at a time (`RunJobs`): the worker keeps them in order and runs
them back to back, one at a time. The first attempt handed to an idle worker starts at
once; each one queued behind others is announced (`Started`) before it runs, so the
supervisor arms its deadline then. An attempt whose start is not yet durable waits for
`Go`; one not started by its `start_by` is not run but handed back (`Dropped`), as are
those the supervisor takes back (`Withdraw`) before they start. An attempt handed to run
at once has a `start_by` too where another node may take its job over: a worker that
reads it only after a freeze of its node (a SIGSTOP, a paused machine) drops it. The
worker answers each attempt with `JobDone` or `JobFailed`, and sends what it has to say
in one write when it moves on to the next attempt (an outcome and the next `Started`).
`Extend` comes from the pool's own timer, a few times per allowance, while the worker
holds attempts (never from the arbiter's tick, which may be waiting on a database).
While a job runs, the worker may send `Progress` and `EnqueueRequest` (each request
answered by one `EnqueueReply`). A worker the supervisor stopped extending dies by
SIGALRM at the end of its allowance, saying nothing (`lease_alarm.py`). `Shutdown` ends
an idle worker.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from enum import StrEnum

import msgspec
from goqueue.actors.tracebacks import DEFAULT_MAX_TRACEBACK_BYTES

# Exit codes: a named contract between a worker and its supervisor.
WORKER_OK = 0
WORKER_BOOT_ERROR = 3  # the actor modules could not be imported: respawning will not help

MAX_PROGRESS_BYTES = 4096  # a progress report larger than this is refused in the handler

# -- supervisor to worker ------------------------------------------------------------------


class Boot(msgspec.Struct, tag="boot", tag_field="msg", array_like=True, gc=False):
    """The first frame: what to import and how. `paths` go first on `sys.path` (the
    supervisor's working directory, then each `--path`)."""

    modules: list[str]
    paths: list[str] = []
    max_result_bytes: int | None = None  # a larger result fails its attempt
    max_traceback_bytes: int = (
        DEFAULT_MAX_TRACEBACK_BYTES  # a failed attempt's traceback is cut to this (0: none)
    )
    log_level: str = "info"  # the node's; the worker logs JSON lines at it
    otel: bool = False  # trace each attempt (OpenTelemetry, configured by OTEL_* variables)
    node: str = ""  # the node's id, for the spans
    max_rss_kb: int | None = None  # past it, the worker starts none of its queued attempts


class RunJob(msgspec.Struct, array_like=True, gc=False):
    """One attempt of a job, as `RunJobs` hands it over. `payload` is the job's JSON
    payload, undecoded.

    `allowance` (seconds, None for no bound) is how long the worker may hold its attempts
    without hearing `Extend`: past it, the supervisor is presumed frozen and the kernel
    ends the worker before a lease can run out and another node take the job over.
    `announce`: say `Started` before running it (it was queued behind another attempt).
    `go`: its start is durable, so it may run when its turn comes; otherwise it waits
    for `Go`. `start_by` (the system's monotonic clock, `time.monotonic`): not started by
    then, its lease may be lapsing, so it is handed back (`Dropped`) instead of run."""

    job_id: str
    type: str
    attempt: int
    queue: str
    payload: bytes
    allowance: float | None = None
    trace_context: dict[str, str] | None = None  # the enqueue's (W3C trace context)
    parents: bytes | None = None  # a workflow step's parents' results by key (JSON object)
    announce: bool = False
    go: bool = True
    start_by: float | None = None


class RunJobs(msgspec.Struct, tag="run", tag_field="msg", array_like=True, gc=False):
    """Attempts for the worker to run in this order, after those it already holds."""

    jobs: list[RunJob]


class Go(msgspec.Struct, tag="go", tag_field="msg", array_like=True, gc=False):
    """The starts of these queued attempts are durable: they may run."""

    job_ids: list[str]


class Withdraw(msgspec.Struct, tag="withdraw", tag_field="msg", array_like=True, gc=False):
    """Do not run these queued attempts (cancelled, lease lost, stale, shutting down):
    the worker hands back (`Dropped`) those it has not started."""

    job_ids: list[str]


class Extend(msgspec.Struct, tag="extend", tag_field="msg", array_like=True, gc=False):
    """The supervisor is alive: the attempts the worker holds may go on for `seconds`
    from now."""

    seconds: float


class Shutdown(msgspec.Struct, tag="shutdown", tag_field="msg", array_like=True, gc=False):
    """Finish nothing more; exit cleanly (recycling, reload, shutdown)."""


class Refusal(StrEnum):
    """Why the supervisor refused a child job (`EnqueueReply.refusal`)."""

    INVALID = "invalid"  # a field, a combination of fields, or an unknown job type
    DUPLICATE = "duplicate"  # its dedupe key is taken; `existing_id` names the job
    UNAVAILABLE = "unavailable"  # the store or the node cannot take jobs right now


class EnqueueReply(msgspec.Struct, tag="enqueued", tag_field="msg", array_like=True, gc=False):
    """The answer to one `EnqueueRequest`: the new job's id, or why there is none."""

    request_id: int
    job_id: str | None = None
    refusal: Refusal | None = None
    error: str = ""
    existing_id: str | None = None


# -- worker to supervisor ------------------------------------------------------------------


class ActorInfo(msgspec.Struct, array_like=True, gc=False):
    """What the supervisor needs to know about one actor's declared defaults."""

    name: str
    timeout: float | None = None
    max_retries: int | None = None
    concurrency: int | None = None
    queue: str | None = None
    priority: int | None = None
    schedule: str | None = None  # a five-field cron expression (UTC): a periodic job
    rate_limit: str | None = None  # at most N starts per window: "100/s", "6000/m"
    # A typed actor's payload: its type's shape (`shapes.py`), which the supervisor checks
    # enqueues with, and its JSON Schema (published); None for the classic form.
    shape: bytes | None = None
    schema: bytes | None = None
    keyword: bool = False  # the keyword form: a null payload stands for `{}`
    # flow control by key: at most N running jobs per `concurrency_key`, and a pace per key
    key_concurrency: int | None = None
    key_rate_limit: str | None = None


class Ready(msgspec.Struct, tag="ready", tag_field="msg", array_like=True, gc=False):
    """A worker booted and imported its actors."""

    pid: int
    actors: list[ActorInfo]


class BootFailed(msgspec.Struct, tag="boot_failed", tag_field="msg", array_like=True, gc=False):
    """A worker could not import its actor modules; it exits with WORKER_BOOT_ERROR.
    `error` is one line naming the module, the exception and where it was raised."""

    error: str
    traceback: str = ""
    module: str = ""
    location: str = ""  # file:line, when the failure happened in a file


class JobDone(msgspec.Struct, tag="done", tag_field="msg", array_like=True, gc=False):
    """An attempt succeeded. `result` is the handler's return value as JSON."""

    job_id: str
    result: bytes
    duration: float
    rss_kb: int = 0


class JobFailed(msgspec.Struct, tag="failed", tag_field="msg", array_like=True, gc=False):
    """An attempt raised. `retry=False` means the handler asked to fail now; `traceback`
    (an unexpected exception's, cut to `Boot.max_traceback_bytes`) is stored with it."""

    job_id: str
    error: str
    duration: float
    retry: bool = True
    delay: float | None = None
    traceback: str = ""
    rss_kb: int = 0


class Started(msgspec.Struct, tag="started", tag_field="msg", array_like=True, gc=False):
    """A queued attempt (`RunJob.announce`) starts now: sent before its handler runs."""

    job_id: str


class Dropped(msgspec.Struct, tag="dropped", tag_field="msg", array_like=True, gc=False):
    """Queued attempts the worker will not run (withdrawn, or past their `start_by`)."""

    job_ids: list[str]


class Progress(msgspec.Struct, tag="progress", tag_field="msg", array_like=True, gc=False):
    """The running job's latest progress: a JSON number 0-1 or a small JSON object."""

    job_id: str
    value: bytes


class EnqueueRequest(msgspec.Struct, tag="enqueue", tag_field="msg", array_like=True, gc=False):
    """The running job asks for a child job. `spec` is the job as POST /jobs takes it
    (JSON); the supervisor sets its `parent_id` to the running job."""

    request_id: int
    job_id: str
    spec: bytes
    trace_context: dict[str, str] | None = None  # the attempt's span, with --otel


ToWorker = Boot | RunJobs | Go | Withdraw | Extend | Shutdown | EnqueueReply
FromWorker = (
    Ready | BootFailed | Started | JobDone | JobFailed | Dropped | Progress | EnqueueRequest
)


_LENGTH = struct.Struct("!I")
_PREFIX = bytes(_LENGTH.size)


class _Framer:
    """Whole frames (length prefix, then the message) encoded straight into one buffer."""

    def __init__(self) -> None:
        self._encoder = msgspec.msgpack.Encoder()
        self.encode = self._encoder.encode

    def frame(self, message: ToWorker | FromWorker) -> bytearray:
        """One frame, ready to write."""
        buffer = bytearray(_PREFIX)
        self._encoder.encode_into(message, buffer, _LENGTH.size)
        _LENGTH.pack_into(buffer, 0, len(buffer) - _LENGTH.size)
        return buffer

    def frames(self, messages: Sequence[ToWorker | FromWorker]) -> bytearray:
        """Several frames in one buffer, to go out in one write."""
        buffer = bytearray()
        for message in messages:
            start = len(buffer)
            buffer += _PREFIX
            self._encoder.encode_into(message, buffer, start + _LENGTH.size)
            _LENGTH.pack_into(buffer, start, len(buffer) - start - _LENGTH.size)
        return buffer


class SupervisorCodec(_Framer):
    """The supervisor's side: encodes ToWorker, decodes FromWorker (built once, reused)."""

    def __init__(self) -> None:
        super().__init__()
        self.decode = msgspec.msgpack.Decoder(FromWorker).decode


class WorkerCodec(_Framer):
    """The worker's side: encodes FromWorker, decodes ToWorker (built once, reused)."""

    def __init__(self) -> None:
        super().__init__()
        self.decode = msgspec.msgpack.Decoder(ToWorker).decode
