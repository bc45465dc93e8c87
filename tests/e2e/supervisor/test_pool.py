"""The pool: the pipe's frame decoder in-process, then real worker processes driven
through the pool's own calls, its events caught by recording listeners."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import signal
import struct
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import pytest
from goqueue.actors.protocol import (
    ActorInfo,
    BootFailed,
    FromWorker,
    JobDone,
    JobFailed,
    Ready,
    SupervisorCodec,
    WorkerCodec,
)
from goqueue.supervisor.common.enums import KillReason, WorkerState
from goqueue.supervisor.common.errors import DuplicateJob, UnknownJobType
from goqueue.supervisor.common.jobs import Job, JobSpec, Lease
from goqueue.supervisor.workers import child_enqueues as child_jobs
from goqueue.supervisor.workers.channel import Channel
from goqueue.supervisor.workers.child_enqueues import EnqueueChild
from goqueue.supervisor.workers.events import Listeners
from goqueue.supervisor.workers.handle import Worker
from goqueue.supervisor.workers.pool import Pool, Recycle, WorkerConfig

from tests.conftest import stays_true_async

pytestmark = pytest.mark.timeout(30)

ROOT = Path(__file__).resolve().parents[3]
# the checkout first on the workers' import path, as a project folder would be
CONFIG = WorkerConfig(("tests.fixtures.testactors",), (str(ROOT),), max_result_bytes=1000)


def frame(message: Any) -> bytes:
    """One message as a worker writes it: 4-byte big-endian length, then msgpack."""
    payload = WorkerCodec().encode(message)
    return struct.pack("!i", len(payload)) + payload


MESSAGES: list[FromWorker] = [
    Ready(11, [ActorInfo("noop"), ActorInfo("spin", 2.5, 0, 1)]),
    JobDone("job-1", b'{"ok":true}', 0.25, 2048),
    JobFailed("job-2", "boom", 0.5, retry=False, traceback="Traceback ..."),
    BootFailed("cannot import", ""),
    JobDone("job-3", b"x" * 70_000, 1.0),  # bigger than one read
]


def decode_all(chunks: list[bytes]) -> list[FromWorker]:
    got: list[FromWorker] = []
    channel = Channel(SupervisorCodec().decode)
    channel.listen(got.append, lambda: None)
    for chunk in chunks:
        channel.data_received(chunk)
    assert not channel.buffer  # nothing left over once every frame is in
    return got


def test_frames_coalesced_into_one_read_decode_in_order() -> None:
    assert decode_all([b"".join(frame(m) for m in MESSAGES)]) == MESSAGES


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5, 7, 64, 4096])
def test_frames_split_at_any_byte_decode_once_whole(size: int) -> None:
    messages = MESSAGES if size >= 64 else MESSAGES[:-1]  # 70 kB a byte at a time is slow
    stream = b"".join(frame(m) for m in messages)
    chunks = [stream[i : i + size] for i in range(0, len(stream), size)]
    assert decode_all(chunks) == messages


def test_a_partial_frame_waits_for_the_rest() -> None:
    got: list[FromWorker] = []
    channel = Channel(SupervisorCodec().decode)
    channel.listen(got.append, lambda: None)
    whole = frame(MESSAGES[1])
    channel.data_received(whole[:3])  # not even a whole header
    channel.data_received(whole[3:-1])
    assert got == []
    channel.data_received(whole[-1:] + frame(MESSAGES[2])[:6])
    assert got == [MESSAGES[1]]
    channel.data_received(frame(MESSAGES[2])[6:])
    assert got == MESSAGES[1:3]


def test_recycling_policy() -> None:
    worker = Worker(1, 0, 1, -1, None)  # type: ignore[arg-type]
    worker.jobs_run, worker.rss_kb = 2, 5000
    assert not Recycle().due(worker)
    assert Recycle(max_jobs=2).due(worker) and not Recycle(max_jobs=3).due(worker)
    assert Recycle(max_rss_kb=4999).due(worker) and not Recycle(max_rss_kb=5000).due(worker)


# -- real processes ----------------------------------------------------------------------


class Events:
    """Both listeners at once: records every event, wakes whoever waits for one."""

    def __init__(self) -> None:
        self.seen: list[tuple[Any, ...]] = []
        self.changed = asyncio.Event()

    def _add(self, *event: Any) -> None:
        self.seen.append(event)
        self.changed.set()

    async def wait_for(self, kind: str, timeout: float = 15.0) -> tuple[Any, ...]:
        async with asyncio.timeout(timeout):
            while True:
                for event in self.seen:
                    if event[0] == kind:
                        return event
                self.changed.clear()
                await self.changed.wait()

    def kinds(self) -> list[str]:
        return [event[0] for event in self.seen]

    def job_started(self, lease: Lease, worker: Worker) -> None:
        self._add("job_started", lease, worker)

    def job_dropped(self, lease: Lease, worker: Worker) -> None:
        self._add("job_dropped", lease, worker)

    def job_done(self, lease: Lease, message: JobDone, worker: Worker) -> None:
        self._add("job_done", lease, message)

    def job_failed(self, lease: Lease, message: JobFailed, worker: Worker) -> None:
        self._add("job_failed", lease, message)

    def job_lost(self, lease: Lease, worker: Worker) -> None:
        self._add("job_lost", lease, worker.kill_reason)

    def worker_ready(self, worker: Worker, message: Ready) -> None:
        self._add("worker_ready", worker)

    def worker_boot_failed(self, worker: Worker, message: BootFailed) -> None:
        self._add("worker_boot_failed", worker, message.error)

    def worker_recycled(self, worker: Worker) -> None:
        self._add("worker_recycled", worker)

    def worker_exited(self, worker: Worker) -> None:
        self._add("worker_exited", worker, worker.kill_reason)


def running(job_type: str, payload: bytes = b"null", timeout: float | None = None) -> Lease:
    now = datetime.now(UTC)
    spec = JobSpec(type=job_type, timeout_seconds=timeout)
    job = Job.from_spec(spec, now=now, max_retries=0)
    job.payload = msgspec.Raw(payload)
    job.attempts = 1
    return Lease(job=job, token=f"t-{job.id}", owner="test", expires_at=now)


async def started(
    children: EnqueueChild = child_jobs.unwired, **options: Any
) -> tuple[Pool, Events, Worker]:
    events = Events()
    listeners = Listeners(jobs=events, workers=events, children=children)
    pool = Pool(asyncio.get_running_loop(), CONFIG, listeners=listeners, **options)
    worker = pool.spawn(0)
    await events.wait_for("worker_ready")
    assert worker.state == WorkerState.IDLE and "noop" in worker.types
    return pool, events, worker


async def test_a_job_runs_and_its_outcome_goes_to_the_job_listener() -> None:
    pool, events, worker = await started()
    try:
        lease = running("noop", b"7")
        pool.run(worker, lease, timeout=10)
        assert worker.state == WorkerState.BUSY and pool.holding(lease.token) is worker
        _, reported, message = await events.wait_for("job_done")
        assert reported is lease and message.result == b"7"
        assert worker.state == WorkerState.IDLE and worker.lease is None and worker.jobs_run == 1
    finally:
        await pool.shutdown(5)
    assert events.kinds()[-1] == "worker_exited" and "job_lost" not in events.kinds()


async def test_an_overrun_deadline_kills_the_worker_and_the_attempt_is_lost(
    tmp_path: Path,
) -> None:
    pool, events, worker = await started(kill_grace=0.05)
    try:
        lease = running("spin", json.dumps({"dir": str(tmp_path)}).encode())
        pool.run(worker, lease, timeout=0.2)
        _, reported, reason = await events.wait_for("job_lost")
        assert reported is lease and reason == KillReason.TIMEOUT
        _, gone, reason = await events.wait_for("worker_exited")
        assert gone is worker and reason == KillReason.TIMEOUT and worker.exitcode == -9
        assert events.kinds().index("job_lost") < events.kinds().index("worker_exited")
    finally:
        await pool.shutdown(5)


async def test_a_short_deadline_after_a_long_one_kills_on_time(tmp_path: Path) -> None:
    """The deadline timer a job with a long deadline left armed does not delay the
    shorter deadline of the next job on the same worker."""
    pool, events, worker = await started(kill_grace=0.05)
    try:
        pool.run(worker, running("noop"), timeout=60)
        await events.wait_for("job_done")
        hung = running("spin", json.dumps({"dir": str(tmp_path)}).encode())
        began = time.monotonic()
        pool.run(worker, hung, timeout=0.2)
        _, reported, reason = await events.wait_for("job_lost", timeout=10)
        assert reported is hung and reason == KillReason.TIMEOUT
        assert time.monotonic() - began < 2.0  # not the first job's 60 s
    finally:
        await pool.shutdown(5)


async def test_a_long_deadline_after_a_short_one_is_not_cut_at_the_first(
    tmp_path: Path,
) -> None:
    """A job that outlives the previous job's (shorter) deadline on the same worker runs
    to its end: that deadline's timer, still armed, only re-arms for the new one."""
    pool, events, worker = await started(kill_grace=0.05)
    try:
        pool.run(worker, running("noop"), timeout=0.3)
        await events.wait_for("job_done")
        events.seen.clear()
        slow = running("sleep", json.dumps({"seconds": 0.8}).encode())
        pool.run(worker, slow, timeout=10)
        _, reported, message = await events.wait_for("job_done", timeout=10)
        assert reported is slow and json.loads(message.result) == {"slept": 0.8}
        assert "job_lost" not in events.kinds() and worker.kill_reason is None
        hung = running("spin", json.dumps({"dir": str(tmp_path)}).encode())
        pool.run(worker, hung, timeout=0.2)  # and a deadline still kills after all that
        _, reported, reason = await events.wait_for("job_lost", timeout=10)
        assert reported is hung and reason == KillReason.TIMEOUT
    finally:
        await pool.shutdown(5)


async def test_a_worker_due_for_recycling_is_stopped_after_its_job() -> None:
    pool, events, worker = await started(recycle=Recycle(max_jobs=1))
    try:
        pool.run(worker, running("noop"), timeout=10)
        await events.wait_for("job_done")
        assert events.kinds()[-1] == "worker_recycled"  # decided after the outcome went out
        _, gone, reason = await events.wait_for("worker_exited")
        assert gone is worker and reason == KillReason.RECYCLE and worker.exitcode == 0
        assert len(pool) == 0
    finally:
        await pool.shutdown(5)


def payload(**fields: Any) -> bytes:
    return json.dumps(fields).encode()


async def test_a_job_over_the_memory_limit_is_killed_and_fails(tmp_path: Path) -> None:
    pool, events, worker = await started(memory_limit_mb=200)
    try:
        lease = running("memory_hog", payload(dir=str(tmp_path), mb=1500, step=50))
        pool.run(worker, lease, timeout=60)
        _, reported, message = await events.wait_for("job_failed", timeout=30)
        assert reported is lease and message.retry
        assert message.error.startswith("exceeded the memory limit (200 MB)")
        _, gone, reason = await events.wait_for("worker_exited")
        assert gone is worker and reason == KillReason.MEMORY and worker.exitcode == -9
        assert "job_lost" not in events.kinds()
        logged = [int(line) for line in (tmp_path / "hog.log").read_text().split()]
        assert 100 <= max(logged) < 1024, logged  # sampled every 50 ms, far from 1.5 GB
    finally:
        await pool.shutdown(5)


async def test_a_job_whose_supervisor_falls_silent_is_abandoned(tmp_path: Path) -> None:
    pool, events, worker = await started(lease_allowance=0.5)
    try:
        lease = running("hold", payload(dir=str(tmp_path), seconds=10))
        pool.run(worker, lease, timeout=60)
        async with asyncio.timeout(10):
            while not list(tmp_path.glob("hold-*")):
                await asyncio.sleep(0.01)
        time.sleep(1.5)  # the supervisor's loop frozen: no Extend goes out
        _, reported, message = await events.wait_for("job_failed")
        assert reported is lease and "killed by SIGALRM, its lease alarm" in message.error
        _, gone, reason = await events.wait_for("worker_exited")
        assert gone is worker and reason == KillReason.LEASE_LOST
        assert worker.exitcode == -signal.SIGALRM
        assert not list(tmp_path.glob("done-*"))
    finally:
        await pool.shutdown(5)


async def test_a_worker_stopped_past_its_allowance_runs_no_more_of_its_job(
    tmp_path: Path,
) -> None:
    """A worker SIGSTOPped past its allowance while the supervisor goes on extending:
    on SIGCONT its `Extend` frames wait in the pipe and the job's sleep is over, but the
    kernel's alarm is already pending, so the process ends before the job writes on."""
    pool, events, worker = await started(lease_allowance=0.5)
    try:
        lease = running("hold", payload(dir=str(tmp_path), seconds=1.0))
        pool.run(worker, lease, timeout=60)
        async with asyncio.timeout(10):
            while not list(tmp_path.glob("hold-*")):
                await asyncio.sleep(0.01)
        os.kill(worker.pid, signal.SIGSTOP)
        try:
            # stopped past its allowance and its job's end: nothing runs meanwhile
            await stays_true_async(
                lambda: not list(tmp_path.glob("done-*")), 1.5, what="a stopped job finished"
            )
        finally:
            os.kill(worker.pid, signal.SIGCONT)
        _, reported, message = await events.wait_for("job_failed")
        assert reported is lease and "SIGALRM" in message.error
        _, gone, reason = await events.wait_for("worker_exited")
        assert gone is worker and reason == KillReason.LEASE_LOST
        assert worker.exitcode == -signal.SIGALRM
        assert not list(tmp_path.glob("done-*"))
    finally:
        await pool.shutdown(5)


async def test_extend_keeps_a_long_job_alive_within_its_allowance(tmp_path: Path) -> None:
    pool, events, worker = await started(lease_allowance=1.0)
    try:
        pool.run(worker, running("hold", payload(dir=str(tmp_path), seconds=2.5)), timeout=60)
        await events.wait_for("job_done")
        assert "worker_exited" not in events.kinds()
    finally:
        await pool.shutdown(5)


async def test_ctx_enqueue_goes_through_the_callback_with_the_running_job_as_parent() -> None:
    asked: list[tuple[JobSpec, str]] = []

    async def enqueue(spec: JobSpec, parent_id: str) -> str:
        asked.append((spec, parent_id))
        if spec.type == "taken":
            raise DuplicateJob("job-0")
        if spec.type == "unknown":
            raise UnknownJobType(spec.type)
        return f"child-{len(asked)}"

    pool, events, worker = await started(children=enqueue)
    try:
        children = [
            {"type": "noop", "payload": {"a": 1}, "options": {"priority": 8}},
            {"type": "taken"},
            {"type": "unknown"},
            {"type": "noop", "options": {"priority": 99}},
        ]
        lease = running("parent", payload(children=children))
        pool.run(worker, lease, timeout=10)
        _, _, message = await events.wait_for("job_done")
        answers = msgspec.json.decode(message.result)
        assert answers[0] == {"id": "child-1"}
        assert answers[1] == {
            "refusal": "duplicate",
            "error": "duplicate of job job-0",
            "existing": "job-0",
        }
        assert answers[2]["refusal"] == "invalid" and "unknown job type" in answers[2]["error"]
        assert answers[3]["refusal"] == "invalid" and "priority" in answers[3]["error"]
        assert [(spec.type, parent) for spec, parent in asked] == [
            ("noop", lease.job.id),
            ("taken", lease.job.id),
            ("unknown", lease.job.id),
        ]  # the invalid one never reached the engine
        assert asked[0][0].priority == 8 and bytes(asked[0][0].payload) == b'{"a":1}'
    finally:
        await pool.shutdown(5)


async def test_progress_is_kept_for_the_running_attempt_only(tmp_path: Path) -> None:
    pool, events, worker = await started()
    try:
        reports = [0.25, {"stage": "upload", "done": 3}]
        lease = running("reporter", payload(dir=str(tmp_path), reports=reports))
        pool.run(worker, lease, timeout=30)
        async with asyncio.timeout(10):
            while pool.progress_of(lease.job.id) != msgspec.Raw(b'{"stage":"upload","done":3}'):
                await asyncio.sleep(0.01)
        (tmp_path / "go").touch()
        await events.wait_for("job_done")
        assert pool.progress_of(lease.job.id) is None
    finally:
        await pool.shutdown(5)


async def test_a_spawn_that_fails_leaves_nothing_open(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> int:
        raise OSError(errno.EAGAIN, "Resource temporarily unavailable")

    pool = Pool(asyncio.get_running_loop(), CONFIG)
    before = sorted(os.listdir("/proc/self/fd"))
    monkeypatch.setattr(os, "posix_spawn", refuse)
    with pytest.raises(OSError, match="temporarily unavailable"):
        pool.spawn(0)
    assert sorted(os.listdir("/proc/self/fd")) == before and len(pool) == 0


async def test_workers_are_direct_children_of_the_supervisor() -> None:
    pool, _events, worker = await started()
    try:
        status = Path(f"/proc/{worker.pid}/status").read_text()
        assert f"PPid:\t{os.getpid()}\n" in status
        cmdline = Path(f"/proc/{worker.pid}/cmdline").read_bytes().split(b"\0")
        assert b"goqueue.actors.child" in cmdline and b"multiprocessing" not in b" ".join(cmdline)
    finally:
        await pool.shutdown(5)
    assert worker.exitcode == 0 and not Path(f"/proc/{worker.pid}").exists()
