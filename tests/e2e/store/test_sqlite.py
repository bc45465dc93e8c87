"""The SQLite store's own promises, beyond the contract: what a restart finds in the
file, what a crash leaves (jobs running at it are reaped, their attempt counted), one
node per file, a clear line for a file that cannot be used, group commit, and a full
disk answered as unavailable with nothing half-stored."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import msgspec
import pytest
from goqueue.supervisor.common.deliveries import Answer
from goqueue.supervisor.common.enums import Status, WorkflowStatus
from goqueue.supervisor.common.errors import (
    BootError,
    DuplicateJob,
    OutcomeUnknown,
    StoreUnavailable,
)
from goqueue.supervisor.common.jobs import DeadLetter, Event, Job, JobSpec, Lease, new_id, utcnow
from goqueue.supervisor.common.rates import Rate
from goqueue.supervisor.common.reads import JobFilter
from goqueue.supervisor.common.schedule import Fired
from goqueue.supervisor.common.summaries import DeadFilter
from goqueue.supervisor.store.base import NewJob
from goqueue.supervisor.store.new_workflow import NewStep, NewWorkflow
from goqueue.supervisor.store.sqlite import database
from goqueue.supervisor.store.sqlite.schema import MIGRATIONS, VERSION
from goqueue.supervisor.store.sqlite.store import SqliteStore

pytestmark = pytest.mark.timeout(30)

ALL = {"a": 100, "b": 100}
TICK = datetime(2030, 1, 31, 9, 0, tzinfo=UTC)


class Clock:
    """A hand-moved clock, so leases and delays run out without waiting."""

    def __init__(self) -> None:
        self.at = utcnow()

    def now(self) -> datetime:
        return self.at

    def advance(self, seconds: float) -> None:
        self.at += timedelta(seconds=seconds)


def new(type: str = "a", *, idempotency_key: str | None = None, **fields: object) -> NewJob:
    spec = msgspec.json.decode(msgspec.json.encode({"type": type, **fields}), type=JobSpec)
    return NewJob(
        spec=spec,
        max_retries=int(spec.max_retries or 3),
        idempotency_key=idempotency_key,
        request_hash="h" if idempotency_key else None,
    )


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def path(tmp_path: Path) -> str:
    return str(tmp_path / "jobs.db")


async def opened(path: str, clock: Clock) -> SqliteStore:
    store = SqliteStore(path, "node-a", clock=clock.now)
    await store.open()
    return store


@contextlib.asynccontextmanager
async def full_disk(store: SqliteStore) -> AsyncIterator[None]:
    """While inside, the file may grow no more, as on a full disk; room again after. Its
    free pages are given back first: on a full disk no write goes, not even one that a
    page freed by the last could hold (a script steps the vacuum to its end)."""
    await store.db.read(lambda c: c.executescript("PRAGMA incremental_vacuum;"))
    pages = await store.db.read(lambda c: c.execute("PRAGMA page_count").fetchone()[0])
    await store.db.read(lambda c: c.execute(f"PRAGMA max_page_count = {pages}").fetchone())
    try:
        yield
    finally:
        await store.db.read(lambda c: c.execute("PRAGMA max_page_count = 1073741823").fetchone())


async def crash(store: SqliteStore) -> None:
    """Stop as a `kill -9` would: no final commit, no release of anything held."""
    await store.db.close()


async def test_a_restart_finds_everything_that_was_answered(path: str, clock: Clock) -> None:
    store = await opened(path, clock)
    later = (clock.at + timedelta(hours=1)).isoformat()
    first = (await store.enqueue(new(priority=1))).job
    delayed = (await store.enqueue(new(run_at=later))).job
    await store.enqueue(new(dedupe_key="d", dedupe_window_seconds=600))
    await store.enqueue(new(unique_key="u"))
    keyed = (await store.enqueue(new(idempotency_key="k"))).job
    dead_lease = (await store.claim(1, None, {"a": 1}))[0]
    assert dead_lease.job.id == keyed.id or dead_lease.job.priority == 5
    await store.fail(dead_lease, "boom", None)
    await store.set_paused("slow", True)
    assert (await store.fire_schedule("hourly", TICK, new("b")))[0] == Fired.FIRED
    before = (await store.stats()).counts
    await store.close()

    again = await opened(path, clock)
    assert (await again.stats()).counts == before
    got = await again.get(first.id)
    assert got is not None and got.status == "pending"
    assert again.next_due_at() == delayed.run_at
    with pytest.raises(DuplicateJob):
        await again.enqueue(new(dedupe_key="d", dedupe_window_seconds=600))
    with pytest.raises(DuplicateJob):
        await again.enqueue(new(unique_key="u"))
    repeat = await again.enqueue(new(idempotency_key="k"))
    assert repeat.created is False and repeat.job.id == keyed.id
    assert (await again.list_dead(10, 0)).total == 1
    assert (await again.queue_stats("slow")).paused
    assert (await again.fire_schedule("hourly", TICK, new("b"))) == (Fired.TAKEN, None)
    assert (await again.schedule_states())["hourly"].last_fire == TICK
    # enqueue order goes on after the restart: the newest is listed first
    newest = (await again.enqueue(new())).job
    assert (await again.list_jobs(JobFilter(), 1, 0)).items[0].id == newest.id
    assert [e.event for e in await again.events(dead_lease.job.id)][-1] == "dead_lettered"
    await again.close()


async def test_a_job_running_at_a_crash_is_reaped_with_its_attempt_counted(
    path: str, clock: Clock
) -> None:
    store = await opened(path, clock)
    job = (await store.enqueue(new(max_retries=1))).job
    (lease,) = await store.claim(1, None, ALL)
    assert lease.job.attempts == 1
    await crash(store)

    again = await opened(path, clock)
    left = await again.get(job.id)
    assert left is not None and left.status == "running"
    (reaped,) = await again.reap_expired()  # at once: the holder is gone with its node
    assert reaped.id == job.id and reaped.status == "pending" and reaped.attempts == 1
    (lease,) = await again.claim(1, None, ALL)
    assert lease.job.attempts == 2
    await crash(again)

    last = await opened(path, clock)  # its last retry lost too: dead-lettered
    (reaped,) = await last.reap_expired()
    assert reaped.status == "failed"
    assert (await last.get_dead(job.id)) is not None
    await last.close()


async def test_an_outcome_is_in_the_file_when_it_returns(path: str, clock: Clock) -> None:
    store = await opened(path, clock)
    job = (await store.enqueue(new(on_success={"type": "b"}))).job
    (lease,) = await store.claim(1, None, ALL)
    outcome = await store.complete(lease, msgspec.Raw(b'{"ok":true}'))
    assert outcome is not None and len(outcome.followups) == 1
    await crash(store)
    again = await opened(path, clock)
    done = await again.get(job.id)
    assert done is not None and done.status == "done" and done.result is not None
    assert bytes(done.result) == b'{"ok":true}'
    assert (await again.get(outcome.followups[0].id)) is not None
    assert await again.reap_expired() == []
    await again.close()


async def test_webhooks_owed_at_a_crash_are_due_after_the_restart(path: str, clock: Clock) -> None:
    store = await opened(path, clock)
    job = (await store.enqueue(new(webhook_url="http://127.0.0.1:9/hook"))).job
    (lease,) = await store.claim(1, None, ALL)
    await store.complete(lease, None)
    (due,) = await store.outbox.claim(10, 30.0)  # leased, then the node dies mid-attempt
    assert due.job_id == job.id and due.event == "job.done"
    assert msgspec.json.decode(due.body)["status"] == "done"
    await crash(store)

    again = await opened(path, clock)
    assert await again.outbox.claim(10, 30.0) == []  # the dead node's lease still holds
    clock.advance(31)
    (retry,) = await again.outbox.claim(10, 30.0)
    assert retry.id == due.id
    assert await again.outbox.record(due, Answer(status_code=200), delay=1, max_age=3600) is None
    gave_up = await again.outbox.record(retry, Answer(status_code=200), delay=1, max_age=3600)
    assert gave_up is False
    (delivery,) = await again.outbox.of_job(job.id)
    assert delivery.delivered_at is not None and len(delivery.attempts) == 1
    await again.close()


async def test_a_second_store_on_the_file_is_refused_in_one_line(path: str, clock: Clock) -> None:
    store = await opened(path, clock)
    with pytest.raises(BootError, match=r"jobs\.db is in use by another GoQueue node"):
        await opened(path, clock)
    await store.close()
    await (await opened(path, clock)).close()  # free again once the first is closed


def missing_folder(root: Path) -> Path:
    return root / "missing" / "jobs.db"


def a_directory(root: Path) -> Path:
    (root / "adir").mkdir()
    return root / "adir"


def not_a_database(root: Path) -> Path:
    (root / "junk.db").write_bytes(b"not a database" * 100)
    return root / "junk.db"


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (missing_folder, "does not exist"),
        (a_directory, "is a directory"),
        (not_a_database, "not a database"),
    ],
)
async def test_a_file_that_cannot_be_used_is_one_line_naming_it(
    tmp_path: Path, clock: Clock, make: Callable[[Path], Path], says: str
) -> None:
    target = make(tmp_path)
    with pytest.raises(BootError) as caught:
        await opened(str(target), clock)
    message = str(caught.value)
    assert str(target) in message and says in message and "\n" not in message


async def test_a_file_from_a_newer_goqueue_is_refused(path: str, clock: Clock) -> None:
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA user_version = 999")
    with pytest.raises(BootError, match="newer"):
        await opened(path, clock)


async def test_a_file_of_the_first_schema_is_migrated_and_keeps_its_jobs(
    path: str, clock: Clock
) -> None:
    """A file as GoQueue 0.x left it (schema 1: a job's JSON and its trail in one row) is
    brought up to date, and its jobs, dead letters and trails are found again."""
    job = Job.from_spec(new().spec, now=clock.now(), max_retries=3)
    job.seq = 7
    failed = Job.from_spec(new("b").spec, now=clock.now(), max_retries=0)
    failed.seq, failed.status, failed.last_error = 8, Status.FAILED, "boom"
    failed.finished_at = clock.now()
    letter = DeadLetter(
        id=new_id(), job_id=failed.id, job=failed, errors=(), created_at=clock.now()
    )
    trail = msgspec.json.encode(
        [Event(job_id=job.id, event="enqueued", at=clock.now(), node="n", attempt=0)]
    )
    with sqlite3.connect(path) as conn:
        conn.isolation_level = None
        for statement in MIGRATIONS[0]:
            conn.execute(statement)
        conn.execute("PRAGMA user_version = 1")
        insert = (
            "INSERT INTO jobs (id, seq, status, finished_at, job, result, events)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)"
        )
        conn.execute(insert, (job.id, 7, "pending", None, msgspec.json.encode(job), None, trail))
        done = failed.finished_at.isoformat()
        conn.execute(
            insert, (failed.id, 8, "failed", done, msgspec.json.encode(failed), None, b"[]")
        )
        conn.execute(
            "INSERT INTO dead_letters (id, letter) VALUES (?, ?)",
            (letter.id, msgspec.json.encode(letter)),
        )
    again = await opened(path, clock)
    kept = await again.get(job.id)
    assert kept is not None and kept.status == "pending" and kept.run_at == job.run_at
    assert [e.event for e in await again.events(job.id)] == ["enqueued"]
    assert (await again.stats()).counts["pending"] == 1
    assert (await again.stats()).dead_letters == 1
    dead = await again.get_dead(failed.id)
    assert dead is not None and dead.id == letter.id
    (lease,) = await again.claim(5, None, ALL)
    assert lease.job.id == job.id
    assert (await again.enqueue(new())).job.seq > 8  # the sequence goes on
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone() == (VERSION,)
    await again.close()


async def test_enqueues_arriving_together_share_a_transaction(path: str, clock: Clock) -> None:
    store = await opened(path, clock)
    before = store.db.transactions
    await asyncio.gather(*(store.enqueue(new()) for _ in range(200)))
    assert store.db.transactions - before <= 3  # one in flight, then the rest together
    assert store.db.syncs >= 1
    await store.close()


async def test_an_enqueue_whose_fsync_failed_is_an_unknown_outcome_not_a_refusal(
    path: str, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = await opened(path, clock)
    await store.enqueue(new())  # the WAL's first sync opens it

    def failing(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", failing)
    with pytest.raises(OutcomeUnknown, match="fsync failed"):  # never "nothing stored"
        await store.enqueue(new(idempotency_key="k"))
    monkeypatch.undo()
    assert (await store.stats()).counts["pending"] == 2  # committed: it was stored
    again = await store.enqueue(new(idempotency_key="k"))  # the safe retry finds it
    assert not again.created
    assert (await store.stats()).counts["pending"] == 2
    await store.close()


async def test_a_full_disk_refuses_the_enqueue_and_keeps_nothing(path: str, clock: Clock) -> None:
    store = await opened(path, clock)
    kept = (await store.enqueue(new())).job
    async with full_disk(store):
        big = "x" * 200_000
        with pytest.raises(StoreUnavailable, match="full"):
            await store.enqueue(new(payload={"big": big}, unique_key="only"))
        assert (await store.stats()).counts["pending"] == 1
        assert [j.id for j in (await store.list_jobs(JobFilter(), 10, 0)).items] == [kept.id]
    again = (await store.enqueue(new(unique_key="only"))).job  # the key was not kept
    assert again.unique_key == "only"
    await store.close()


async def test_an_outcome_whose_commit_failed_is_held_then_written(path: str, clock: Clock) -> None:
    store = await opened(path, clock)
    (await store.enqueue(new()))
    (lease,) = await store.claim(1, None, ALL)
    async with full_disk(store):
        with pytest.raises(StoreUnavailable):
            await store.complete(lease, msgspec.Raw(msgspec.json.encode("y" * 200_000)))
    assert (lease.job.status, lease.job.result) == ("running", None)  # as the file has it
    outcome = await store.complete(lease, msgspec.Raw(b"1"))  # the dispatcher's retry
    assert outcome is not None and outcome.job.status == "done"
    await crash(store)
    again = await opened(path, clock)
    done = await again.get(lease.job.id)
    assert done is not None and done.status == "done"
    await again.close()


async def test_a_start_whose_commit_failed_leaves_the_claim_as_it_was_until_asked_again(
    path: str, clock: Clock
) -> None:
    # The lease handed out must still read as claimed: the dispatcher runs a job whose
    # lease reads as started, and its outcome would then be refused, the claim left to
    # run out its lease and the job run again.
    store = await opened(path, clock)
    job = (await store.enqueue(new(payload={"big": "x" * 20_000}))).job  # a start rewrites it
    (claimed,) = await store.claim(1, None, ALL, start=0)
    async with full_disk(store):
        with pytest.raises(StoreUnavailable):
            await store.start(claimed)
    assert (claimed.job.status, claimed.job.attempts, claimed.job.started_at) == (
        "claimed",
        0,
        None,
    )
    assert await store.complete(claimed, None) is None  # not started: nothing ran
    started = await store.start(claimed)  # the dispatcher's retry, the clock not moved
    assert started is not None and started.token == claimed.token
    outcome = await store.complete(started, msgspec.Raw(b"1"))
    assert outcome is not None and outcome.job.status == "done"
    await crash(store)
    with sqlite3.connect(path) as conn:
        row = conn.execute("SELECT status, lease_token FROM jobs WHERE id = ?", (job.id,))
        assert row.fetchone() == ("done", None)  # no lease left to run out
    again = await opened(path, clock)
    done = await again.get(job.id)
    assert done is not None and (done.status, done.attempts) == ("done", 1)
    assert [e.event for e in await again.events(job.id)].count("started") == 1
    await again.close()


async def sqlite_work(
    store: SqliteStore, read: Callable[[], Awaitable[object]], every: int = 100
) -> int:
    """How much SQLite ran for `read`: its VM instructions, `every` at a time."""
    steps = 0

    def step() -> int:
        nonlocal steps
        steps += 1
        return 0

    await store.db.read(lambda c: c.set_progress_handler(step, every))
    try:
        await read()
    finally:
        await store.db.read(lambda c: c.set_progress_handler(None, every))
    return steps


async def claim_counting_steps(
    store: SqliteStore, limit: int, slots: dict[str, int]
) -> tuple[list[Lease], int]:
    """A claim from every queue, and how much SQLite ran for it (every 10 VM instructions)."""
    leases: list[Lease] = []

    async def claim() -> None:
        leases.extend(await store.claim(limit, None, slots))

    return leases, await sqlite_work(store, claim, every=10)


async def test_a_claim_never_walks_a_paused_queues_backlog(path: str, clock: Clock) -> None:
    # The paused queue's jobs are older, so they lead the type's pending jobs: a claim
    # that stepped over them would cost as much as the backlog (a node draining other
    # queues behind a paused 100,000 ran at a thirtieth of its rate). Counted in SQLite's
    # own steps, a claim costs the same behind 10 paused jobs as behind 3,000.
    store = await opened(path, clock)
    await store.set_paused("held", True)

    async def steps_of_a_claim(backlog: int) -> int:
        await store.enqueue_many([new(queue="held") for _ in range(backlog)])
        clock.advance(1)
        first = (await store.enqueue(new(queue="q2"))).job.id
        clock.advance(1)
        second = (await store.enqueue(new(queue="q1"))).job.id
        leases, steps = await claim_counting_steps(store, 3, ALL)
        assert [lease.job.id for lease in leases] == [first, second]  # merged in order
        return steps

    small = await steps_of_a_claim(10)
    big = await steps_of_a_claim(3_000)
    assert big < 2 * small, (small, big)
    await store.close()


async def test_a_claim_never_walks_the_jobs_scheduled_for_later(path: str, clock: Clock) -> None:
    # Delayed jobs (scheduled, or retries backing off) of the same type, queue and
    # priority sit after the due ones in the index: a claim that came back short used to
    # walk them all (100,000 of them: 9 ms a claim, against 0.2 ms). Counted in steps.
    store = await opened(path, clock)
    later = (clock.at + timedelta(hours=1)).isoformat()

    async def steps_of_a_claim(delayed: int) -> int:
        await store.enqueue_many([new(run_at=later) for _ in range(delayed)])
        due = [(await store.enqueue(new(priority=p))).job.id for p in (5, 7)]
        leases, steps = await claim_counting_steps(store, 5, ALL)
        assert [lease.job.id for lease in leases] == due[::-1]  # the higher priority first
        return steps

    small = await steps_of_a_claim(10)
    big = await steps_of_a_claim(3_000)
    assert big < 2 * small, (small, big)
    await store.close()


async def test_a_claim_never_walks_the_keys_of_a_paused_queue(path: str, clock: Clock) -> None:
    # A type with a per-key limit: the claim walks its pending keys in turn, and keys
    # whose jobs all wait in a paused queue cost it nothing (5,000 of them made each
    # claim take 25 ms rather than 0.3 ms). Counted in SQLite's own steps.
    store = await opened(path, clock)
    await store.register_node({"a": None}, key_limits={"a": 1})
    await store.set_paused("held", True)
    held = 0

    async def steps_of_a_claim(keys: int) -> int:
        nonlocal held
        batch = [new(queue="held", concurrency_key=f"h{held + i:05}") for i in range(keys)]
        await store.enqueue_many(batch)
        held += keys
        clock.advance(1)
        first = (await store.enqueue(new(queue="q2", concurrency_key=f"k{held}"))).job.id
        leases, steps = await claim_counting_steps(store, 3, {"a": 3})
        assert [lease.job.id for lease in leases] == [first]
        return steps

    small = await steps_of_a_claim(10)
    big = await steps_of_a_claim(3_000)
    assert big < 2 * small, (small, big)
    assert await store.claim(5, None, {"a": 5}) == []  # only the paused keys are left
    await store.set_paused("held", False)  # and once resumed, they are walked again
    assert len(await store.claim(5, None, {"a": 5})) == 5
    await store.close()


async def test_a_keys_running_jobs_are_counted_across_a_failed_outcome_and_a_restart(
    path: str, clock: Clock
) -> None:
    store = await opened(path, clock)
    await store.register_node({"a": None}, key_limits={"a": 1})
    for _ in range(3):
        await store.enqueue(new(concurrency_key="k"))
    (lease,) = await store.claim(5, None, ALL)
    async with full_disk(store):
        with pytest.raises(StoreUnavailable):
            await store.complete(lease, msgspec.Raw(msgspec.json.encode("y" * 200_000)))
    assert await store.claim(5, None, ALL) == []  # the outcome was undone: still running
    await crash(store)
    again = await opened(path, clock)
    await again.register_node({"a": None}, key_limits={"a": 1})
    assert await again.claim(5, None, ALL) == []  # its lease holds until it runs out
    outcome = await again.complete(lease, msgspec.Raw(b"1"))
    assert outcome is not None and outcome.job.status == "done"
    (following,) = await again.claim(5, None, ALL)  # the key's slot is free again
    assert following.job.concurrency_key == "k"
    await again.close()


async def test_a_claim_whose_commit_failed_leaves_its_keys_pace_as_it_was(
    path: str, clock: Clock
) -> None:
    # A key paced at 2 a second with a burst of 2: a claim that fails must not spend the
    # burst, or the key waits a period more once the disk has room again.
    store = await opened(path, clock)
    await store.register_node({"a": None}, key_rates={"a": Rate(2, 1.0)})
    for _ in range(4):  # starting a job rewrites its row: no room for that
        await store.enqueue(new(concurrency_key="k", payload={"big": "x" * 20_000}))
    async with full_disk(store):
        with pytest.raises(StoreUnavailable):
            await store.claim(10, None, ALL)
    assert len(await store.claim(10, None, ALL)) == 2  # the clock not moved: the burst
    assert await store.claim(10, None, ALL) == []  # ... and no more
    await store.close()


async def test_the_queues_page_counts_the_jobs_for_later_without_walking_them_all(
    path: str, clock: Clock
) -> None:
    # Reminders scheduled weeks ahead are a deep queue of their own: the Queues page,
    # read on the node's loop, must not walk them all, and must still count them exactly,
    # even in the middle of a turn whose moves are in the rows but not yet counted.
    store = await opened(path, clock)
    shapes = {"later": (3, 10_000), "due": (1_500, 3), "both": (1_200, 1_200)}
    for queue, (due, later) in shapes.items():
        news = [new(queue=queue, delay_seconds=3600) for _ in range(later)]
        news += [new(queue=queue) for _ in range(due)]
        for i in range(0, len(news), 1000):
            await store.enqueue_many(news[i : i + 1000])

    async def counted() -> dict[str, tuple[int, int]]:
        return {q.name: (q.pending, q.scheduled) for q in await store.queue_summaries()}

    got = await counted()
    assert got == {q: (due + later, later) for q, (due, later) in shapes.items()}
    now = clock.now().timestamp()
    whole = "SELECT count(*) FROM jobs WHERE status = 'pending' AND queue = ? AND run_at > ?"

    async def walk_later() -> None:
        await store.db.read(lambda c: c.execute(whole, ("later", now)).fetchone())

    # every queue's summary costs less than walking the deep one's jobs for later once
    assert await sqlite_work(store, counted) < await sqlite_work(store, walk_later)
    # mid-turn: one due job more in "later", in the rows and not yet counted
    enqueue = asyncio.create_task(store.enqueue(new(queue="later")))
    await asyncio.sleep(0)
    assert not enqueue.done() and store.db.open_moves()
    assert (await counted())["later"] == (10_004, 10_000)
    await enqueue
    assert (await counted())["later"] == (10_004, 10_000)
    await store.close()


async def test_bulk_dead_letter_actions_survive_a_restart(path: str, clock: Clock) -> None:
    store = await opened(path, clock)
    for _ in range(3):
        await store.enqueue(new(max_retries=0))
    for lease in await store.claim(3, None, ALL):
        await store.fail(lease, "boom", None)
    replayed = await store.replay_dead_many(DeadFilter(), 2)
    assert len(replayed.jobs) == 2 and replayed.remaining == 1
    await crash(store)
    again = await opened(path, clock)
    assert (await again.list_dead(10, 0)).total == 1
    assert (await again.stats()).counts["pending"] == 2
    await again.close()


async def checkpoint(store: SqliteStore) -> None:
    """Copy the whole WAL into the file; a checkpoint that meets a busy writer (the
    store's own fsync thread) is tried again, up to a deadline."""
    deadline = asyncio.get_running_loop().time() + 10
    while True:
        busy, _, _ = await store.db.read(
            lambda c: c.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        )
        if not busy or asyncio.get_running_loop().time() > deadline:
            return
        await asyncio.sleep(0.01)


async def test_prune_deletes_rows_and_gives_pages_back(path: str, clock: Clock) -> None:
    store = await opened(path, clock)
    payload = {"blob": "z" * 4000}
    for _ in range(300):
        await store.enqueue(new(payload=payload))
    for lease in await store.claim(300, None, {"a": 300}):
        await store.complete(lease, None)
    await checkpoint(store)
    size = Path(path).stat().st_size
    clock.advance(10)
    assert await store.prune(clock.now(), 1000) == 300
    await checkpoint(store)
    assert Path(path).stat().st_size < size / 2
    await crash(store)
    again = await opened(path, clock)
    assert (await again.stats()).counts["done"] == 0
    await again.close()


def workflow(*steps: tuple[str, list[str]], key: str | None = None) -> NewWorkflow:
    """A workflow of `a` jobs: (key, after) each, parents first."""
    spec = msgspec.json.decode(b'{"type": "a"}', type=JobSpec)
    return NewWorkflow(
        id=new_id(),
        name="wf",
        steps=[NewStep(key=k, after=a, new=NewJob(spec=spec, max_retries=0)) for k, a in steps],
        idempotency_key=key,
        request_hash="h" if key else None,
    )


async def steps_of(store: SqliteStore, wf_id: str) -> dict[str, str]:
    found = await store.get_workflow(wf_id)
    assert found is not None
    return {s.key: s.status for s in found.steps}


async def take_steps(store: SqliteStore) -> dict[str, Lease]:
    return {lease.job.step_key or "": lease for lease in await store.claim(100, None, ALL)}


async def test_a_workflow_goes_on_across_crashes_between_its_steps(path: str, clock: Clock) -> None:
    store = await opened(path, clock)
    shape = workflow(("a", []), ("b", ["a"]), ("bad", ["a"]), ("d", ["b", "bad"]), key="k")
    wf_id = (await store.create_workflow(shape)).workflow.id
    await store.complete((await take_steps(store))["a"], msgspec.Raw(b'{"n": 1}'))
    await crash(store)

    store = await opened(path, clock)  # a's result reached b and bad; d still waits
    assert await steps_of(store, wf_id) == {
        "a": "done",
        "b": "pending",
        "bad": "pending",
        "d": "waiting",
    }
    repeat = await store.create_workflow(shape)
    assert repeat.created is False and repeat.workflow.id == wf_id
    held = await take_steps(store)
    assert msgspec.json.decode(held["b"].job.parents or b"{}") == {"a": {"n": 1}}
    await store.complete(held["b"], msgspec.Raw(b'"b"'))
    outcome = await store.fail(held["bad"], "boom", None)
    assert outcome is not None and outcome.dead_letter is not None
    await crash(store)

    store = await opened(path, clock)  # bad's failure cancelled d, and stays so
    assert (await steps_of(store, wf_id))["d"] == "cancelled"
    assert (await store.get_workflow(wf_id)).status == WorkflowStatus.FAILED  # type: ignore[union-attr]
    fresh = await store.replay_dead(outcome.dead_letter.id, 0)
    await crash(store)

    store = await opened(path, clock)  # the replay took bad's place; d waits on it again
    assert await steps_of(store, wf_id) == {
        "a": "done",
        "b": "done",
        "bad": "pending",
        "d": "waiting",
    }
    held = await take_steps(store)
    assert held["bad"].job.id == fresh.id
    await store.complete(held["bad"], msgspec.Raw(b'"bad"'))
    await crash(store)

    store = await opened(path, clock)
    held = await take_steps(store)
    assert list(held) == ["d"]
    assert msgspec.json.decode(held["d"].job.parents or b"{}") == {"b": "b", "bad": "bad"}
    await store.complete(held["d"], None)
    await crash(store)

    store = await opened(path, clock)
    assert (await store.get_workflow(wf_id)).status == WorkflowStatus.DONE  # type: ignore[union-attr]
    await store.close()


async def test_a_cancelled_workflow_stays_cancelled_after_a_restart(
    path: str, clock: Clock
) -> None:
    store = await opened(path, clock)
    wf_id = (await store.create_workflow(workflow(("a", []), ("b", ["a"])))).workflow.id
    await store.cancel_workflow(wf_id)
    await crash(store)
    store = await opened(path, clock)
    assert await steps_of(store, wf_id) == {"a": "cancelled", "b": "cancelled"}
    assert (await store.get_workflow(wf_id)).status == WorkflowStatus.CANCELLED  # type: ignore[union-attr]
    assert (await store.list_workflows(None, 10, 0)).total == 1
    await store.close()


async def test_a_pruned_workflow_leaves_the_file(path: str, clock: Clock) -> None:
    store = await opened(path, clock)
    wf_id = (await store.create_workflow(workflow(("a", []), ("b", ["a"])))).workflow.id
    await store.complete((await take_steps(store))["a"], None)
    await store.complete((await take_steps(store))["b"], None)
    clock.advance(10)
    assert await store.prune(clock.now(), 100) == 2
    await crash(store)
    again = await opened(path, clock)
    assert await again.get_workflow(wf_id) is None
    rows = await again.db.read(lambda c: c.execute("SELECT count(*) FROM workflows").fetchone())
    assert rows == (0,)
    await again.close()


async def test_an_upgrade_keeps_each_workflows_status_as_its_current_steps_say(
    path: str, clock: Clock
) -> None:
    """A file of schema 9 (no status kept with a workflow) is brought up to date: each
    workflow's kept status, the counts and the listings by status are its steps' own. A
    replayed step counts by its current job, not the attempt that failed."""
    store = await opened(path, clock)
    made = [(await store.create_workflow(workflow(("a", [])))).workflow.id for _ in range(4)]
    done, failed, replayed, cancelled = made
    leases = {lease.job.workflow_id: lease for lease in await store.claim(100, None, ALL)}
    await store.complete(leases[done], None)
    await store.fail(leases[failed], "boom", None)
    outcome = await store.fail(leases[replayed], "boom", None)
    assert outcome is not None and outcome.dead_letter is not None
    await store.replay_dead(outcome.dead_letter.id, 0)
    await store.complete((await take_steps(store))["a"], None)
    await store.cancel_workflow(cancelled)
    running = (await store.create_workflow(workflow(("a", []), ("b", ["a"])))).workflow.id
    await store.close()
    with sqlite3.connect(path) as conn:  # back to schema 9
        conn.isolation_level = None
        for name in ("flow_added", "flow_removed", "flow_moved"):
            conn.execute(f"DROP TRIGGER {name}")
        conn.execute("DROP TABLE workflow_counts")
        conn.execute("DROP INDEX workflows_status")
        conn.execute("ALTER TABLE workflows DROP COLUMN status")
        conn.execute("PRAGMA user_version = 9")
    again = await opened(path, clock)
    want = {done: "done", failed: "failed", replayed: "done", cancelled: "cancelled"}
    want[running] = "running"
    for wf_id, status in want.items():
        found = await again.get_workflow(wf_id)
        assert found is not None and found.status == status
    counts = (await again.workflow_counts()).by_status
    assert counts == {"running": 1, "done": 2, "failed": 1, "cancelled": 1}
    for status in WorkflowStatus:
        listed = [w.id for w in (await again.list_workflows(status, 10, 0)).items]
        assert listed == [w for w in reversed([*made, running]) if want[w] == status]
    await again.close()


def kept_counts(conn: sqlite3.Connection) -> dict[tuple[str, str, int, str], int]:
    return {
        (q, t, p, s): n
        for q, t, p, s, n in conn.execute(
            "SELECT queue, type, priority, status, n FROM job_counts WHERE n != 0"
        )
    }


def counted_rows(conn: sqlite3.Connection) -> dict[tuple[str, str, int, str], int]:
    return {
        (q, t, p, s): n
        for q, t, p, s, n in conn.execute(
            "SELECT queue, type, priority, status, count(*) FROM jobs"
            " GROUP BY queue, type, priority, status"
        )
    }


async def test_the_kept_counts_are_the_rows_counted_after_every_kind_of_change(
    path: str, clock: Clock
) -> None:
    store = await opened(path, clock)
    for priority in (1, 5, 9):
        for kind in ("a", "b"):
            await store.enqueue(new(kind, priority=priority, queue=f"q{priority}"))
    await store.enqueue(new(delay_seconds=3600))
    leases = await store.claim(4, None, ALL, start=2)
    await store.complete(leases[0], None)
    await store.fail(leases[1], "boom", None)
    await store.release(leases[2])
    started = await store.start(leases[3])
    assert started is not None
    (await store.cancel((await store.enqueue(new())).job.id, force=False))
    await store.create_workflow(workflow(("a", []), ("b", ["a"])))
    async with full_disk(store):
        with pytest.raises(StoreUnavailable):  # a failed commit counts nothing
            await store.enqueue(new(payload={"big": "x" * 200_000}))
    clock.advance(60)
    await store.reap_expired()
    assert await store.prune(clock.now(), 1000) >= 2
    counts = await store.db.read(kept_counts)
    assert counts == await store.db.read(counted_rows)
    assert sum(counts.values()) == sum((await store.stats()).counts.values())
    await store.close()


async def test_a_reader_holding_old_frames_costs_one_checkpoint_then_the_wal_starts_over(
    path: str, clock: Clock
) -> None:
    store = await opened(path, clock)
    await store.enqueue(new())
    backup = sqlite3.connect(path)  # a `.backup` in progress: a read that keeps its snapshot
    backup.execute("BEGIN")
    backup.execute("SELECT count(*) FROM jobs").fetchone()
    payload = {"blob": "w" * 2000}
    while store.db.wal_bytes() < 12 << 20:  # past the threshold while the reader holds on
        await store.enqueue_many([new(payload=payload) for _ in range(50)])
    for _ in range(20):
        await store.enqueue_many([new(payload=payload) for _ in range(50)])
    assert store.db.checkpoints == 0
    assert store.db.checkpoints_tried <= 2  # not one per commit while it cannot finish
    backup.rollback()
    backup.close()
    deadline = asyncio.get_running_loop().time() + 10
    while store.db.checkpoints == 0:  # once the retry window passes, the WAL starts over
        assert asyncio.get_running_loop().time() < deadline, "no whole checkpoint"
        await store.enqueue(new())
    await store.enqueue(new())
    assert store.db.wal_bytes() < 1 << 20
    await store.close()


async def test_a_checkpoint_that_failed_for_want_of_room_is_tried_again_by_the_next_commit(
    path: str, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Not a second later, as after a reader kept one short: the room had come back, the
    # backlog a node drains then grew its WAL until the disk was full again, and then
    # neither a commit nor a checkpoint went.
    limit = 256 << 10
    monkeypatch.setattr(database, "WAL_CHECKPOINT_BYTES", limit)
    store = await opened(path, clock)
    await store.db.writable()
    tried, done = store.db.checkpoints_tried, store.db.checkpoints

    def full() -> None:
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(store.db, "_checkpoint_wal", full)
    payload = {"pad": "p" * 2000}
    while store.db.checkpoints_tried == tried:
        await store.enqueue_many([new(payload=payload) for _ in range(20)])
    await store.db.writable()  # the checkpoint has failed
    assert store.db.checkpoints == done and store.db.wal_bytes() >= limit
    monkeypatch.undo()
    await store.enqueue(new())  # the room is back
    await store.db.writable()
    assert store.db.checkpoints == done + 1
    await store.enqueue(new())
    assert store.db.wal_bytes() < limit
    await store.close()


async def test_dead_letters_by_queue_and_type_are_counted_as_kept_and_found_by_index(
    path: str, clock: Clock
) -> None:
    """A page of dead letters filtered by queue, type or both takes its total from the
    counts kept by (queue, type) and its letters from that queue's or type's index: with
    5,000 newer letters of another type in one of its queues, it costs a fraction of one
    walk over them. A file of schema 10
    (no such counts) is brought up to date with its letters counted."""
    filters = [DeadFilter(queue="q1"), DeadFilter(type="b"), DeadFilter(queue="q2", type="b")]
    filters.append(DeadFilter(queue="q1", type="b"))

    async def assert_counted(store: SqliteStore) -> None:
        count = (
            "SELECT count(*) FROM dead_letters"
            " WHERE coalesce(?1, queue) = queue AND coalesce(?2, type) = type"
        )
        for f in filters:
            real = await store.db.read(
                lambda c, f=f: c.execute(count, (f.queue, f.type)).fetchone()[0]
            )
            page = await store.list_dead(10_000, 0, f)
            assert page.total == real == len(page.items), f

    store = await opened(path, clock)
    for kind, queue, n in (("a", "q1", 3), ("b", "q2", 2), ("b", "q1", 1)):
        await store.enqueue_many([new(kind, queue=queue, max_retries=0) for _ in range(n)])
    letters = []
    for lease in await store.claim(10, None, ALL):
        outcome = await store.fail(lease, "boom", None)
        assert outcome is not None and outcome.dead_letter is not None
        letters.append(outcome.dead_letter)
    await store.replay_dead(letters[0].id, 0)
    await store.purge_dead(letters[-1].id)
    await assert_counted(store)
    await store.close()
    copies = (
        "INSERT INTO dead_letters (id, job_id, type, queue, last_error, created_at, letter)"
        " SELECT lower(hex(randomblob(16))), job_id, ?, ?, last_error, created_at, letter"
        " FROM dead_letters, (WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL"
        " SELECT i + 1 FROM n WHERE i < ?) SELECT i FROM n) LIMIT ?"
    )
    with sqlite3.connect(path) as conn:  # letters elsewhere, newer than these
        conn.execute(copies, ("bulk", "q1", 2000, 5000))

    store = await opened(path, clock)
    await assert_counted(store)

    async def walk() -> None:
        await store.db.read(
            lambda c: c.execute("SELECT count(*) FROM dead_letters WHERE created_at > 0").fetchone()
        )

    once = await sqlite_work(store, walk)
    for f in filters:
        assert await sqlite_work(store, lambda f=f: store.list_dead(50, 0, f)) * 10 < once, f
    await store.close()
    with sqlite3.connect(path) as conn:  # back to schema 10, with more letters
        conn.isolation_level = None
        for name in ("dead_grouped", "dead_ungrouped"):
            conn.execute(f"DROP TRIGGER {name}")
        conn.execute("DROP TABLE dead_counts")
        conn.execute("DROP INDEX dead_of_queue")
        conn.execute("DROP INDEX dead_of_type")
        conn.execute("PRAGMA user_version = 10")
        conn.execute(copies.replace("?, ?,", "type, queue,"), (2, 20))
    again = await opened(path, clock)
    await assert_counted(again)
    kept = len(letters) - 2  # one replayed, one purged
    assert (await again.stats()).dead_letters == kept + 5000 + 20
    await again.close()
