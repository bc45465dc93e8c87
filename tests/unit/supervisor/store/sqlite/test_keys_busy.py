"""Each key's claimed and running jobs (`KeysBusy`): read from the leased rows when first
asked, kept as keyed rows are written, and read again once a call or commit failed."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime

import pytest
from goqueue.supervisor.common.enums import Status
from goqueue.supervisor.common.jobs import Job, JobSpec
from goqueue.supervisor.store.sqlite.keyed import KeysBusy

pytestmark = pytest.mark.timeout(10)


def table(*rows: tuple[str, str, str, str | None]) -> sqlite3.Connection:
    """The columns and index the counts are read from: (type, key, status, lease token)."""
    conn = sqlite3.connect(":memory:")
    conn.execute(
        "CREATE TABLE jobs (seq INTEGER PRIMARY KEY, type TEXT, concurrency_key TEXT,"
        " status TEXT, lease_token TEXT)"
    )
    conn.execute("CREATE INDEX jobs_status ON jobs (status, seq)")
    conn.executemany("INSERT INTO jobs VALUES (NULL, ?, ?, ?, ?)", rows)
    return conn


def job(key: str, status: Status, job_type: str = "t") -> Job:
    spec = JobSpec(type=job_type, concurrency_key=key)
    made = Job.from_spec(spec, now=datetime(2026, 1, 1, tzinfo=UTC), max_retries=0)
    made.status = status
    return made


def test_counts_are_read_once_from_the_leased_rows_then_kept_as_rows_are_written() -> None:
    conn = table(
        ("t", "a", "running", "x1"),
        ("t", "a", "claimed", "x2"),
        ("t", "b", "running", "x3"),
        ("u", "a", "running", "x4"),
        ("t", "c", "pending", None),
        ("t", "c", "done", None),
    )
    undone = 0
    busy = KeysBusy(lambda: undone)
    assert busy.of(conn, "t") == {"a": 2, "b": 1}
    assert busy.of(conn, "u") == {"a": 1}
    busy.moved(job("c", Status.CLAIMED), Status.PENDING)  # claimed
    busy.moved(job("a", Status.RUNNING), Status.CLAIMED)  # started: still busy
    busy.moved(job("b", Status.DONE), Status.RUNNING)  # its outcome
    busy.moved(job("d", Status.PENDING), None)  # a new pending job
    assert busy.of(conn, "t") == {"a": 2, "c": 1}  # not read again: kept
    conn.execute("UPDATE jobs SET status = 'done', lease_token = NULL WHERE type = 'u'")
    assert busy.of(conn, "u") == {"a": 1}
    undone += 1  # a call was undone: what it wrote here may not be in the file
    assert busy.of(conn, "u") == {}
    assert busy.of(conn, "t") == {"a": 2, "b": 1}  # as the file holds it


def test_writes_before_the_first_read_are_left_to_it() -> None:
    conn = table(("t", "a", "running", "x1"))
    busy = KeysBusy(lambda: 0)
    busy.moved(job("a", Status.RUNNING), None)  # that row: written before anything asked
    assert busy.of(conn, "t") == {"a": 1}
