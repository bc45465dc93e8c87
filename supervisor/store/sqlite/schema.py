"""The SQLite file's tables, created and migrated by the program itself.

The version is the file's `PRAGMA user_version`; each migration runs once, in order, in
one transaction with the version it brings, so a node started on an older file brings
it up to date and a crash mid-migration leaves the old version whole. A file written by
a newer GoQueue is refused rather than misread.

A job is one row: its fields as JSON (`job`, the `Job` struct as msgspec writes it) and
its audit trail (`events`), beside the columns a restart or a prune selects on. A
result and a workflow step's parents' results have columns of their own (msgspec reads
no `Raw | None` inside a struct). A workflow is one row (`FlowRecord`); the edges
between its steps are rebuilt from its jobs at start. The
working set lives in the node's memory (see `store.py`); the file is what survives.
"""

from __future__ import annotations

import sqlite3

MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (  # 1: jobs, dead letters, keys, paused queues, schedules, the webhook outbox
        """CREATE TABLE jobs (
            id TEXT PRIMARY KEY,
            seq INTEGER NOT NULL,
            status TEXT NOT NULL,
            finished_at TEXT,
            job BLOB NOT NULL,
            result BLOB,
            events BLOB NOT NULL)""",
        "CREATE INDEX jobs_finished ON jobs (finished_at) WHERE finished_at IS NOT NULL",
        """CREATE TABLE dead_letters (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            id TEXT NOT NULL UNIQUE,
            letter BLOB NOT NULL)""",
        """CREATE TABLE job_keys (
            kind TEXT NOT NULL,
            key TEXT NOT NULL,
            job_id TEXT NOT NULL,
            request_hash TEXT NOT NULL,
            expires REAL NOT NULL,
            PRIMARY KEY (kind, key))""",
        "CREATE TABLE paused_queues (queue TEXT PRIMARY KEY)",
        "CREATE TABLE schedules (name TEXT PRIMARY KEY, state BLOB NOT NULL)",
        """CREATE TABLE webhook_deliveries (
            id TEXT PRIMARY KEY,
            job_id TEXT NOT NULL,
            event TEXT NOT NULL,
            url TEXT NOT NULL,
            body BLOB NOT NULL,
            created_at REAL NOT NULL,
            next_attempt_at REAL,
            attempts INTEGER NOT NULL DEFAULT 0,
            history BLOB NOT NULL DEFAULT '[]',
            delivered_at REAL,
            given_up_at REAL,
            lease_owner TEXT,
            lease_token TEXT)""",
        "CREATE INDEX deliveries_due ON webhook_deliveries (next_attempt_at)"
        " WHERE next_attempt_at IS NOT NULL",
        "CREATE INDEX deliveries_of_job ON webhook_deliveries (job_id)",
    ),
    (  # 2: workflows, and a workflow step's parents' results beside its job
        "ALTER TABLE jobs ADD COLUMN parents BLOB",
        "ALTER TABLE dead_letters ADD COLUMN parents BLOB",
        """CREATE TABLE workflows (
            id TEXT PRIMARY KEY,
            seq INTEGER NOT NULL,
            record BLOB NOT NULL)""",
    ),
)
VERSION = len(MIGRATIONS)


class NewerSchema(Exception):
    """The file was written by a newer GoQueue than this one."""


def migrate(conn: sqlite3.Connection) -> list[int]:
    """Apply the migrations the file lacks; the versions applied (none when current)."""
    (current,) = conn.execute("PRAGMA user_version").fetchone()
    if current > VERSION:
        raise NewerSchema(f"schema version {current} is newer than this GoQueue's {VERSION}")
    applied: list[int] = []
    for version in range(current + 1, VERSION + 1):
        conn.execute("BEGIN IMMEDIATE")
        try:
            for statement in MIGRATIONS[version - 1]:
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {version}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        applied.append(version)
    return applied
