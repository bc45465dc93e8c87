"""Every message between the supervisor and its worker processes, and nothing else.

Frames are a 4-byte big-endian length, then one msgpack-encoded tagged union, over the
socket pair the supervisor made when it spawned the worker. New fields get defaults so
the protocol can evolve. Every message is an array-like struct untracked by the garbage
collector (it holds only scalars, text, bytes and lists of those); each side has one
encoder and one decoder (`SupervisorCodec`, `WorkerCodec`) and encodes a frame, length
prefix included, into one buffer (`frame`), so a frame is never copied to be sent.

A worker's life on the pipe: the supervisor sends `Boot` first; the worker answers
`Ready` (or `BootFailed` and exits with WORKER_BOOT_ERROR). Then, one job at a time:
`RunJob`, `Extend` every supervisor tick while it runs, and the worker's `JobDone` or
`JobFailed`. While a job runs, the worker may send `Progress` and `EnqueueRequest` (each
request answered by one `EnqueueReply`). A worker the supervisor stopped extending dies
by SIGALRM at the end of its allowance, saying nothing (`lease_alarm.py`). `Shutdown`
ends an idle worker.
"""

from __future__ import annotations

import struct
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


class RunJob(msgspec.Struct, tag="run", tag_field="msg", array_like=True, gc=False):
    """Run one attempt of a job. `payload` is the job's JSON payload, undecoded.

    `allowance` (seconds, None for no bound) is how long the worker may run it without
    hearing `Extend`: past it, the supervisor is presumed frozen and the kernel ends the
    worker before the job's lease can run out and another node take the job over."""

    job_id: str
    type: str
    attempt: int
    queue: str
    payload: bytes
    allowance: float | None = None


class Extend(msgspec.Struct, tag="extend", tag_field="msg", array_like=True, gc=False):
    """The supervisor is alive: the running job may go on for `seconds` from now."""

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


ToWorker = Boot | RunJob | Extend | Shutdown | EnqueueReply
FromWorker = Ready | BootFailed | JobDone | JobFailed | Progress | EnqueueRequest


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
