"""Every message between the supervisor and its worker processes, and nothing else.

Frames are msgpack-encoded tagged unions sent with `Connection.send_bytes` (which
length-prefixes them). New fields get defaults so the protocol can evolve.
"""

from __future__ import annotations

import msgspec

# Exit codes: a named contract between a worker and its supervisor.
WORKER_OK = 0
WORKER_BOOT_ERROR = 3  # the actor modules could not be imported: respawning will not help


class RunJob(msgspec.Struct, tag="run", tag_field="msg", array_like=True):
    """Run one attempt of a job. `payload` is the job's JSON payload, undecoded."""

    job_id: str
    type: str
    attempt: int
    queue: str
    payload: bytes


class Shutdown(msgspec.Struct, tag="shutdown", tag_field="msg", array_like=True):
    """Finish nothing more; exit cleanly (recycling, reload, shutdown)."""


class ActorInfo(msgspec.Struct, array_like=True):
    """What the supervisor needs to know about one actor's declared defaults."""

    name: str
    timeout: float | None = None
    max_retries: int | None = None
    concurrency: int | None = None
    queue: str | None = None
    priority: int | None = None


class Ready(msgspec.Struct, tag="ready", tag_field="msg", array_like=True):
    """A worker booted and imported its actors."""

    pid: int
    actors: list[ActorInfo]


class BootFailed(msgspec.Struct, tag="boot_failed", tag_field="msg", array_like=True):
    """A worker could not import its actor modules; it exits with WORKER_BOOT_ERROR."""

    error: str
    traceback: str = ""


class JobDone(msgspec.Struct, tag="done", tag_field="msg", array_like=True):
    """An attempt succeeded. `result` is the handler's return value as JSON."""

    job_id: str
    result: bytes
    duration: float
    rss_kb: int = 0


class JobFailed(msgspec.Struct, tag="failed", tag_field="msg", array_like=True):
    """An attempt raised. `retry=False` means the handler asked to fail now."""

    job_id: str
    error: str
    duration: float
    retry: bool = True
    delay: float | None = None
    traceback: str = ""
    rss_kb: int = 0


ToWorker = RunJob | Shutdown
FromWorker = Ready | BootFailed | JobDone | JobFailed


class SupervisorCodec:
    """The supervisor's side: encodes ToWorker, decodes FromWorker (built once, reused)."""

    def __init__(self) -> None:
        self.encode = msgspec.msgpack.Encoder().encode
        self.decode = msgspec.msgpack.Decoder(FromWorker).decode


class WorkerCodec:
    """The worker's side: encodes FromWorker, decodes ToWorker (built once, reused)."""

    def __init__(self) -> None:
        self.encode = msgspec.msgpack.Encoder().encode
        self.decode = msgspec.msgpack.Decoder(ToWorker).decode
