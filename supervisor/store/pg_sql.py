"""Every statement the PostgreSQL store runs: one table, formatted once per schema.

`TEMPLATES` maps each `Sql` name to its text. In a template `{s}` stands for the quoted
schema and the other `{...}` names for the fragments of `_fragments` (a template that
is an f-string, splicing in a module constant, writes them `{{s}}`); parameters are
always bound (`%(name)s`), never formatted in. `Statements(schema)` formats the table
once; `Statements.list_jobs` picks the listing for a filter among variants built from
a fixed tuple of columns, so no statement is composed from a caller's values.

The columns of a `Job` are generated from the struct (`JOB_FIELDS`), in its field order,
which is also the order `pg_rows.job` decodes. Every state change writes its audit
events in the same statement (a `trail` CTE over the changed rows, `changed`), so an
event commits exactly when the change it describes does, at no extra round trip.

A terminal status (done, failed, cancelled) writes its webhook's outbox row in the same
statement too: the `outbox` CTE, over the `hooked` column of `changed` (the whole new
row when the job has a `webhook_url`, NULL otherwise). The deliveries are then read and
updated by the `OUTBOX_*` statements (`pg_outbox`).

The migrations (tables, indexes, the claim function) are in `pg_schema`.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum, auto
from itertools import product
from types import MappingProxyType
from typing import Final

import msgspec
from goqueue.supervisor.jobs import Job, JobFilter
from goqueue.supervisor.store.pg_schema import channel, check_schema_name
from goqueue.supervisor.store.pg_webhook_body import body_sql
from goqueue.supervisor.vocab import EventKind

JOB_FIELDS: Final = tuple(field.name for field in msgspec.structs.fields(Job))
N_JOB_FIELDS: Final = len(JOB_FIELDS)
FILTER_COLUMNS: Final = ("type", "status", "queue")  # `JobFilter` fields: equality filters
LIVE_LEASES: Final = 3  # a node is live (its limits count) while its beat is this many leases old

# The columns an enqueue writes, and the values it writes for a job's parameters.
_INSERTED = (
    "id, type, queue, payload, priority, status, attempts, max_retries, run_at,"
    " timeout_seconds, dedupe_key, unique_key, webhook_url, on_success, on_failure,"
    " parent_id, created_at, updated_at"
)
_INSERT_VALUES = """(%(id)s, %(type)s, %(queue)s, %(payload)s, %(priority)s, 'pending', 0,
                %(max_retries)s,
                coalesce(%(run_at)s::timestamptz, now() + %(delay)s::float8 * interval '1 second'),
                %(timeout)s, %(dedupe_key)s, %(unique_key)s, %(webhook_url)s, %(on_success)s,
                %(on_failure)s, %(parent_id)s, now(), now())"""

# The partial unique index of migration 6: a unique key is held while its job is not
# terminal. Written out once, for `ON CONFLICT` to name the index by its predicate.
_UNIQUE_HELD = "unique_key IS NOT NULL AND status NOT IN ('done', 'failed', 'cancelled')"


def _trail(event: EventKind) -> str:
    """A CTE writing one `event` per row of `changed` (which has `id` and `attempts`)."""
    return f"""trail AS (
            INSERT INTO {{s}}.events (job_id, event, at, node, attempt, detail)
            SELECT id, '{event}', now(), %(node)s, attempts, NULL FROM changed)"""


# A CTE writing, for the one row of `changed`, the events `%(events)s` with their
# details `%(details)s` (two text arrays), in array order.
_TRAIL_OF_EVENTS = """trail AS (
            INSERT INTO {s}.events (job_id, event, at, node, attempt, detail)
            SELECT changed.id, e.event, now(), %(node)s, changed.attempts, e.detail
            FROM changed CROSS JOIN unnest(%(events)s::text[], %(details)s::text[])
                WITH ORDINALITY AS e(event, detail, n)
            ORDER BY e.n)"""


# `hooked`: a column of `changed` holding the job's new row when it has a webhook (the
# UPDATE's target is `jobs`, or `j` in `hooked_j`). `outbox`: a CTE writing one delivery,
# due now, per such row; its event is `job.` and the status (done, failed, cancelled).
_HOOKED = "CASE WHEN {t}.webhook_url IS NOT NULL THEN {t} END AS hooked"
_OUTBOX = f"""outbox AS (
            INSERT INTO {{s}}.webhook_deliveries
                (id, job_id, event, url, body, created_at, next_attempt_at)
            SELECT gen_random_uuid(), (h.hooked).id, 'job.' || (h.hooked).status,
                (h.hooked).webhook_url,
                {body_sql("h.hooked")},
                now(), now()
            FROM changed h WHERE (h.hooked).id IS NOT NULL)"""


# The filters of dead letters (`pg_rows.dead_filter` gives their parameters).
_DEAD_WHERE = """WHERE (%(type)s::text IS NULL OR job ->> 'type' = %(type)s::text)
              AND (%(queue)s::text IS NULL OR job ->> 'queue' = %(queue)s::text)
              AND (%(job_id)s::uuid IS NULL OR job_id = %(job_id)s::uuid)
              AND (%(pattern)s::text IS NULL OR job ->> 'last_error' ILIKE %(pattern)s::text)
              AND (%(before)s::timestamptz IS NULL OR created_at < %(before)s::timestamptz)
              AND (%(after)s::timestamptz IS NULL OR created_at > %(after)s::timestamptz)"""


def _fragments(schema: str) -> dict[str, str]:
    """The fragments the templates share, with the schema filled in."""
    quoted = f'"{schema}"'
    fragments = {
        "job": ", ".join(JOB_FIELDS),
        "claimed_job": ", ".join(f"(c.o_job).{name}" for name in JOB_FIELDS),
        "clear_lease": "lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL",
        "fenced": "id = %(id)s AND lease_token = %(token)s AND status = 'running'",
        "held": ("id = %(id)s AND lease_token = %(token)s AND status IN ('running', 'claimed')"),
        "append_error": (
            "errors = errors || jsonb_build_array(jsonb_build_object("
            "'attempt', attempts, 'error', %(error)s::text, 'at', now())),"
            " last_error = %(error)s"
        ),
        "live_nodes": "heartbeat_at > now() - %(live)s * interval '1 second'",
        "trail": _TRAIL_OF_EVENTS,
        "where": "",
        # a preview is three columns: the first n characters, the size in bytes, whether cut
        "previews": ", ".join(
            f"left(t.{c}, %(n)s), octet_length(t.{c}), char_length(t.{c}) > %(n)s"
            for c in ("p", "r", "e")
        ),
        "dead_from": """FROM {s}.dead_letters CROSS JOIN LATERAL
                (SELECT (job -> 'payload')::text AS p, NULL::text AS r,
                    job ->> 'last_error' AS e) t
            """
        + _DEAD_WHERE,
        "dead_where": _DEAD_WHERE,
        "channel": f'"{channel(schema)}"',
        "hooked": _HOOKED.format(t="jobs"),
        "hooked_j": _HOOKED.format(t="j"),
        "outbox": _OUTBOX,
    }
    return {name: text.replace("{s}", quoted) for name, text in fragments.items()} | {"s": quoted}


class Sql(StrEnum):
    """The name of each statement of the store (a key of `TEMPLATES`)."""

    # sessions and nodes
    SESSION = auto()
    PING = auto()
    LISTEN = auto()
    NOTIFY = auto()
    REGISTER = auto()
    FORGET_NODE = auto()
    KNOWN_TYPES = auto()
    EXPIRE_KEYS = auto()
    PAUSE = auto()
    RESUME = auto()
    # enqueue
    INSERT_JOB = auto()
    ADD_JOB = auto()
    ADD_JOB_STARTED = auto()
    ADD_JOBS = auto()
    CLAIM_DEDUPE = auto()
    DEDUPE_HOLDER = auto()
    UNIQUE_HOLDER = auto()
    CLAIM_IDEMPOTENCY = auto()
    IDEMPOTENCY_HOLDER = auto()
    TAKE_DEAD = auto()
    TAKE_DEAD_MANY = auto()
    # leases and outcomes
    CLAIM = auto()
    START_MANY = auto()
    NEXT_DUE_ANY = auto()
    HEARTBEAT = auto()
    EXPIRED = auto()
    COMPLETE = auto()
    COMPLETE_MANY = auto()
    RETRY = auto()
    BURY = auto()
    INSERT_DEAD = auto()
    RELEASE = auto()
    LOCK_JOB = auto()
    CANCEL = auto()
    # reads
    GET = auto()
    LIST_JOBS = auto()
    COUNT_JOBS = auto()
    COUNTS = auto()
    DEPTH = auto()
    QUEUE_COUNTS = auto()
    QUEUE_DEPTH = auto()
    IS_PAUSED = auto()
    QUEUE_DEPTHS = auto()
    QUEUE_NAMES = auto()
    EVENTS = auto()
    DEAD_COUNT = auto()
    LIST_DEAD = auto()
    GET_DEAD = auto()
    PURGE_DEAD = auto()
    PURGE_DEAD_MANY = auto()
    COUNT_DEAD_MATCHING = auto()
    PRUNE = auto()
    # summaries for operators (the dashboard)
    QUEUE_PENDING = auto()
    QUEUE_RUNNING = auto()
    PAUSED = auto()
    NODES = auto()
    JOB_BRIEFS = auto()
    DEAD_BRIEFS = auto()
    COUNT_DEAD_BRIEFS = auto()
    # the webhook outbox
    OUTBOX_CLAIM = auto()
    OUTBOX_RECORD = auto()
    OUTBOX_OF_JOB = auto()
    # periodic jobs
    SCHEDULE_STATES = auto()
    SCHEDULE_LOCK = auto()
    SCHEDULE_FIRE = auto()
    SCHEDULE_FIRED = auto()
    SCHEDULE_SWITCH = auto()
    # rate limits
    TAKE_STARTS = auto()
    RETURN_STARTS = auto()


TEMPLATES: Final[Mapping[Sql, str]] = MappingProxyType(
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
        Sql.REGISTER: """
            INSERT INTO {s}.nodes (node_id, limits, heartbeat_at)
            VALUES (%(node)s, %(limits)s, now())
            ON CONFLICT (node_id) DO UPDATE SET limits = EXCLUDED.limits, heartbeat_at = now()""",
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
        # events; unless it is not due yet, its queue is paused or a live node declares a
        # limit on its type (then pending, as ADD_JOB stores it). The last columns tell.
        Sql.ADD_JOB_STARTED: f"""
            WITH go AS (
                SELECT coalesce(%(run_at)s::timestamptz, now() + %(delay)s::float8
                        * interval '1 second') <= now()
                    AND NOT EXISTS (SELECT 1 FROM {{s}}.paused_queues WHERE queue = %(queue)s)
                    AND NOT EXISTS (
                        SELECT 1 FROM {{s}}.nodes, jsonb_each_text(limits) l
                        WHERE {{live_nodes}} AND l.key = %(type)s AND l.value IS NOT NULL)
                    AS run),
            changed AS (
                INSERT INTO {{s}}.jobs ({_INSERTED},
                    started_at, lease_owner, lease_token, lease_expires_at)
                SELECT %(id)s, %(type)s, %(queue)s, %(payload)s, %(priority)s,
                    CASE WHEN go.run THEN 'running' ELSE 'pending' END,
                    CASE WHEN go.run THEN 1 ELSE 0 END, %(max_retries)s,
                    coalesce(%(run_at)s::timestamptz,
                        now() + %(delay)s::float8 * interval '1 second'),
                    %(timeout)s, %(dedupe_key)s, %(unique_key)s, %(webhook_url)s,
                    %(on_success)s, %(on_failure)s, %(parent_id)s, now(), now(),
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
            SELECT run_at, created_at, seq, started_at, lease_expires_at FROM changed""",
        # Several plain jobs in one statement (group commit, batches): one round trip, one
        # plan, rows inserted (and seq assigned) in array order. Parameters go binary.
        Sql.ADD_JOBS: f"""
            WITH changed AS (
                INSERT INTO {{s}}.jobs ({_INSERTED})
                SELECT t.id, t.type, t.queue, t.payload::json, t.priority, 'pending', 0,
                    t.max_retries, coalesce(t.run_at, now() + t.delay * interval '1 second'),
                    t.timeout, t.dedupe_key, t.unique_key, t.webhook_url, t.on_success::json,
                    t.on_failure::json, t.parent_id, now(), now()
                FROM unnest(%(id)b::uuid[], %(type)b::text[], %(queue)b::text[],
                    %(payload)b::text[], %(priority)b::int2[], %(max_retries)b::int4[],
                    %(run_at)b::timestamptz[], %(delay)b::float8[], %(timeout)b::float8[],
                    %(dedupe_key)b::text[], %(unique_key)b::text[], %(webhook_url)b::text[],
                    %(on_success)b::text[], %(on_failure)b::text[], %(parent_id)b::uuid[])
                    AS t(id, type, queue, payload, priority, max_retries, run_at, delay,
                         timeout, dedupe_key, unique_key, webhook_url, on_success, on_failure,
                         parent_id)
                RETURNING id, attempts, run_at, created_at, seq),
            {_trail(EventKind.ENQUEUED)}
            SELECT id, run_at, created_at, seq FROM changed""",
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
        Sql.CLAIM_IDEMPOTENCY: """
            INSERT INTO {s}.idempotency (key, request_hash, job_id, expires_at)
            VALUES (%(key)s, %(hash)s, %(id)s, now() + %(ttl)s::float8 * interval '1 second')
            ON CONFLICT (key) DO UPDATE SET request_hash = EXCLUDED.request_hash,
                job_id = EXCLUDED.job_id, expires_at = EXCLUDED.expires_at
            WHERE idempotency.expires_at <= now()
            RETURNING job_id""",
        Sql.IDEMPOTENCY_HOLDER: """
            SELECT request_hash, job_id FROM {s}.idempotency WHERE key = %(key)s""",
        Sql.TAKE_DEAD: """
            DELETE FROM {s}.dead_letters WHERE id = %(id)s
            RETURNING id, job_id, job, errors, created_at""",
        # The claim is the function of migration 4 (its last row has no job: the earliest
        # future run_at and the types under a global limit); the same statement writes a
        # `started` event per lease it starts (the others are `claimed`).
        Sql.CLAIM: f"""
            WITH c AS (
                SELECT * FROM {{s}}.claim(%(types)s::text[], %(caps)s::int[],
                    %(queues)s::text[], %(limit)s::int, %(node)s::text, %(lease)s::float8,
                    %(live)s::float8, %(lock_ns)s::text, %(start)s::int)),
            changed AS (
                SELECT (c.o_job).id, (c.o_job).attempts FROM c
                WHERE (c.o_job).id IS NOT NULL AND (c.o_job).status = 'running'),
            {_trail(EventKind.STARTED)}
            SELECT {{claimed_job}}, (c.o_job).lease_token, (c.o_job).lease_owner,
                (c.o_job).lease_expires_at, c.o_next_due, c.o_limited
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
                  AND j.id = c.id AND j.lease_token = c.token AND j.status = 'claimed'
                RETURNING j.id, j.lease_token, j.attempts, j.started_at),
            {_trail(EventKind.STARTED)}
            SELECT id, lease_token, attempts, started_at FROM changed""",
        Sql.HEARTBEAT: """
            UPDATE {s}.jobs j
            SET lease_expires_at = now() + %(lease)s::float8 * interval '1 second'
            FROM unnest(%(ids)s::uuid[], %(tokens)s::uuid[]) AS l(id, token)
            WHERE j.id = ANY (%(ids)s::uuid[]) AND j.id = l.id AND j.lease_token = l.token
              AND j.status IN ('running', 'claimed')
            RETURNING j.lease_token""",
        # Nothing is reaped in the first lease term after the database (re)started: no
        # holder could extend its leases while it was down, and live ones do so now.
        Sql.EXPIRED: """
            SELECT id, lease_token, lease_owner, attempts, max_retries, status FROM {s}.jobs
            WHERE status IN ('running', 'claimed') AND lease_expires_at < now()
                AND pg_postmaster_start_time() < now() - make_interval(secs => %(term)s)
            ORDER BY lease_expires_at LIMIT %(limit)s
            FOR UPDATE SKIP LOCKED""",
        # Success needs no more than the commit's time back: the rest of the job is the
        # lease's (its row cannot change while the lease holds, except through the fence).
        Sql.COMPLETE: f"""
            WITH changed AS (
                UPDATE {{s}}.jobs SET status = 'done', result = %(result)s,
                    finished_at = now(), updated_at = now(), {{clear_lease}}
                WHERE {{fenced}}
                RETURNING id, attempts, finished_at, {{hooked}}),
            {{outbox}},
            {_trail(EventKind.SUCCEEDED)}
            SELECT finished_at FROM changed""",
        # The ids become a uuid[] once (an initplan): a cast of the text[] parameter in
        # the condition would run again for every row a generic plan happens to scan.
        Sql.COMPLETE_MANY: f"""
            WITH changed AS (
                UPDATE {{s}}.jobs j SET status = 'done', result = c.result::json,
                    finished_at = now(), updated_at = now(), {{clear_lease}}
                FROM unnest(%(ids)b::uuid[], %(tokens)b::uuid[], %(results)b::text[])
                    AS c(id, token, result)
                WHERE j.id = ANY (ARRAY(SELECT unnest(%(ids)b::uuid[])))
                  AND j.id = c.id AND j.lease_token = c.token AND j.status = 'running'
                RETURNING j.id, c.token, j.attempts, j.finished_at, {{hooked_j}}),
            {{outbox}},
            {_trail(EventKind.SUCCEEDED)}
            SELECT id, token, finished_at FROM changed""",
        # Pending again at %(retry_at)s (now when NULL), with the events given.
        Sql.RETRY: """
            WITH changed AS (
                UPDATE {s}.jobs SET status = 'pending',
                    run_at = coalesce(%(retry_at)s::timestamptz, now()), {append_error},
                    updated_at = now(), {clear_lease}
                WHERE {fenced}
                RETURNING {job}),
            {trail}
            SELECT {job} FROM changed""",
        Sql.BURY: """
            WITH changed AS (
                UPDATE {s}.jobs SET status = 'failed', finished_at = now(), {append_error},
                    updated_at = now(), {clear_lease}
                WHERE {fenced}
                RETURNING {job}, {hooked}),
            {outbox},
            {trail}
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
        Sql.CANCEL: f"""
            WITH changed AS (
                UPDATE {{s}}.jobs SET status = 'cancelled', finished_at = now(),
                    updated_at = now(), {{clear_lease}}
                WHERE id = %(id)s
                RETURNING {{job}}, {{hooked}}),
            {{outbox}},
            {_trail(EventKind.CANCELLED)}
            SELECT {{job}} FROM changed""",
        Sql.GET: "SELECT {job} FROM {s}.jobs WHERE id = %(id)s",
        # `{where}`: empty here; `Statements.list_jobs` has a variant per filter.
        Sql.LIST_JOBS: """
            SELECT {job} FROM {s}.jobs {where}
            ORDER BY created_at DESC, seq DESC LIMIT %(limit)s OFFSET %(offset)s""",
        Sql.COUNT_JOBS: "SELECT count(*) FROM {s}.jobs {where}",
        Sql.COUNTS: "SELECT status, count(*) FROM {s}.jobs GROUP BY status",
        Sql.DEPTH: """
            SELECT queue, priority, count(*) FROM {s}.jobs WHERE status = 'pending'
            GROUP BY queue, priority""",
        Sql.QUEUE_COUNTS: """
            SELECT status, count(*) FROM {s}.jobs WHERE queue = %(queue)s GROUP BY status""",
        Sql.QUEUE_DEPTH: """
            SELECT priority, count(*) FROM {s}.jobs
            WHERE queue = %(queue)s AND status = 'pending' GROUP BY priority""",
        Sql.IS_PAUSED: """
            SELECT EXISTS (SELECT 1 FROM {s}.paused_queues WHERE queue = %(queue)s)""",
        # Rows (kind, queue, priority, n, seconds): 'depth' (queue, priority, n) for the
        # `top` deepest queues; 'all' (priority, n) over every queue; 'queues' (n queues);
        # 'wait' (queue, seconds its longest-waiting due job has waited) for the top queues;
        # 'other' (n other queues, their longest wait); 'dead' (n dead letters). A few
        # hundred rows however many queues there are: a scrape never parses one per queue.
        Sql.QUEUE_DEPTHS: """
            WITH per_queue AS MATERIALIZED (
                SELECT queue, count(*) AS n, extract(epoch FROM
                    now() - min(run_at) FILTER (WHERE run_at <= now()))::float8 AS age
                FROM {s}.jobs WHERE status = 'pending' GROUP BY queue),
            top AS MATERIALIZED (
                SELECT queue FROM per_queue ORDER BY n DESC, queue LIMIT %(top)s)
            SELECT 'depth', queue, priority, count(*), NULL::float8 FROM {s}.jobs
            WHERE status = 'pending' AND queue IN (SELECT queue FROM top)
            GROUP BY queue, priority
            UNION ALL
            SELECT 'all', NULL, priority, count(*), NULL FROM {s}.jobs WHERE status = 'pending'
            GROUP BY priority
            UNION ALL
            SELECT 'queues', NULL, NULL, count(*), NULL FROM per_queue
            UNION ALL
            SELECT 'wait', queue, NULL, NULL, coalesce(greatest(age, 0), 0) FROM per_queue
            WHERE queue IN (SELECT queue FROM top)
            UNION ALL
            SELECT 'other', NULL, NULL, count(*), coalesce(greatest(max(age), 0), 0)
            FROM per_queue WHERE queue NOT IN (SELECT queue FROM top)
            UNION ALL
            SELECT 'dead', NULL, NULL, count(*), NULL FROM {s}.dead_letters""",
        Sql.QUEUE_NAMES: """
            (SELECT queue FROM {s}.jobs WHERE status = 'pending' GROUP BY queue
             LIMIT %(limit)s)
            UNION SELECT queue FROM {s}.paused_queues""",
        Sql.EVENTS: """
            SELECT job_id, event, at, node, attempt, detail FROM {s}.events
            WHERE job_id = %(id)s ORDER BY at, id""",
        Sql.DEAD_COUNT: "SELECT count(*) FROM {s}.dead_letters",
        Sql.LIST_DEAD: """
            SELECT id, job_id, job, errors, created_at FROM {s}.dead_letters {dead_where}
            ORDER BY created_at DESC, seq DESC LIMIT %(limit)s OFFSET %(offset)s""",
        # By its own id, else by its job's (a job has at most one letter).
        Sql.GET_DEAD: """
            SELECT id, job_id, job, errors, created_at FROM {s}.dead_letters
            WHERE id = %(id)s OR job_id = %(id)s ORDER BY id = %(id)s DESC LIMIT 1""",
        Sql.PURGE_DEAD: "DELETE FROM {s}.dead_letters WHERE id = %(id)s",
        # Bulk actions take the oldest matching letters first; a letter another node is
        # taking is skipped, not waited for (it counts as remaining).
        Sql.TAKE_DEAD_MANY: """
            DELETE FROM {s}.dead_letters WHERE id IN (
                SELECT id FROM {s}.dead_letters {dead_where}
                ORDER BY created_at, seq LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
            RETURNING id, job_id, job, errors, created_at, seq""",
        Sql.PURGE_DEAD_MANY: """
            WITH gone AS (
                DELETE FROM {s}.dead_letters WHERE id IN (
                    SELECT id FROM {s}.dead_letters {dead_where}
                    ORDER BY created_at, seq LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
                RETURNING id)
            SELECT (SELECT count(*) FROM gone),
                (SELECT count(*) FROM {s}.dead_letters {dead_where})
                    - (SELECT count(*) FROM gone)""",
        Sql.COUNT_DEAD_MATCHING: "SELECT count(*) FROM {s}.dead_letters {dead_where}",
        Sql.PRUNE: """
            WITH gone AS (
                DELETE FROM {s}.jobs WHERE id IN (
                    SELECT id FROM {s}.jobs
                    WHERE status IN ('done', 'failed', 'cancelled')
                      AND finished_at < %(before)s
                    ORDER BY finished_at LIMIT %(limit)s)
                RETURNING id),
            trail AS (DELETE FROM {s}.events WHERE job_id IN (SELECT id FROM gone)),
            -- finished deliveries as old (created with their job's terminal status)
            hooks AS (DELETE FROM {s}.webhook_deliveries WHERE id IN (
                SELECT id FROM {s}.webhook_deliveries
                WHERE next_attempt_at IS NULL AND created_at < %(before)s
                ORDER BY created_at LIMIT %(limit)s))
            SELECT count(*) FROM gone""",
        Sql.QUEUE_PENDING: """
            SELECT queue, priority, count(*),
                count(*) FILTER (WHERE run_at > now()),
                min(run_at) FILTER (WHERE run_at <= now()),
                extract(epoch FROM now() - min(run_at) FILTER (WHERE run_at <= now()))::float8
            FROM {s}.jobs WHERE status = 'pending' GROUP BY queue, priority""",
        Sql.QUEUE_RUNNING: """
            SELECT queue, count(*) FROM {s}.jobs WHERE status = 'running' GROUP BY queue""",
        Sql.PAUSED: "SELECT queue FROM {s}.paused_queues",
        Sql.NODES: """
            SELECT node_id, started_at, heartbeat_at,
                heartbeat_at > now() - %(live)s * interval '1 second', limits
            FROM {s}.nodes WHERE heartbeat_at > now() - interval '1 hour' ORDER BY node_id""",
        Sql.JOB_BRIEFS: """
            SELECT id, type, queue, priority, status, attempts, max_retries, run_at,
                created_at, started_at, finished_at, updated_at, parent_id, {previews}
            FROM {s}.jobs CROSS JOIN LATERAL
                (SELECT payload::text AS p, result::text AS r, last_error AS e) t
            {where}
            ORDER BY created_at DESC, seq DESC LIMIT %(limit)s OFFSET %(offset)s""",
        Sql.DEAD_BRIEFS: """
            SELECT id, job_id, job ->> 'type', job ->> 'queue', (job ->> 'priority')::int,
                (job ->> 'attempts')::int, (job ->> 'max_retries')::int, created_at,
                {previews}
            {dead_from}
            ORDER BY created_at DESC, seq DESC LIMIT %(limit)s OFFSET %(offset)s""",
        Sql.COUNT_DEAD_BRIEFS: "SELECT count(*) {dead_from}",
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
        Sql.OUTBOX_OF_JOB: """
            SELECT id, event, url, history, delivered_at, next_attempt_at, given_up_at
            FROM {s}.webhook_deliveries WHERE job_id = %(id)s ORDER BY created_at, id""",
        Sql.SCHEDULE_STATES: """
            SELECT name, enabled, last_fire, last_job_id, enabled_at FROM {s}.schedules""",
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
            SELECT o_granted, o_window, o_left
            FROM {s}.take_starts(%(type)s, %(limit)s, %(period)s, %(want)s, %(guard)s)""",
        Sql.RETURN_STARTS: """
            UPDATE {s}.rate_windows SET used = greatest(0, used - %(count)s)
            WHERE type = %(type)s AND window_start = to_timestamp(%(window)s)""",
    }
)


_FILTERED: Final = (Sql.LIST_JOBS, Sql.COUNT_JOBS, Sql.JOB_BRIEFS)


def _where(columns: tuple[str, ...]) -> str:
    """`WHERE` one equality per column, each value bound by the column's name."""
    if not columns:
        return ""
    return "WHERE " + " AND ".join(f"{column} = %({column})s" for column in columns)


class Statements:
    """Every statement of the store, formatted once for one schema."""

    def __init__(self, schema: str) -> None:
        fragments = _fragments(check_schema_name(schema))
        self._text = {name: TEMPLATES[name].format_map(fragments) for name in Sql}
        self._filtered: dict[tuple[Sql, tuple[bool, ...]], str] = {}
        for used in product((False, True), repeat=len(FILTER_COLUMNS)):
            chosen = tuple(c for c, on in zip(FILTER_COLUMNS, used, strict=True) if on)
            where = fragments | {"where": _where(chosen)}
            for name in _FILTERED:
                self._filtered[name, used] = TEMPLATES[name].format_map(where)

    def __getitem__(self, name: Sql) -> str:
        return self._text[name]

    def list_jobs(self, filters: JobFilter) -> tuple[str, str]:
        """The page and the count statements for `filters`: each filter that is set
        (not empty) is bound by its column's name (`%(type)s`, `%(status)s`, `%(queue)s`)."""
        return self.filtered(Sql.LIST_JOBS, filters), self.filtered(Sql.COUNT_JOBS, filters)

    def filtered(self, name: Sql, filters: JobFilter) -> str:
        """A statement taking the job filters (`LIST_JOBS`, `COUNT_JOBS`, `JOB_BRIEFS`),
        in its variant for the filters that are set (each bound by its column's name)."""
        used = (bool(filters.type), bool(filters.status), bool(filters.queue))
        return self._filtered[name, used]
