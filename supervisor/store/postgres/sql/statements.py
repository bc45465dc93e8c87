"""Every statement the PostgreSQL store runs: one table, formatted once per schema.

`TEMPLATES` maps each `Sql` name to its text: the statements that change rows, here, and
the reads of `sql/reads.py`. In a template `{s}` stands for the quoted schema and the
other `{...}` names for the fragments of `sql/fragments.py`'s `fragments` (a template that is an
f-string, splicing in a module constant, writes them `{{s}}`); parameters are always
bound (`%(name)s`), never formatted in. `Statements(schema)` formats the table once;
`Statements.list_jobs` picks the listing for a filter among variants built from a fixed
tuple of columns, so no statement is composed from a caller's values.

Every state change writes its audit events in the same statement (a `trail` CTE over the
changed rows, `changed`), so an event commits exactly when the change it describes does,
at no extra round trip; a terminal status writes its webhook's outbox row there too (see
`sql/fragments.py`).

The migrations (tables, indexes, the claim function) are in `sql/migrations.py`.
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import product
from types import MappingProxyType
from typing import Final

from goqueue.supervisor.common.enums import EventKind
from goqueue.supervisor.common.reads import JobFilter
from goqueue.supervisor.store.postgres.sql.fragments import (
    FILTER_COLUMNS,
    JOB_FIELDS,
    LEASED,
    N_JOB_FIELDS,
    WORKFLOW_KEY_PREFIX,
    Sql,
    by_id,
    fragments,
)
from goqueue.supervisor.store.postgres.sql.reads import READS
from goqueue.supervisor.store.postgres.sql.schema import check_schema_name
from goqueue.supervisor.store.postgres.sql.tallies import DEAD_GROUP_TALLY
from goqueue.supervisor.store.postgres.sql.workflows import WORKFLOW_SQL

__all__ = [
    "FILTER_COLUMNS",
    "JOB_FIELDS",
    "LIVE_LEASES",
    "N_JOB_FIELDS",
    "TEMPLATES",
    "WORKFLOW_KEY_PREFIX",
    "Sql",
    "Statements",
]

LIVE_LEASES: Final = 3  # a node is live (its limits count) while its beat is this many leases old

# The columns an enqueue writes, and the values it writes for a job's parameters.
_INSERTED = (
    "id, type, queue, payload, priority, status, attempts, max_retries, run_at,"
    " timeout_seconds, dedupe_key, unique_key, webhook_url, on_success, on_failure,"
    " parent_id, created_at, updated_at, trace_context, concurrency_key, debounce_key"
)
_INSERT_VALUES = """(%(id)s, %(type)s, %(queue)s, %(payload)s, %(priority)s, 'pending', 0,
                %(max_retries)s,
                coalesce(%(run_at)s::timestamptz, now() + %(delay)s::float8 * interval '1 second'),
                %(timeout)s, %(dedupe_key)s, %(unique_key)s, %(webhook_url)s, %(on_success)s,
                %(on_failure)s, %(parent_id)s, now(), now(), %(trace_context)s,
                %(concurrency_key)s, %(debounce_key)s)"""

# The partial unique index of migration 6: a unique key is held while its job is not
# terminal. Written out once, for `ON CONFLICT` to name the index by its predicate.
_UNIQUE_HELD = "unique_key IS NOT NULL AND status NOT IN ('done', 'failed', 'cancelled')"


# The filters of a bulk cancel other than status (each NULL for any).
_CANCEL_WHERE = """(%(queue)s::text IS NULL OR queue = %(queue)s::text)
                    AND (%(type)s::text IS NULL OR type = %(type)s::text)
                    AND (%(before)s::timestamptz IS NULL
                        OR created_at < %(before)s::timestamptz)"""
_CHANGED_JOB = ", ".join(f"c.{name}" for name in JOB_FIELDS)


def _trail(event: EventKind) -> str:
    """A CTE writing one `event` per row of `changed` (which has `id` and `attempts`)."""
    return f"""trail AS (
            INSERT INTO {{s}}.events (job_id, event, at, node, attempt, detail)
            SELECT id, '{event}', now(), %(node)s, attempts, NULL FROM changed)"""


# The last line of a statement whose commit need not wait for the WAL to reach the disk
# (`synchronous_commit` off for its transaction, as a claim's): starts and outcomes.
# A crash of the server may lose the last of them, never one without those before it
# (the WAL loses only a suffix): a lost start leaves its job claimed, a lost outcome its
# job running, and either is reaped and runs again, its chained jobs and events with it.
# A statement that changed no row writes nothing to wait for. The scalar subquery runs
# once, at the first row.
_NO_FLUSH_WAIT = "WHERE (SELECT set_config('synchronous_commit', 'off', true)) = 'off'"


# Success needs no more than the commit's time back: the rest of the job is the lease's
# (its row cannot change while the lease holds, except through the fence).
_COMPLETE = f"""
            WITH changed AS (
                UPDATE {{s}}.jobs SET status = 'done', result = %(result)s,
                    finished_at = now(), updated_at = now(), {{clear_lease}}
                WHERE {{fenced}}
                RETURNING id, attempts, finished_at, {{hooked}}),
            {{outbox}},
            {_trail(EventKind.SUCCEEDED)}
            SELECT finished_at FROM changed {_NO_FLUSH_WAIT}"""
# The ids become a uuid[] once (an initplan): a cast of the text[] parameter in the
# condition would run again for every row a generic plan happens to scan.
_COMPLETE_MANY = f"""
            WITH changed AS (
                UPDATE {{s}}.jobs j SET status = 'done', result = c.result::json,
                    finished_at = now(), updated_at = now(), {{clear_lease}}
                FROM unnest(%(ids)b::uuid[], %(tokens)b::uuid[], %(results)b::text[])
                    AS c(id, token, result)
                WHERE j.id = ANY (ARRAY(SELECT unnest(%(ids)b::uuid[])))
                  AND j.id = c.id AND j.lease_token = c.token AND {by_id("j.status", "running")}
                RETURNING j.id, c.token, j.attempts, j.finished_at, {{hooked_j}}),
            {{outbox}},
            {_trail(EventKind.SUCCEEDED)}
            SELECT id, token, finished_at FROM changed {_NO_FLUSH_WAIT}"""


def _unhooked(template: str) -> str:
    """A complete's `template` for jobs without a webhook: no outbox CTE, whose body
    (one large expression) is set up on every execution, hooked rows or none: about an
    eighth of a group's CPU. A job's `webhook_url` never changes, so its lease tells."""
    text = template
    for part in ("{outbox},\n            ", ", {hooked_j}", ", {hooked}"):
        text = text.replace(part, "")
    assert "outbox" not in text and "hooked" not in text, template
    return text


# An idempotency key is claimed when it is free, or held past its expiry: the rows
# claimed answer their job ids.
_TAKE_KEY = """
            ON CONFLICT (key) DO UPDATE SET request_hash = EXCLUDED.request_hash,
                job_id = EXCLUDED.job_id, expires_at = EXCLUDED.expires_at
            WHERE idempotency.expires_at <= now()
            RETURNING job_id"""
_CLAIM_IDEMPOTENCY = (
    """
            INSERT INTO {s}.idempotency (key, request_hash, job_id, expires_at)
            VALUES (%(key)s, %(hash)s, %(id)s, now() + %(ttl)s::float8 * interval '1 second')"""
    + _TAKE_KEY
)


def _add_started(*, keyed: bool) -> str:
    """`Sql.ADD_JOB_STARTED`, or with `keyed` `Sql.ADD_JOB_KEYED`: the job's idempotency
    key claimed first (as `Sql.CLAIM_IDEMPOTENCY`), the job stored only if it was, and
    started only if `%(start)s`."""
    held = f"held AS ({_CLAIM_IDEMPOTENCY}),\n            " if keyed else ""
    after_due = "\n                FROM held" if keyed else ""
    start = "%(start)s::bool AND " if keyed else ""
    return f"""
            WITH {held}due AS (
                SELECT coalesce(%(run_at)s::timestamptz,
                    now() + %(delay)s::float8 * interval '1 second') AS run_at{after_due}),
            go AS MATERIALIZED (  -- inlined, each use of `run` would run its checks again
                SELECT due.run_at, {start}due.run_at <= now()
                    AND NOT EXISTS (SELECT 1 FROM {{s}}.paused_queues WHERE queue = %(queue)s)
                    AND NOT EXISTS (
                        SELECT 1 FROM {{s}}.nodes, jsonb_each_text(limits) l
                        WHERE {{live_nodes}} AND l.key = %(type)s AND l.value IS NOT NULL)
                    AND NOT EXISTS (
                        SELECT 1
                        FROM unnest(%(types)s::text::text[], %(floor_at)s::text::timestamptz[],
                            %(floor_seq)s::text::bigint[]) AS t(type, floor_at, floor_seq)
                        CROSS JOIN LATERAL (
                            SELECT 1 FROM {{s}}.jobs j
                            WHERE j.status = 'pending' AND j.type = t.type
                              AND (j.priority, j.run_at, j.seq) >= (%(priority)s::int2,
                                  coalesce(t.floor_at, '-infinity'), coalesce(t.floor_seq, 0))
                              AND j.run_at <= now()
                              AND (%(queues)s::text IS NULL
                                  OR j.queue = ANY (%(queues)s::text::text[]))
                              AND NOT EXISTS (
                                  SELECT 1 FROM {{s}}.paused_queues p WHERE p.queue = j.queue)
                            ORDER BY j.priority, j.run_at, j.seq LIMIT 1) ahead)  -- `jobs_claim`
                    AS run
                FROM due),
            changed AS (
                INSERT INTO {{s}}.jobs ({_INSERTED},
                    started_at, lease_owner, lease_token, lease_expires_at)
                SELECT %(id)s, %(type)s, %(queue)s, %(payload)s, %(priority)s,
                    CASE WHEN go.run THEN 'running' ELSE 'pending' END,
                    CASE WHEN go.run THEN 1 ELSE 0 END, %(max_retries)s, go.run_at,
                    %(timeout)s, %(dedupe_key)s, %(unique_key)s, %(webhook_url)s,
                    %(on_success)s, %(on_failure)s, %(parent_id)s, now(), now(),
                    %(trace_context)s, %(concurrency_key)s, %(debounce_key)s,
                    CASE WHEN go.run THEN now() END,
                    CASE WHEN go.run THEN %(node)s END,
                    CASE WHEN go.run THEN %(token)s::uuid END,
                    CASE WHEN go.run THEN now() + %(lease)s::float8 * interval '1 second' END
                FROM go
                RETURNING id, status, run_at, created_at, seq, started_at, lease_expires_at),
            trail AS (
                INSERT INTO {{s}}.events (job_id, event, at, node, attempt, detail)
                SELECT changed.id, e.event, now(), %(node)s, e.attempt, NULL
                FROM changed CROSS JOIN unnest(ARRAY['{EventKind.ENQUEUED}', '{EventKind.STARTED}'],
                    ARRAY[0, 1]) WITH ORDINALITY AS e(event, attempt, n)
                WHERE e.n = 1 OR changed.status = 'running'
                ORDER BY e.n)
            SELECT run_at, created_at, seq, started_at, lease_expires_at FROM changed"""


def _add_jobs(*, keyed: bool) -> str:
    """`Sql.ADD_JOBS`, or with `keyed` `Sql.ADD_JOBS_KEYED`: first the idempotency keys
    of the jobs that have one (`%(key)s`, `%(hash)s`; NULL for the others, and no key
    twice) are claimed, as `Sql.CLAIM_IDEMPOTENCY` claims one; a job whose key was held
    already is not stored (it is not among the rows answered)."""
    held = stored = key_array = key_column = ""
    if keyed:
        held = f"""held AS (
            INSERT INTO {{s}}.idempotency (key, request_hash, job_id, expires_at)
            SELECT k.key, k.hash, k.id, now() + %(ttl)s::float8 * interval '1 second'
            FROM unnest(%(key)b::text[], %(hash)b::text[], %(id)b::uuid[]) AS k(key, hash, id)
            WHERE k.key IS NOT NULL{_TAKE_KEY}),
            """
        key_array, key_column = ", %(key)b::text[]", ", key"
        stored = "\n                WHERE t.key IS NULL OR t.id IN (SELECT job_id FROM held)"
    return f"""
            WITH {held}changed AS (
                INSERT INTO {{s}}.jobs ({_INSERTED})
                SELECT t.id, t.type, t.queue, t.payload::json, t.priority, 'pending', 0,
                    t.max_retries, coalesce(t.run_at, now() + t.delay * interval '1 second'),
                    t.timeout, t.dedupe_key, t.unique_key, t.webhook_url, t.on_success::json,
                    t.on_failure::json, t.parent_id, now(), now(), t.trace_context::jsonb,
                    t.concurrency_key, t.debounce_key
                FROM unnest(%(id)b::uuid[], %(type)b::text[], %(queue)b::text[],
                    %(payload)b::text[], %(priority)b::int2[], %(max_retries)b::int4[],
                    %(run_at)b::timestamptz[], %(delay)b::float8[], %(timeout)b::float8[],
                    %(dedupe_key)b::text[], %(unique_key)b::text[], %(webhook_url)b::text[],
                    %(on_success)b::text[], %(on_failure)b::text[], %(parent_id)b::uuid[],
                    %(trace_context)b::text[], %(concurrency_key)b::text[],
                    %(debounce_key)b::text[]{key_array})
                    AS t(id, type, queue, payload, priority, max_retries, run_at, delay,
                         timeout, dedupe_key, unique_key, webhook_url, on_success, on_failure,
                         parent_id, trace_context, concurrency_key,
                         debounce_key{key_column}){stored}
                RETURNING id, attempts, run_at, created_at, seq),
            {_trail(EventKind.ENQUEUED)}
            SELECT id, run_at, created_at, seq FROM changed"""


def _purge_dead_many(matching: str) -> str:
    """Delete the oldest matching letters; how many went, and how many are left
    (`matching`, counted in the statement's snapshot, less those)."""
    return f"""
            WITH gone AS (
                DELETE FROM {{s}}.dead_letters WHERE id IN (
                    SELECT id FROM {{s}}.dead_letters {{dead_where}}
                    ORDER BY created_at, seq LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
                RETURNING id)
            SELECT (SELECT count(*) FROM gone), {matching} - (SELECT count(*) FROM gone)"""


# The statements that change rows; the reads are in `sql/reads.py`.
_WRITES: Final[Mapping[Sql, str]] = MappingProxyType(
    {
        # Per connection: UTC times, bounded statements and idle transactions, and no JIT
        # (compiling costs more than these short statements ever take).
        Sql.SESSION: """
            SELECT set_config('TimeZone', 'UTC', false),
                set_config('statement_timeout', %(statement_ms)s, false),
                set_config('idle_in_transaction_session_timeout', %(idle_ms)s, false),
                set_config('jit', 'off', false)""",
        Sql.PING: "SELECT 1",
        Sql.LISTEN: "LISTEN {channel}",
        Sql.NOTIFY: "SELECT pg_notify(%(channel)s, %(payload)s)",
        # The node's row, kept alive; answers how many other nodes are live (none: this
        # node sends no new-work NOTIFY, see `notify.Notifier`).
        Sql.REGISTER: """
            WITH beat AS (
                INSERT INTO {s}.nodes (node_id, limits, heartbeat_at, report, key_limits)
                VALUES (%(node)s, %(limits)s, now(), %(report)s, %(key_limits)s)
                ON CONFLICT (node_id) DO UPDATE SET limits = EXCLUDED.limits,
                    heartbeat_at = now(), report = EXCLUDED.report,
                    key_limits = EXCLUDED.key_limits)
            SELECT count(*) FROM {s}.nodes WHERE node_id <> %(node)s AND {live_nodes}""",
        Sql.FORGET_NODE: "DELETE FROM {s}.nodes WHERE node_id = %(node)s",
        Sql.KNOWN_TYPES: """
            SELECT DISTINCT jsonb_object_keys(limits) FROM {s}.nodes WHERE {live_nodes}""",
        Sql.EXPIRE_KEYS: """
            WITH d AS (DELETE FROM {s}.dedupe WHERE expires_at < now()),
                 i AS (DELETE FROM {s}.idempotency WHERE expires_at < now())
            DELETE FROM {s}.nodes WHERE heartbeat_at < now() - interval '1 day'""",
        Sql.PAUSE: """
            INSERT INTO {s}.paused_queues (queue) VALUES (%(queue)s) ON CONFLICT DO NOTHING""",
        Sql.RESUME: "DELETE FROM {s}.paused_queues WHERE queue = %(queue)s",
        # One pending job, answered whole, with its events (enqueued; replayed...); no row
        # when a live job holds its unique key (a concurrent enqueue of the key waits for
        # the other's transaction, then finds it held or free).
        Sql.INSERT_JOB: f"""
            WITH changed AS (
                INSERT INTO {{s}}.jobs ({_INSERTED})
                VALUES {_INSERT_VALUES}
                ON CONFLICT (unique_key) WHERE {_UNIQUE_HELD} DO NOTHING
                RETURNING {{job}}),
            {{trail}}
            SELECT {{job}} FROM changed""",
        # The enqueue hot path: the caller knows the job already, so the statement answers
        # only what the database decides (run_at, created_at, seq), not the payload again.
        Sql.ADD_JOB: f"""
            WITH changed AS (
                INSERT INTO {{s}}.jobs ({_INSERTED})
                VALUES {_INSERT_VALUES}
                RETURNING id, attempts, run_at, created_at, seq),
            {_trail(EventKind.ENQUEUED)}
            SELECT run_at, created_at, seq FROM changed""",
        # One plain job for which a worker of this node waits: stored running, its first
        # attempt started and leased to the node, with its `enqueued` and `started`
        # events; unless it is not due yet, its queue is paused, a live node declares a
        # limit on its type, or a pending job the waiting worker could run instead (of
        # `types`, in `queues`, at least as urgent) is due (then it is stored pending, as
        # ADD_JOB stores it: a claim takes the jobs in their order). The last columns tell.
        # That look is one probe of `jobs_claim` per type, from this node's claim floor
        # (`floors.py`) of the job's priority, so it steps over no job of that priority
        # the node drained already (the floors of the higher ones do not apply).
        Sql.ADD_JOB_STARTED: _add_started(keyed=False),
        # The same for a job whose only key is an idempotency key (the common one):
        # stored with its key claimed in one statement, no transaction around it; no row
        # when the key is held already (a repeat, or a mismatch: the caller then takes
        # the keyed path of `enqueue_steps.py`, which tells which).
        Sql.ADD_JOB_KEYED: _add_started(keyed=True),
        # Several plain jobs in one statement (group commit, batches): one round trip, one
        # plan, rows inserted (and seq assigned) in array order. Parameters go binary.
        Sql.ADD_JOBS: _add_jobs(keyed=False),
        # The same with the idempotency keys of the jobs whose only key is one.
        Sql.ADD_JOBS_KEYED: _add_jobs(keyed=True),
        Sql.CLAIM_DEDUPE: """
            INSERT INTO {s}.dedupe (key, job_id, expires_at)
            VALUES (%(key)s, %(id)s, now() + %(window)s::float8 * interval '1 second')
            ON CONFLICT (key) DO UPDATE SET job_id = EXCLUDED.job_id,
                expires_at = EXCLUDED.expires_at
            WHERE dedupe.expires_at <= now()
            RETURNING job_id""",
        Sql.DEDUPE_HOLDER: "SELECT job_id FROM {s}.dedupe WHERE key = %(key)s",
        Sql.UNIQUE_HOLDER: f"""
            SELECT id FROM {{s}}.jobs WHERE unique_key = %(key)s AND {_UNIQUE_HELD}""",
        # The keys at their limit (`%(types)s`, `%(limits)s`: each type's key_concurrency),
        # with their due pending jobs, on the keys' own partial indexes.
        Sql.KEY_HOLDS: """
            SELECT b.type, b.key, b.running, (
                SELECT count(*) FROM {s}.jobs w
                WHERE w.status = 'pending' AND w.concurrency_key IS NOT NULL
                  AND w.type = b.type AND w.concurrency_key = b.key AND w.run_at <= now())
            FROM (SELECT r.type, r.concurrency_key AS key, count(*) AS running
                  FROM {s}.jobs r
                  WHERE r.status IN ('claimed', 'running') AND r.concurrency_key IS NOT NULL
                    AND r.type = ANY (%(types)s::text[])
                  GROUP BY 1, 2) b
            JOIN unnest(%(types)s::text[], %(limits)s::int[]) AS l(type, lim) ON l.type = b.type
            WHERE b.running >= l.lim
            LIMIT %(most)s""",
        # Debounce: one enqueue of a (type, debounce key) at a time, across nodes (the
        # lock is the transaction's); the job of that key not started yet takes the new
        # payload and is put off, no later than debounce_max_seconds after its creation.
        Sql.DEBOUNCE_LOCK: "SELECT pg_advisory_xact_lock(hashtextextended(%(lock)s, 0))",
        Sql.DEBOUNCE: f"""
            WITH target AS (
                SELECT id FROM {{s}}.jobs
                WHERE status = 'pending' AND debounce_key IS NOT NULL AND attempts = 0
                  AND type = %(type)s AND debounce_key = %(key)s
                ORDER BY seq LIMIT 1 FOR UPDATE),
            changed AS (
                UPDATE {{s}}.jobs j SET payload = %(payload)s, updated_at = now(),
                    run_at = least(now() + %(seconds)s::float8 * interval '1 second',
                        coalesce(j.created_at + %(max)s::float8 * interval '1 second',
                                 'infinity'::timestamptz))
                FROM target WHERE j.id = target.id
                RETURNING j.*),
            {_trail(EventKind.DEBOUNCED)}
            SELECT {{job}} FROM changed""",
        Sql.IDEMPOTENCY_MOVE: """
            UPDATE {s}.idempotency SET job_id = %(id)s WHERE key = %(key)s
            RETURNING job_id""",
        Sql.CLAIM_IDEMPOTENCY: _CLAIM_IDEMPOTENCY,
        Sql.IDEMPOTENCY_HOLDER: """
            SELECT request_hash, job_id FROM {s}.idempotency WHERE key = %(key)s""",
        Sql.TAKE_DEAD: """
            DELETE FROM {s}.dead_letters WHERE id = %(id)s
            RETURNING id, job_id, job, errors, created_at""",
        # The claim is the function of migration 15 (its last row has no job: the types
        # under a global limit, the database's now() and, after a short claim, the
        # earliest future run_at); the same statement writes a `started` event per lease
        # it starts (the others are `claimed`).
        Sql.CLAIM: f"""
            WITH c AS (
                SELECT * FROM {{s}}.claim_floored(%(types)s::text::text[],
                    %(caps)s::text::int[], %(queues)s::text::text[], %(limit)s::int,
                    %(node)s::text, %(lease)s::float8, %(live)s::float8, %(lock_ns)s::text,
                    %(start)s::int, %(floor_at)s::text::timestamptz[],
                    %(floor_seq)s::text::bigint[], %(start_types)s::text::text[])),
            changed AS (
                SELECT (c.o_job).id, (c.o_job).attempts FROM c
                WHERE (c.o_job).id IS NOT NULL AND (c.o_job).status = 'running'),
            {_trail(EventKind.STARTED)}
            SELECT {{claimed_job}}, (c.o_job).lease_token, (c.o_job).lease_owner,
                (c.o_job).lease_expires_at, c.o_next_due, c.o_limited, c.o_now
            FROM c""",
        Sql.NEXT_DUE_ANY: """
            SELECT min(run_at) FROM {s}.jobs WHERE status = 'pending' AND run_at > now()""",
        # Claimed jobs start when a worker takes them, fenced by their token: the attempt
        # is charged, started_at set and the lease extended before the job goes to the
        # worker.
        Sql.START_MANY: f"""
            WITH changed AS (
                UPDATE {{s}}.jobs j SET status = 'running', attempts = j.attempts + 1,
                    started_at = now(), updated_at = now(),
                    lease_expires_at = now() + %(lease)s::float8 * interval '1 second'
                FROM unnest(%(ids)s::uuid[], %(tokens)s::uuid[]) AS c(id, token)
                WHERE j.id = ANY (ARRAY(SELECT unnest(%(ids)s::uuid[])))
                  AND j.id = c.id AND j.lease_token = c.token AND {by_id("j.status", "claimed")}
                RETURNING j.id, j.lease_token, j.attempts, j.started_at),
            {_trail(EventKind.STARTED)}
            SELECT id, lease_token, attempts, started_at FROM changed {_NO_FLUSH_WAIT}""",
        # A heartbeat never waits for a row lock: rows an outcome, a start or another
        # node's cancel is writing are left alone (that write ends or extends the lease),
        # so it cannot deadlock with a group of such writes locking rows in another order.
        # Held: the leases the statement's snapshot shows, locked or not.
        Sql.HEARTBEAT: f"""
            WITH mine AS (
                SELECT j.id FROM {{s}}.jobs j
                JOIN unnest(%(ids)s::uuid[], %(tokens)s::uuid[]) AS l(id, token)
                    ON j.id = l.id AND j.lease_token = l.token
                WHERE j.id = ANY (%(ids)s::uuid[]) AND {by_id("j.status", *LEASED)}
                FOR UPDATE OF j SKIP LOCKED),
            extended AS (
                UPDATE {{s}}.jobs j
                SET lease_expires_at = now() + %(lease)s::float8 * interval '1 second'
                FROM mine WHERE j.id = mine.id)
            SELECT j.lease_token FROM {{s}}.jobs j
            JOIN unnest(%(ids)s::uuid[], %(tokens)s::uuid[]) AS l(id, token)
                ON j.id = l.id AND j.lease_token = l.token
            WHERE j.id = ANY (%(ids)s::uuid[]) AND {by_id("j.status", *LEASED)}""",
        # Nothing is reaped in the first lease term after the database (re)started: no
        # holder could extend its leases while it was down, and live ones do so now.
        Sql.EXPIRED: """
            SELECT id, lease_token, lease_owner, attempts, max_retries, status FROM {s}.jobs
            WHERE status IN ('running', 'claimed') AND lease_expires_at < now()
                AND pg_postmaster_start_time() < now() - make_interval(secs => %(term)s)
            ORDER BY lease_expires_at LIMIT %(limit)s
            FOR UPDATE SKIP LOCKED""",
        Sql.COMPLETE: _COMPLETE,
        Sql.COMPLETE_UNHOOKED: _unhooked(_COMPLETE),
        Sql.COMPLETE_MANY: _COMPLETE_MANY,
        Sql.COMPLETE_MANY_UNHOOKED: _unhooked(_COMPLETE_MANY),
        # Pending again at %(retry_at)s (now when NULL), with the events given.
        Sql.RETRY: """
            WITH changed AS (
                UPDATE {s}.jobs SET status = 'pending',
                    run_at = coalesce(%(retry_at)s::timestamptz, now()), {append_error},
                    updated_at = now(), {clear_lease}
                WHERE {fenced}
                RETURNING {job}),
            {failure_trail}
            SELECT {job} FROM changed""",
        Sql.BURY: """
            WITH changed AS (
                UPDATE {s}.jobs SET status = 'failed', finished_at = now(), {append_error},
                    updated_at = now(), {clear_lease}
                WHERE {fenced}
                RETURNING {job}, {hooked}),
            {outbox},
            {failure_trail}
            SELECT {job} FROM changed""",
        Sql.INSERT_DEAD: """
            INSERT INTO {s}.dead_letters (id, job_id, job, errors, created_at)
            VALUES (%(id)s, %(job_id)s, %(job)s, %(errors)s, %(created_at)s)""",
        # A running job's attempt is not counted; a claimed one's never was.
        Sql.RELEASE: f"""
            WITH changed AS (
                UPDATE {{s}}.jobs SET status = 'pending',
                    attempts = attempts - CASE WHEN status = 'running' THEN 1 ELSE 0 END,
                    updated_at = now(), {{clear_lease}}
                WHERE {{held}}
                RETURNING {{job}}),
            {_trail(EventKind.RELEASED)}
            SELECT {{job}} FROM changed""",
        Sql.LOCK_JOB: "SELECT status, lease_token FROM {s}.jobs WHERE id = %(id)s FOR UPDATE",
        # A fenced outcome that arrived late (see `Outcomes.salvage`): the job, locked, if
        # the outcome's attempt is the last one started and its lease was reaped; then its
        # reaping's dead letter, taken away; then the attempt reopened under its own token
        # so the outcome's own statement writes it (the reaping's error is dropped).
        Sql.SALVAGE_LOCK: f"""
            SELECT j.status, j.on_failure IS NULL FROM {{s}}.jobs j
            WHERE j.id = %(id)s AND j.attempts = %(attempt)s
              AND j.status IN ('pending', 'claimed', 'failed')
              AND EXISTS (SELECT 1 FROM {{s}}.events e WHERE e.job_id = j.id
                  AND e.event = '{EventKind.LEASE_EXPIRED}' AND e.attempt = %(attempt)s)
              AND (j.status <> 'failed' OR j.unique_key IS NULL OR NOT EXISTS (
                  SELECT 1 FROM {{s}}.jobs o WHERE o.unique_key = j.unique_key AND o.id <> j.id
                      AND o.status NOT IN ('done', 'failed', 'cancelled')))
            FOR UPDATE OF j""",
        Sql.SALVAGE_DEAD: "DELETE FROM {s}.dead_letters WHERE job_id = %(id)s RETURNING id",
        Sql.REOPEN: """
            WITH changed AS (
                UPDATE {s}.jobs SET status = 'running', finished_at = NULL,
                    updated_at = now(), lease_token = %(token)s, lease_owner = %(node)s,
                    lease_expires_at = now(),
                    errors = CASE WHEN (errors -> -1 ->> 'attempt')::int = attempts
                        THEN errors - -1 ELSE errors END,
                    last_error = CASE WHEN (errors -> -1 ->> 'attempt')::int = attempts
                        THEN errors -> -2 ->> 'error' ELSE last_error END
                WHERE id = %(id)s
                RETURNING id, attempts),
            {trail}
            SELECT id FROM changed""",
        Sql.CANCEL: f"""
            WITH changed AS (
                UPDATE {{s}}.jobs SET status = 'cancelled', finished_at = now(),
                    updated_at = now(), {{clear_lease}}
                WHERE id = %(id)s
                RETURNING {{job}}, {{hooked}}),
            {{outbox}},
            {_trail(EventKind.CANCELLED)}
            SELECT {{job}} FROM changed""",
        # A bulk cancel: the oldest `limit` matching jobs of `statuses`, each with its
        # `cancelled` event (detail %(detail)s) and webhook; a row another transaction holds
        # is skipped (counted as remaining). One row always comes back: how many match
        # (before this statement), how many running jobs pass the other filters, then per
        # job cancelled (none: nulls) the token of the lease it had, its status, the job.
        Sql.CANCEL_MANY: f"""
            WITH picked AS (
                SELECT id AS p_id, lease_token AS p_token, status AS p_status FROM {{s}}.jobs
                WHERE status = ANY(%(statuses)s::text[]) AND {_CANCEL_WHERE}
                ORDER BY created_at, seq LIMIT %(limit)s FOR UPDATE SKIP LOCKED),
            changed AS (
                UPDATE {{s}}.jobs j SET status = 'cancelled', finished_at = now(),
                    updated_at = now(), {{clear_lease}}
                FROM picked WHERE j.id = picked.p_id
                RETURNING picked.p_token, picked.p_status, {{job}}, {{hooked_j}}),
            {{outbox}},
            trail AS (
                INSERT INTO {{s}}.events (job_id, event, at, node, attempt, detail)
                SELECT id, '{EventKind.CANCELLED}', now(), %(node)s, attempts, %(detail)s
                FROM changed),
            counts AS (
                SELECT count(*) FILTER (WHERE status = ANY(%(statuses)s::text[])) AS matching,
                    count(*) FILTER (WHERE status = 'running') AS running
                FROM {{s}}.jobs WHERE status IN ('pending', 'claimed', 'running')
                    AND {_CANCEL_WHERE})
            SELECT counts.matching, counts.running, c.p_token, c.p_status, {_CHANGED_JOB}
            FROM counts LEFT JOIN changed c ON true""",
        Sql.PURGE_DEAD: "DELETE FROM {s}.dead_letters WHERE id = %(id)s",
        # Bulk actions take the oldest matching letters first; a letter another node is
        # taking is skipped, not waited for (it counts as remaining).
        Sql.TAKE_DEAD_MANY: """
            DELETE FROM {s}.dead_letters WHERE id IN (
                SELECT id FROM {s}.dead_letters {dead_where}
                ORDER BY created_at, seq LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
            RETURNING id, job_id, job, errors, created_at, seq""",
        Sql.PURGE_DEAD_MANY: _purge_dead_many(
            "(SELECT count(*) FROM {s}.dead_letters {dead_where})"
        ),
        # With no filter, or by queue and type alone: the remaining from the tallies, as
        # they were before this statement's own delete (its trigger runs after it).
        Sql.PURGE_DEAD_MANY_TALLIED: _purge_dead_many(DEAD_GROUP_TALLY),
        Sql.PRUNE: """
            WITH gone AS (
                DELETE FROM {s}.jobs WHERE id IN (
                    SELECT id FROM {s}.jobs
                    WHERE status IN ('done', 'failed', 'cancelled')
                      AND finished_at < %(before)s
                    ORDER BY finished_at LIMIT %(limit)s)
                RETURNING id, workflow_id),
            trail AS (DELETE FROM {s}.events WHERE job_id IN (SELECT id FROM gone)),
            -- a step's edges go with it (its parents are done or gone: none needs them),
            -- and a workflow (with its Idempotency-Key) once none of its steps is kept
            edges AS (DELETE FROM {s}.workflow_edges WHERE child IN (SELECT id FROM gone)),
            flows AS (DELETE FROM {s}.workflows w
                WHERE w.id IN (SELECT workflow_id FROM gone WHERE workflow_id IS NOT NULL)
                  AND NOT EXISTS (SELECT 1 FROM {s}.jobs j WHERE j.workflow_id = w.id
                                  AND j.id NOT IN (SELECT id FROM gone))
                RETURNING w.id, w.status),
            -- each counted by its kept status (`sql/flow_counts.py`)
            flow_counts AS (INSERT INTO {s}.workflow_count_changes
                SELECT status, -count(*) FROM flows WHERE status IS NOT NULL GROUP BY status),
            flow_keys AS (DELETE FROM {s}.idempotency
                WHERE {workflow_key} AND job_id IN (SELECT id FROM flows)),
            -- a paced key's TAT a whole hour past (the longest period): a key never seen
            -- starts the same burst
            paces AS (DELETE FROM {s}.key_pace WHERE ctid IN (
                SELECT ctid FROM {s}.key_pace
                WHERE tat < extract(epoch FROM now()) - 3600 LIMIT %(limit)s)),
            -- finished deliveries as old (created with their job's terminal status)
            hooks AS (DELETE FROM {s}.webhook_deliveries WHERE id IN (
                SELECT id FROM {s}.webhook_deliveries
                WHERE next_attempt_at IS NULL AND created_at < %(before)s
                ORDER BY created_at LIMIT %(limit)s))
            SELECT count(*) FROM gone""",
        # Due deliveries, leased by pushing their next attempt a lease ahead (if this node
        # dies, that is when another takes them) under a fresh token.
        Sql.OUTBOX_CLAIM: """
            WITH due AS (
                SELECT id FROM {s}.webhook_deliveries WHERE next_attempt_at <= now()
                ORDER BY next_attempt_at LIMIT %(limit)s
                FOR UPDATE SKIP LOCKED)
            UPDATE {s}.webhook_deliveries d
            SET next_attempt_at = now() + %(lease)s::float8 * interval '1 second',
                lease_owner = %(node)s, lease_token = gen_random_uuid()
            FROM due WHERE d.id = due.id
            RETURNING d.id, d.job_id, d.event, d.url, d.body, d.attempts, d.lease_token""",
        # One attempt, fenced by the lease token: delivered, given up (`final`, or the next
        # attempt would come past `max_age` after the terminal status), or due again after
        # `delay` seconds. Answers whether it was given up (no row: the lease was lost).
        Sql.OUTBOX_RECORD: """
            WITH r AS (
                SELECT id, %(delivered)s::bool AS ok,
                    NOT %(delivered)s::bool AND (%(final)s::bool
                        OR now() + %(delay)s::float8 * interval '1 second'
                            > created_at + %(max_age)s::float8 * interval '1 second') AS last
                FROM {s}.webhook_deliveries
                WHERE id = %(id)s AND lease_token = %(token)s)
            UPDATE {s}.webhook_deliveries d
            SET attempts = d.attempts + 1,
                history = d.history || jsonb_build_array(jsonb_build_object(
                    'at', now(), 'status_code', %(status_code)s::int,
                    'error', %(error)s::text, 'node', %(node)s::text)),
                delivered_at = CASE WHEN r.ok THEN now() END,
                given_up_at = CASE WHEN r.last THEN now() END,
                next_attempt_at = CASE WHEN r.ok OR r.last THEN NULL
                    ELSE now() + %(delay)s::float8 * interval '1 second' END,
                lease_owner = NULL, lease_token = NULL
            FROM r WHERE d.id = r.id AND d.lease_token = %(token)s
            RETURNING r.last""",
        # The schedule's row, created if need be and locked for the firing transaction:
        # nodes firing one schedule take turns, and the later one sees the earlier's fire.
        Sql.SCHEDULE_LOCK: """
            INSERT INTO {s}.schedules AS t (name) VALUES (%(name)s)
            ON CONFLICT (name) DO UPDATE SET name = t.name
            RETURNING enabled, last_fire""",
        # The tick's key: a second try of one tick inserts nothing.
        Sql.SCHEDULE_FIRE: """
            INSERT INTO {s}.schedule_fires (schedule, fire_time, job_id, node)
            VALUES (%(name)s, %(tick)s, %(job_id)s, %(node)s)
            ON CONFLICT DO NOTHING RETURNING 1""",
        # The last fire moves on; keys older than a day are no longer needed (a node only
        # ever fires the latest due tick).
        Sql.SCHEDULE_FIRED: """
            WITH pruned AS (
                DELETE FROM {s}.schedule_fires WHERE schedule = %(name)s
                  AND fire_time < %(tick)s::timestamptz - interval '1 day')
            UPDATE {s}.schedules SET last_fire = %(tick)s, last_job_id = %(job_id)s,
                updated_at = now()
            WHERE name = %(name)s""",
        # Enabling again starts the count of missed ticks anew.
        Sql.SCHEDULE_SWITCH: """
            INSERT INTO {s}.schedules AS t (name, enabled, enabled_at)
            VALUES (%(name)s, %(enabled)s, CASE WHEN %(enabled)s THEN now() END)
            ON CONFLICT (name) DO UPDATE SET enabled = EXCLUDED.enabled,
                enabled_at = CASE WHEN EXCLUDED.enabled AND NOT t.enabled THEN now()
                    ELSE t.enabled_at END,
                updated_at = now()
            RETURNING name, enabled, last_fire, last_job_id, enabled_at""",
        Sql.TAKE_STARTS: """
            SELECT o_granted, o_tat, o_left
            FROM {s}.take_paced_starts(%(type)s, %(limit)s, %(period)s, %(want)s)""",
        Sql.RETURN_STARTS: """
            UPDATE {s}.rate_pace SET tat = tat - %(count)s * step
            WHERE type = %(type)s AND tat = %(tat)s""",
    }
)

TEMPLATES: Final[Mapping[Sql, str]] = MappingProxyType({**_WRITES, **READS, **WORKFLOW_SQL})


_FILTERED: Final = (Sql.LIST_JOBS, Sql.COUNT_JOBS, Sql.JOB_BRIEFS)
_COUNTED_FILTERS: Final = ("type", "status", "queue")  # the first filters: counted ones
assert FILTER_COLUMNS[: len(_COUNTED_FILTERS)] == _COUNTED_FILTERS


def _where(columns: tuple[str, ...]) -> str:
    """`WHERE` one equality per column, each value bound by the column's name."""
    if not columns:
        return ""
    return "WHERE " + " AND ".join(f"{column} = %({column})s" for column in columns)


class Statements(dict[Sql, str]):
    """Every statement of the store, formatted once for one schema, by name (a dict:
    looking one up is no call of ours)."""

    def __init__(self, schema: str) -> None:
        shared = fragments(check_schema_name(schema))
        super().__init__((name, TEMPLATES[name].format_map(shared)) for name in Sql)
        self._filtered: dict[tuple[Sql, tuple[bool, ...]], str] = {}
        for used in product((False, True), repeat=len(FILTER_COLUMNS)):
            chosen = tuple(c for c, on in zip(FILTER_COLUMNS, used, strict=True) if on)
            where = shared | {"where": _where(chosen)}
            for name in _FILTERED:
                template = TEMPLATES[name]
                if name is Sql.COUNT_JOBS and not any(used[len(_COUNTED_FILTERS) :]):
                    template = TEMPLATES[Sql.COUNT_COUNTED]  # the counts kept answer it
                self._filtered[name, used] = template.format_map(where)

    def list_jobs(self, filters: JobFilter) -> tuple[str, str]:
        """The page and the count statements for `filters`: each filter that is set
        (not empty) is bound by its column's name (`%(type)s`, `%(status)s`, `%(queue)s`)."""
        return self.filtered(Sql.LIST_JOBS, filters), self.filtered(Sql.COUNT_JOBS, filters)

    def filtered(self, name: Sql, filters: JobFilter) -> str:
        """A statement taking the job filters (`LIST_JOBS`, `COUNT_JOBS`, `JOB_BRIEFS`),
        in its variant for the filters that are set (each bound by its column's name)."""
        used = (
            bool(filters.type),
            bool(filters.status),
            bool(filters.queue),
            bool(filters.parent_id),
            bool(filters.concurrency_key),
        )
        return self._filtered[name, used]
