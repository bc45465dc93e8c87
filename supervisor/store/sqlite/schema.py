"""The SQLite file's tables, created and migrated by the program itself, and how the
file is opened (`connect`: its pragmas, then the migrations).

The version is the file's `PRAGMA user_version`; each migration runs once, in order, in
one transaction with the version it brings, so a node started on an older file brings
it up to date and a crash mid-migration leaves the old version whole. A file written by
a newer GoQueue is refused rather than misread.

The rows are the store's truth (version 3 on). A job is one row: its fields as JSON
(`job`, the `Job` struct as msgspec writes it), its result and its workflow parents'
results in columns of their own (msgspec reads no `Raw | None` inside a struct), its
audit trail (`events`: the events' JSON objects joined by commas), and copies of the
fields the store selects, orders and fences on, each with the index its query needs
(partial indexes hold live rows only). `job_counts` keeps the jobs by queue, type,
priority and status (the store adds each transaction's changes to it as it commits),
and `tallies` the dead letters (by triggers), so counts never scan. A workflow is one
row (`FlowRecord`, with its status kept beside it and counted in `workflow_counts`) and
its edges are rows of their own.
"""

from __future__ import annotations

import sqlite3
from datetime import datetime

from goqueue.supervisor.common.errors import BootError

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

_TEXT = "CAST(job AS TEXT)"  # the JSON functions refuse a BLOB


def _ts(field: str, doc: str = _TEXT) -> str:
    """A JSON time field of `doc` as unix seconds (NULL when absent), to the microsecond
    (SQLite's own date functions keep milliseconds)."""
    return f"goqueue_unix_time(json_extract({doc}, '$.{field}'))"


def unix_time(text: str | None) -> float | None:
    """An RFC 3339 time as unix seconds."""
    return None if text is None else datetime.fromisoformat(text).timestamp()


# the unfinished statuses, as the unique-key index and the queries it serves spell them
# (SQLite uses a partial index only for a query whose condition matches its own)
LIVE_SQL = "('pending', 'claimed', 'running', 'waiting')"


def _count_trigger(name: str, when: str, rows: str) -> str:
    return f"CREATE TRIGGER {name} {when} BEGIN {rows} END"


ROWS_ARE_THE_TRUTH: tuple[str, ...] = (  # 3: the rows are the truth, with their indexes
    """CREATE TABLE jobs3 (
        seq INTEGER PRIMARY KEY,
        id TEXT NOT NULL UNIQUE,
        type TEXT NOT NULL,
        queue TEXT NOT NULL,
        priority INTEGER NOT NULL,
        status TEXT NOT NULL,
        run_at REAL NOT NULL,
        created_at REAL NOT NULL,
        started_at REAL,
        finished_at REAL,
        parent_id TEXT,
        unique_key TEXT,
        workflow_id TEXT,
        waiting_on INTEGER,
        lease_token TEXT,
        lease_owner TEXT,
        lease_expires REAL,
        reaped_token TEXT,
        job BLOB NOT NULL,
        result BLOB,
        parents BLOB,
        events BLOB NOT NULL,
        n_events INTEGER NOT NULL)""",
    f"""INSERT INTO jobs3 (seq, id, type, queue, priority, status, run_at, created_at,
        started_at, finished_at, parent_id, unique_key, workflow_id, job, result, parents,
        events, n_events)
        SELECT seq, id, json_extract({_TEXT}, '$.type'), json_extract({_TEXT}, '$.queue'),
        json_extract({_TEXT}, '$.priority'), status, {_ts("run_at")}, {_ts("created_at")},
        {_ts("started_at")}, {_ts("finished_at")}, json_extract({_TEXT}, '$.parent_id'),
        json_extract({_TEXT}, '$.unique_key'), json_extract({_TEXT}, '$.workflow_id'),
        job, result, parents, substr(events, 2, length(events) - 2),
        json_array_length(CAST(events AS TEXT))
        FROM jobs""",
    "DROP TABLE jobs",
    "ALTER TABLE jobs3 RENAME TO jobs",
    # a waiting step's parents not done yet (a pruned parent was done)
    f"""UPDATE jobs SET waiting_on = (
        SELECT count(*) FROM json_each(json_extract({_TEXT}, '$.parent_ids')) AS p
        JOIN jobs AS q ON q.id = p.value AND q.status != 'done')
        WHERE status = 'waiting'""",
    "CREATE INDEX jobs_due ON jobs (type, priority DESC, run_at, seq) WHERE status = 'pending'",
    "CREATE INDEX jobs_next_due ON jobs (run_at) WHERE status = 'pending'",
    "CREATE INDEX jobs_queue_due ON jobs (queue, run_at) WHERE status = 'pending'",
    "CREATE INDEX jobs_status ON jobs (status, seq)",
    "CREATE INDEX jobs_finished ON jobs (finished_at) WHERE finished_at IS NOT NULL",
    "CREATE INDEX jobs_leased ON jobs (lease_token) WHERE lease_token IS NOT NULL",
    "CREATE INDEX jobs_children ON jobs (parent_id) WHERE parent_id IS NOT NULL",
    "CREATE INDEX jobs_steps ON jobs (workflow_id) WHERE workflow_id IS NOT NULL",
    f"CREATE UNIQUE INDEX jobs_unique ON jobs (unique_key)"
    f" WHERE unique_key IS NOT NULL AND status IN {LIVE_SQL}",
    """CREATE TABLE job_counts (
        queue TEXT NOT NULL,
        type TEXT NOT NULL,
        priority INTEGER NOT NULL,
        status TEXT NOT NULL,
        n INTEGER NOT NULL,
        PRIMARY KEY (queue, type, priority, status)) WITHOUT ROWID""",
    "INSERT INTO job_counts SELECT queue, type, priority, status, count(*) FROM jobs"
    " GROUP BY queue, type, priority, status",
    """CREATE TABLE dead3 (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        id TEXT NOT NULL UNIQUE,
        job_id TEXT NOT NULL,
        type TEXT NOT NULL,
        queue TEXT NOT NULL,
        last_error TEXT,
        created_at REAL NOT NULL,
        letter BLOB NOT NULL,
        parents BLOB)""",
    f"""INSERT INTO dead3 (seq, id, job_id, type, queue, last_error, created_at, letter,
        parents)
        SELECT seq, id, json_extract(CAST(letter AS TEXT), '$.job_id'),
        json_extract(CAST(letter AS TEXT), '$.job.type'),
        json_extract(CAST(letter AS TEXT), '$.job.queue'),
        json_extract(CAST(letter AS TEXT), '$.job.last_error'),
        {_ts("created_at", "CAST(letter AS TEXT)")}, letter, parents
        FROM dead_letters""",
    "DROP TABLE dead_letters",
    "ALTER TABLE dead3 RENAME TO dead_letters",
    "CREATE INDEX dead_of_job ON dead_letters (job_id)",
    "CREATE TABLE tallies (name TEXT PRIMARY KEY, n INTEGER NOT NULL) WITHOUT ROWID",
    "INSERT INTO tallies SELECT 'dead', count(*) FROM dead_letters",
    _count_trigger(
        "dead_added",
        "AFTER INSERT ON dead_letters",
        "UPDATE tallies SET n = n + 1 WHERE name = 'dead';",
    ),
    _count_trigger(
        "dead_removed",
        "AFTER DELETE ON dead_letters",
        "UPDATE tallies SET n = n - 1 WHERE name = 'dead';",
    ),
    "CREATE INDEX keys_expiry ON job_keys (expires)",
    "ALTER TABLE workflows ADD COLUMN idempotency_key TEXT",
    "UPDATE workflows SET idempotency_key ="
    " json_extract(CAST(record AS TEXT), '$.idempotency_key')",
    "CREATE UNIQUE INDEX workflows_idempotency ON workflows (idempotency_key)"
    " WHERE idempotency_key IS NOT NULL",
    "CREATE TABLE workflow_edges (parent_id TEXT NOT NULL, child_id TEXT NOT NULL)",
    f"""INSERT INTO workflow_edges SELECT p.value, jobs.id
        FROM jobs, json_each(json_extract({_TEXT}, '$.parent_ids')) AS p
        WHERE jobs.workflow_id IS NOT NULL""",
    "CREATE INDEX edges_from ON workflow_edges (parent_id)",
    "CREATE INDEX edges_to ON workflow_edges (child_id)",
    "CREATE TABLE probe (n INTEGER)",  # readiness writes here to see that writes go
)
FLOW_KEYS: tuple[str, ...] = (  # 4: flow control by key (docs/guide/flow-control.md)
    # a job's `concurrency_key` (immutable: written once, with the row); jobs stored
    # before have none
    "ALTER TABLE jobs ADD COLUMN concurrency_key TEXT",
    # the claim walks a keyed type's pending jobs key by key, each key in claim order,
    # and counts each key's claimed and running jobs; GET /jobs?concurrency_key= lists one
    "CREATE INDEX jobs_key_due ON jobs (type, concurrency_key, priority DESC, run_at, seq)"
    " WHERE status = 'pending' AND concurrency_key IS NOT NULL",
    "CREATE INDEX jobs_key_busy ON jobs (type, concurrency_key)"
    " WHERE status IN ('claimed', 'running') AND concurrency_key IS NOT NULL",
    "CREATE INDEX jobs_key ON jobs (concurrency_key, seq) WHERE concurrency_key IS NOT NULL",
    # a debounced job not started yet, found by its type and key to be replaced
    "ALTER TABLE jobs ADD COLUMN debounce_key TEXT",
    "CREATE INDEX jobs_debounce ON jobs (type, debounce_key)"
    " WHERE status = 'pending' AND debounce_key IS NOT NULL",
)
PLAIN_DUE: tuple[str, ...] = (  # 5: a type's due jobs without a key, apart from its keyed
    # ones: a type with a per-key rule walks its jobs without a key on their own, never
    # stepping over its keyed backlog (any other type walks both, merged)
    "DROP INDEX jobs_due",
    "CREATE INDEX jobs_due ON jobs"
    " (type, (concurrency_key IS NOT NULL), priority DESC, run_at, seq)"
    " WHERE status = 'pending'",
)
BUSY_IN_MEMORY: tuple[str, ...] = (  # 6: each key's claimed and running jobs are counted
    # by the store as it writes them (`keyed.KeysBusy`, read from the leased rows at
    # first): an index kept by every claim, start and outcome of a keyed job is not needed
    "DROP INDEX jobs_key_busy",
)
FEWER_INDEXES: tuple[str, ...] = (  # 7: every index a job's row is in is a page each of
    # its commits writes to the WAL (and fsyncs). A lease is found by its row (the id) and
    # the leased rows by their status; the earliest pending `run_at` by queue (few)
    "DROP INDEX jobs_leased",
    "DROP INDEX jobs_next_due",
)
QUEUE_DUE: tuple[str, ...] = (  # 8: a type's due jobs without a key by queue, so a
    # claim walks the queues it takes from and never steps over a paused queue's backlog
    "DROP INDEX jobs_due",
    "CREATE INDEX jobs_due ON jobs"
    " (type, (concurrency_key IS NOT NULL), queue, priority DESC, run_at, seq)"
    " WHERE status = 'pending'",
)
KEY_QUEUES: tuple[str, ...] = (  # 9: a type's pending keys by queue, so a claim that
    # does not take from every queue (one is paused) walks only the keys of those it does
    "CREATE INDEX jobs_key_queue ON jobs (type, queue, concurrency_key)"
    " WHERE status = 'pending' AND concurrency_key IS NOT NULL",
)
_STEPS_WITH = (
    "SELECT 1 FROM json_each(CAST(record AS TEXT), '$.steps') AS step"
    " JOIN jobs ON jobs.id = step.value WHERE jobs.status IN {}"
)
_ADD_FLOW = (
    "INSERT INTO workflow_counts VALUES (NEW.status, 1) ON CONFLICT DO UPDATE SET n = n + 1;"
)
_DROP_FLOW = "UPDATE workflow_counts SET n = n - 1 WHERE status = OLD.status;"
_FAILED_SQL = "('failed', 'cancelled')"
FLOW_STATUS: tuple[str, ...] = (  # 10: a workflow's status kept in its row as its steps
    # move (`Tx.settled`), and counted by triggers as it changes: the metrics' counts and
    # a listing by status read no step, however many workflows the retention keeps. The
    # rule is `workflow_status`'s over the current steps (a step pruned was done).
    "ALTER TABLE workflows ADD COLUMN status TEXT NOT NULL DEFAULT 'running'",
    "UPDATE workflows SET status = CASE"
    " WHEN coalesce(json_extract(CAST(record AS TEXT), '$.cancelled'), 0) THEN 'cancelled'"
    f" WHEN EXISTS ({_STEPS_WITH.format(LIVE_SQL)}) THEN 'running'"
    f" WHEN EXISTS ({_STEPS_WITH.format(_FAILED_SQL)}) THEN 'failed'"
    " ELSE 'done' END",
    "CREATE INDEX workflows_status ON workflows (status, seq)",
    "CREATE TABLE workflow_counts (status TEXT PRIMARY KEY, n INTEGER NOT NULL) WITHOUT ROWID",
    "INSERT INTO workflow_counts SELECT status, count(*) FROM workflows GROUP BY status",
    _count_trigger("flow_added", "AFTER INSERT ON workflows", _ADD_FLOW),
    _count_trigger("flow_removed", "AFTER DELETE ON workflows", _DROP_FLOW),
    _count_trigger(
        "flow_moved",
        "AFTER UPDATE OF status ON workflows WHEN OLD.status IS NOT NEW.status",
        _DROP_FLOW + " " + _ADD_FLOW,
    ),
)
DEAD_GROUPS: tuple[str, ...] = (  # 11: the dead letters counted by queue and type as
    # they come and go, and found by either newest first: a page filtered by them reads
    # the count and its letters only, however many other letters wait (each step may
    # run again on a file that has it: the counts are then taken afresh)
    """CREATE TABLE IF NOT EXISTS dead_counts (
        queue TEXT NOT NULL,
        type TEXT NOT NULL,
        n INTEGER NOT NULL,
        PRIMARY KEY (queue, type)) WITHOUT ROWID""",
    "DELETE FROM dead_counts",
    "INSERT INTO dead_counts SELECT queue, type, count(*) FROM dead_letters GROUP BY queue, type",
    _count_trigger(
        "IF NOT EXISTS dead_grouped",
        "AFTER INSERT ON dead_letters",
        "INSERT INTO dead_counts VALUES (NEW.queue, NEW.type, 1)"
        " ON CONFLICT DO UPDATE SET n = n + 1;",
    ),
    _count_trigger(
        "IF NOT EXISTS dead_ungrouped",
        "AFTER DELETE ON dead_letters",
        "UPDATE dead_counts SET n = n - 1 WHERE queue = OLD.queue AND type = OLD.type;",
    ),
    "CREATE INDEX IF NOT EXISTS dead_of_queue ON dead_letters (queue, seq)",
    "CREATE INDEX IF NOT EXISTS dead_of_type ON dead_letters (type, seq)",
)
MIGRATIONS = (
    *MIGRATIONS,
    ROWS_ARE_THE_TRUTH,
    FLOW_KEYS,
    PLAIN_DUE,
    BUSY_IN_MEMORY,
    FEWER_INDEXES,
    QUEUE_DUE,
    KEY_QUEUES,
    FLOW_STATUS,
    DEAD_GROUPS,
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
    conn.create_function("goqueue_unix_time", 1, unix_time, deterministic=True)
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


# `journal_size_limit`: a WAL starting over is truncated to this. Above the threshold, so
# that the WAL's file keeps the blocks it has: an fsync of a commit written in room the
# file already has takes half the time of one that must grow the file (measured: 45 us
# against 109 us for 32 KB). How far the WAL has grown is read from SQLite's index of
# it (`wal_bytes`), not from the file's size.
WAL_KEEP_BYTES = 64 << 20
CACHE_KIB = 16_384  # the page cache: bounded, whatever the file holds


def connect(path: str) -> tuple[sqlite3.Connection, list[int]]:
    """Open the file with the pragmas the store relies on (WAL, incremental vacuum, a
    bounded page cache; fsyncs are the store's own), then migrate it; BootError naming
    the file when it cannot be."""
    try:
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    except sqlite3.Error as exc:
        raise BootError(f"SQLite file {path}: cannot open it: {exc}") from None
    try:
        # before the first table, or it has no effect: lets prune give pages back
        conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if mode != "wal":
            raise BootError(f"SQLite file {path}: cannot use WAL mode (got {mode})")
        conn.execute("PRAGMA busy_timeout = 5000")  # a checkpointing reader, briefly
        conn.execute("PRAGMA synchronous = NORMAL")  # durability comes from `sync`
        conn.execute("PRAGMA wal_autocheckpoint = 0")  # the flusher checkpoints
        conn.execute(f"PRAGMA journal_size_limit = {WAL_KEEP_BYTES}")
        conn.execute(f"PRAGMA cache_size = -{CACHE_KIB}")
        applied = migrate(conn)
    except sqlite3.DatabaseError as exc:
        conn.close()
        raise BootError(f"SQLite file {path}: {exc}") from None
    except NewerSchema as exc:
        conn.close()
        raise BootError(f"SQLite file {path}: {exc}") from None
    except BaseException:
        conn.close()
        raise
    return conn, applied
