"""The PostgreSQL schema of GoQueue: its migrations, and every statement the store runs.

`migrate` applies the steps not yet recorded in `schema_version`, all in one transaction
under a transaction-scoped advisory lock, so several nodes starting at once are safe and
running it again is a no-op. A step is never edited once released: add a new one instead.
"""

from __future__ import annotations

import re

import msgspec
from psycopg import AsyncConnection, sql

SCHEMA_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,47}$")


# How many jobs of each asked-for type a claim may take: the node's free slots, capped by
# the smallest limit any live node declares minus what runs everywhere (both branches of
# the claim function use it).
_TYPE_CAPS = """        WITH lim AS (
            SELECT key AS type, min(value::int) AS lim FROM {s}.nodes, jsonb_each_text(limits)
            WHERE heartbeat_at > now() - p_live * interval '1 second'
              AND value IS NOT NULL AND key = ANY(p_types)
            GROUP BY key),
        caps AS (
            SELECT t.type, CASE WHEN lim.lim IS NULL THEN t.cap ELSE least(t.cap,
                lim.lim - (SELECT count(*) FROM {s}.jobs r
                           WHERE r.status = 'running' AND r.type = t.type)) END AS cap
            FROM unnest(p_types, p_caps) AS t(type, cap) LEFT JOIN lim ON lim.type = t.type),
"""


# The end of both claim branches: the best `p_limit` candidates become leases.
_TAKE_BEST = (
    "        pick AS (SELECT id FROM cand ORDER BY priority DESC, run_at, seq LIMIT p_limit),\n"
    """        claimed AS (
            UPDATE {s}.jobs j SET status = 'running', attempts = j.attempts + 1,
                started_at = now(), updated_at = now(), lease_owner = p_node,
                lease_token = gen_random_uuid(),
                lease_expires_at = now() + p_lease * interval '1 second'
            WHERE j.id = ANY (ARRAY(SELECT id FROM pick))
            RETURNING j)
        SELECT claimed.j, NULL::timestamptz, NULL::text[] FROM claimed;
"""
)


class Migration(msgspec.Struct, frozen=True):
    """One schema step; `{s}` in the SQL stands for the (quoted) schema name."""

    version: int
    name: str
    sql: str


MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        1,
        "jobs, dead letters, keys, nodes, pauses, events",
        """
-- User JSON (payload, result, templates, snapshots) is `json`, not `jsonb`: it is stored
-- and handed back byte for byte, as the client sent it (as the memory store does), and
-- `jsonb` would refuse strings holding an escaped NUL character. GoQueue never queries it.
CREATE TABLE {s}.jobs (
    id               uuid PRIMARY KEY,
    seq              bigserial NOT NULL,
    type             text NOT NULL,
    queue            text NOT NULL,
    payload          json NOT NULL,
    priority         smallint NOT NULL CHECK (priority BETWEEN 0 AND 10),
    status           text NOT NULL
                     CHECK (status IN ('pending', 'running', 'done', 'failed', 'cancelled')),
    attempts         integer NOT NULL DEFAULT 0,
    max_retries      integer NOT NULL,
    run_at           timestamptz NOT NULL,
    timeout_seconds  double precision,
    dedupe_key       text,
    webhook_url      text,
    on_success       json,
    on_failure       json,
    parent_id        uuid,
    result           json,
    last_error       text,
    errors           jsonb NOT NULL DEFAULT '[]',
    created_at       timestamptz NOT NULL,
    started_at       timestamptz,
    finished_at      timestamptz,
    updated_at       timestamptz NOT NULL,
    lease_owner      text,
    lease_token      uuid,
    lease_expires_at timestamptz
);
-- Claiming walks this per (type, priority) in run_at, seq order.
CREATE INDEX jobs_claim ON {s}.jobs (type, priority, run_at, seq) WHERE status = 'pending';
-- Small: only running jobs. Counts running per type (global limits) and finds expired leases.
CREATE INDEX jobs_running ON {s}.jobs (type, lease_expires_at) WHERE status = 'running';
CREATE INDEX jobs_newest ON {s}.jobs (created_at DESC, seq DESC);

CREATE TABLE {s}.dead_letters (
    id         uuid PRIMARY KEY,
    seq        bigserial NOT NULL,
    job_id     uuid NOT NULL,
    job        json NOT NULL,
    errors     jsonb NOT NULL,
    created_at timestamptz NOT NULL
);
CREATE INDEX dead_letters_newest ON {s}.dead_letters (created_at DESC, seq DESC);

CREATE TABLE {s}.dedupe (
    key        text PRIMARY KEY,
    job_id     uuid NOT NULL,
    expires_at timestamptz NOT NULL
);

CREATE TABLE {s}.idempotency (
    key          text PRIMARY KEY,
    request_hash text NOT NULL,
    job_id       uuid NOT NULL,
    expires_at   timestamptz NOT NULL
);

CREATE TABLE {s}.nodes (
    node_id      text PRIMARY KEY,
    limits       jsonb NOT NULL,
    started_at   timestamptz NOT NULL DEFAULT now(),
    heartbeat_at timestamptz NOT NULL
);

CREATE TABLE {s}.paused_queues (
    queue     text PRIMARY KEY,
    paused_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE {s}.events (
    id      bigserial PRIMARY KEY,
    job_id  uuid NOT NULL,
    event   text NOT NULL,
    at      timestamptz NOT NULL,
    node    text NOT NULL,
    attempt integer NOT NULL,
    detail  text
);
CREATE INDEX events_job ON {s}.events (job_id, at, id);
""",
    ),
    Migration(
        2,
        "claim function, claim index by queue",
        """
-- A node serving some queues, or with some paused, walks only the jobs it may take.
CREATE INDEX jobs_claim_queue ON {s}.jobs (queue, type, priority, run_at, seq)
    WHERE status = 'pending';

-- The claim in one call, one round trip, no transaction block (see Queries.claim).
-- Rows: the claimed jobs (as leases), then one last row with no job holding the earliest
-- future run_at of the types asked for and which of them are under a global limit.
CREATE FUNCTION {s}.claim(
    p_types text[], p_caps int[], p_queues text[], p_limit int, p_node text,
    p_lease float8, p_live float8, p_lock_ns text)
RETURNS TABLE (o_job {s}.jobs, o_next_due timestamptz, o_limited text[])
LANGUAGE plpgsql
-- Ordered index scans, planned once: the queue filters defeat the row estimates (a bitmap
-- scan plus sort of every due job of a type is ten times slower on a deep queue), and
-- re-planning these statements would cost more than running them. A plan made while the
-- table was small must not scan it whole once it is large (no sequential scans), and
-- generic plans of a deep queue look costly enough to compile: no JIT, whoever calls.
SET enable_bitmapscan = off
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $fn$
DECLARE
    v_limited text[];
    v_type text;
    v_queues text[];
BEGIN
    -- A claim lost in a database crash leaves its job pending, and nothing fenced by its
    -- token can commit without it (a durable commit flushes the WAL before it): the
    -- claim need not wait for its own flush.
    PERFORM set_config('synchronous_commit', 'off', true);
    SELECT coalesce(array_agg(l.type ORDER BY l.type), '{{}}') INTO v_limited
    FROM (SELECT DISTINCT key AS type FROM {s}.nodes, jsonb_each_text(limits)
          WHERE heartbeat_at > now() - p_live * interval '1 second'
            AND value IS NOT NULL AND key = ANY(p_types)) l;
    -- Types under a global limit are claimed by one node at a time, locked in name order
    -- (no deadlock); the claim below runs on a snapshot taken after the locks, one that
    -- counts every claim committed before (each statement of a volatile function takes
    -- a fresh snapshot).
    FOREACH v_type IN ARRAY v_limited LOOP
        PERFORM pg_advisory_xact_lock(hashtextextended(p_lock_ns || v_type, 0));
    END LOOP;
    IF p_queues IS NULL AND NOT EXISTS (SELECT 1 FROM {s}.paused_queues) THEN
        RETURN QUERY
"""
        + _TYPE_CAPS
        + """        cand AS (
            SELECT c.* FROM caps CROSS JOIN LATERAL (
                SELECT x.* FROM generate_series(10, 0, -1) AS p(priority)
                CROSS JOIN LATERAL (
                    SELECT j.id, j.priority, j.run_at, j.seq FROM {s}.jobs j
                    WHERE j.status = 'pending' AND j.type = caps.type
                      AND j.priority = p.priority AND j.run_at <= now()
                    ORDER BY j.run_at, j.seq
                    LIMIT p_limit
                    FOR UPDATE OF j SKIP LOCKED) x
                LIMIT least(caps.cap, p_limit)) c
            WHERE caps.cap > 0),
"""
        + _TAKE_BEST
        + """    ELSE
        -- By queue: the queues asked for, or every queue with pending jobs (found by
        -- skipping along the index), less the paused ones. Within a priority the queues'
        -- heads are merged by run_at, seq.
        IF p_queues IS NULL THEN
            WITH RECURSIVE q AS (
                SELECT min(queue) AS queue FROM {s}.jobs WHERE status = 'pending'
                UNION ALL
                SELECT (SELECT min(j.queue) FROM {s}.jobs j
                        WHERE j.status = 'pending' AND j.queue > q.queue)
                FROM q WHERE q.queue IS NOT NULL)
            SELECT array_agg(q.queue) INTO v_queues FROM q WHERE q.queue IS NOT NULL;
        ELSE
            v_queues := p_queues;
        END IF;
        v_queues := ARRAY(SELECT unnest(v_queues) EXCEPT SELECT queue FROM {s}.paused_queues);
        RETURN QUERY
"""
        + _TYPE_CAPS
        + """        cand AS (
            SELECT c.* FROM caps CROSS JOIN LATERAL (
                SELECT x.* FROM generate_series(10, 0, -1) AS p(priority)
                CROSS JOIN LATERAL (
                    SELECT y.* FROM unnest(v_queues) AS q(queue) CROSS JOIN LATERAL (
                        SELECT j.id, j.priority, j.run_at, j.seq FROM {s}.jobs j
                        WHERE j.status = 'pending' AND j.queue = q.queue
                          AND j.type = caps.type AND j.priority = p.priority
                          AND j.run_at <= now()
                        ORDER BY j.run_at, j.seq
                        LIMIT least(caps.cap, p_limit)
                        FOR UPDATE OF j SKIP LOCKED) y
                    ORDER BY y.run_at, y.seq) x
                LIMIT least(caps.cap, p_limit)) c
            WHERE caps.cap > 0),
"""
        + _TAKE_BEST
        + """    END IF;
    -- One index probe per (type, priority): cheap even with many scheduled jobs.
    RETURN QUERY
    SELECT NULL::{s}.jobs, min(x.run_at), v_limited
    FROM unnest(p_types) AS t(type) CROSS JOIN generate_series(0, 10) AS p(priority)
    CROSS JOIN LATERAL (
        SELECT j.run_at FROM {s}.jobs j
        WHERE j.status = 'pending' AND j.type = t.type AND j.priority = p.priority
          AND j.run_at > now()
        ORDER BY j.run_at LIMIT 1) x;
END
$fn$;
""",
    ),
    Migration(
        3,
        "index for pruning finished jobs",
        """
CREATE INDEX jobs_finished ON {s}.jobs (finished_at)
    WHERE status IN ('done', 'failed', 'cancelled');
""",
    ),
)


def check_schema_name(schema: str) -> str:
    """Return `schema` if it is a plain lower-case identifier (it is also used in a
    NOTIFY channel name, so it must stay short); raise ValueError otherwise."""
    if not SCHEMA_NAME.match(schema):
        raise ValueError(
            f"invalid schema name {schema!r}: use lower-case letters, digits and _ (max 48)"
        )
    return schema


def lock_key(schema: str) -> str:
    """The text hashed into the advisory lock that serializes migrations of `schema`."""
    return f"goqueue.migrate.{schema}"


async def current_version(conn: AsyncConnection, schema: str) -> int:
    """The highest applied migration of `schema` (0 when none)."""
    cur = await conn.execute(
        "SELECT to_regclass(%s) IS NOT NULL", (f"{check_schema_name(schema)}.schema_version",)
    )
    row = await cur.fetchone()
    if not row or not row[0]:
        return 0
    query = sql.SQL("SELECT coalesce(max(version), 0) FROM {}.schema_version").format(
        sql.Identifier(schema)
    )
    cur = await conn.execute(query)
    row = await cur.fetchone()
    return int(row[0]) if row else 0


async def migrate(conn: AsyncConnection, schema: str) -> list[int]:
    """Create `schema` and apply every pending migration; return the versions applied.

    Safe to run concurrently from several processes: the first takes the advisory lock
    and does the work, the others wait for it and then find nothing left to apply.
    """
    check_schema_name(schema)
    ident = sql.Identifier(schema)
    applied: list[int] = []
    async with conn.transaction():
        await conn.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (lock_key(schema),)
        )
        await conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(ident))
        await conn.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {}.schema_version ("
                " version integer PRIMARY KEY,"
                " name text NOT NULL,"
                " applied_at timestamptz NOT NULL DEFAULT now())"
            ).format(ident)
        )
        done = await current_version(conn, schema)
        for step in MIGRATIONS:
            if step.version <= done:
                continue
            await conn.execute(sql.SQL(step.sql).format(s=ident))  # type: ignore[arg-type]
            await conn.execute(
                sql.SQL("INSERT INTO {}.schema_version (version, name) VALUES (%s, %s)").format(
                    ident
                ),
                (step.version, step.name),
            )
            applied.append(step.version)
    return applied


# -- the statements of the store ---------------------------------------------------------

JOB_COLUMNS = (
    "id, type, queue, payload, priority, status, attempts, max_retries, run_at,"
    " timeout_seconds, dedupe_key, webhook_url, on_success, on_failure, parent_id, result,"
    " last_error, errors, created_at, started_at, finished_at, updated_at, seq"
)
N_JOB_COLUMNS = 23
CLEAR_LEASE = "lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL"
FENCED = "id = %(id)s AND lease_token = %(token)s AND status = 'running'"
APPEND_ERROR = (
    "errors = errors || jsonb_build_array(jsonb_build_object("
    "'attempt', attempts, 'error', %(error)s::text, 'at', now())), last_error = %(error)s"
)
LIVE_NODES = "heartbeat_at > now() - %(live)s * interval '1 second'"


class Queries:
    """Every statement of the store, with the schema name filled in once."""

    def __init__(self, schema: str) -> None:
        s = f'"{check_schema_name(schema)}"'
        cols = JOB_COLUMNS
        self.insert_job = f"""
            INSERT INTO {s}.jobs (id, type, queue, payload, priority, status, attempts,
                max_retries, run_at, timeout_seconds, dedupe_key, webhook_url, on_success,
                on_failure, parent_id, created_at, updated_at)
            VALUES (%(id)s, %(type)s, %(queue)s, %(payload)s, %(priority)s, 'pending', 0,
                %(max_retries)s,
                coalesce(%(run_at)s::timestamptz, now() + %(delay)s::float8 * interval '1 second'),
                %(timeout)s, %(dedupe_key)s, %(webhook_url)s, %(on_success)s, %(on_failure)s,
                %(parent_id)s, now(), now())
            RETURNING {cols}"""
        # The enqueue hot path: the caller knows the job already, so the statements answer
        # only what the database decides (run_at, created_at, seq), not the payload again.
        self.add_job = self.insert_job.replace(
            f"RETURNING {cols}", "RETURNING run_at, created_at, seq"
        )
        # Several plain jobs in one statement (group commit, batches): one round trip, one
        # plan, rows inserted (and seq assigned) in array order. Parameters go binary.
        self.add_jobs = f"""
            INSERT INTO {s}.jobs (id, type, queue, payload, priority, status, attempts,
                max_retries, run_at, timeout_seconds, dedupe_key, webhook_url, on_success,
                on_failure, parent_id, created_at, updated_at)
            SELECT t.id, t.type, t.queue, t.payload::json, t.priority, 'pending', 0,
                t.max_retries, coalesce(t.run_at, now() + t.delay * interval '1 second'),
                t.timeout, t.dedupe_key, t.webhook_url, t.on_success::json, t.on_failure::json,
                t.parent_id, now(), now()
            FROM unnest(%(id)b::uuid[], %(type)b::text[], %(queue)b::text[],
                %(payload)b::text[], %(priority)b::int2[], %(max_retries)b::int4[],
                %(run_at)b::timestamptz[], %(delay)b::float8[], %(timeout)b::float8[],
                %(dedupe_key)b::text[], %(webhook_url)b::text[], %(on_success)b::text[],
                %(on_failure)b::text[], %(parent_id)b::uuid[])
                AS t(id, type, queue, payload, priority, max_retries, run_at, delay, timeout,
                     dedupe_key, webhook_url, on_success, on_failure, parent_id)
            RETURNING id, run_at, created_at, seq"""
        self.claim_dedupe = f"""
            INSERT INTO {s}.dedupe (key, job_id, expires_at)
            VALUES (%(key)s, %(id)s, now() + %(window)s::float8 * interval '1 second')
            ON CONFLICT (key) DO UPDATE SET job_id = EXCLUDED.job_id,
                expires_at = EXCLUDED.expires_at
            WHERE dedupe.expires_at <= now()
            RETURNING job_id"""
        self.dedupe_holder = f"SELECT job_id FROM {s}.dedupe WHERE key = %(key)s"
        self.claim_idempotency = f"""
            INSERT INTO {s}.idempotency (key, request_hash, job_id, expires_at)
            VALUES (%(key)s, %(hash)s, %(id)s, now() + %(ttl)s::float8 * interval '1 second')
            ON CONFLICT (key) DO UPDATE SET request_hash = EXCLUDED.request_hash,
                job_id = EXCLUDED.job_id, expires_at = EXCLUDED.expires_at
            WHERE idempotency.expires_at <= now()
            RETURNING job_id"""
        self.idempotency_holder = (
            f"SELECT request_hash, job_id FROM {s}.idempotency WHERE key = %(key)s"
        )
        self.count_pending = f"SELECT count(*) FROM {s}.jobs WHERE status = 'pending'"
        # The claim is the function of migration 2; the last row it answers has no job.
        job = ", ".join(f"(c.o_job).{c.strip()}" for c in cols.split(","))
        self.claim = f"""
            SELECT {job}, (c.o_job).lease_token, (c.o_job).lease_owner,
                (c.o_job).lease_expires_at, c.o_next_due, c.o_limited
            FROM {s}.claim(%(types)s::text[], %(caps)s::int[], %(queues)s::text[],
                %(limit)s::int, %(node)s::text, %(lease)s::float8, %(live)s::float8,
                %(lock_ns)s::text) AS c"""
        self.next_due_any = (
            f"SELECT min(run_at) FROM {s}.jobs WHERE status = 'pending' AND run_at > now()"
        )
        self.heartbeat = f"""
            UPDATE {s}.jobs j
            SET lease_expires_at = now() + %(lease)s::float8 * interval '1 second'
            FROM unnest(%(ids)s::uuid[], %(tokens)s::uuid[]) AS l(id, token)
            WHERE j.id = ANY (%(ids)s::uuid[]) AND j.id = l.id AND j.lease_token = l.token
              AND j.status = 'running'
            RETURNING j.lease_token"""
        self.expired = f"""
            SELECT id, lease_token, lease_owner, attempts, max_retries FROM {s}.jobs
            WHERE status = 'running' AND lease_expires_at < now()
            ORDER BY lease_expires_at LIMIT %(limit)s
            FOR UPDATE SKIP LOCKED"""
        # Success needs no more than the commit's time back: the rest of the job is the
        # lease's (its row cannot change while the lease holds, except through the fence).
        self.complete = f"""
            UPDATE {s}.jobs SET status = 'done', result = %(result)s, finished_at = now(),
                updated_at = now(), {CLEAR_LEASE}
            WHERE {FENCED}
            RETURNING finished_at"""
        self.complete_many = f"""
            UPDATE {s}.jobs j SET status = 'done', result = c.result::json, finished_at = now(),
                updated_at = now(), {CLEAR_LEASE}
            FROM unnest(%(ids)b::uuid[], %(tokens)b::uuid[], %(results)b::text[])
                AS c(id, token, result)
            WHERE j.id = ANY (%(ids)b::uuid[]) AND j.id = c.id AND j.lease_token = c.token
              AND j.status = 'running'
            RETURNING j.id, c.token, j.finished_at"""
        self.retry = f"""
            UPDATE {s}.jobs SET status = 'pending',
                run_at = coalesce(%(retry_at)s::timestamptz, now()), {APPEND_ERROR},
                updated_at = now(), {CLEAR_LEASE}
            WHERE {FENCED}
            RETURNING {cols}"""
        self.bury = f"""
            UPDATE {s}.jobs SET status = 'failed', finished_at = now(), {APPEND_ERROR},
                updated_at = now(), {CLEAR_LEASE}
            WHERE {FENCED}
            RETURNING {cols}"""
        self.insert_dead = f"""
            INSERT INTO {s}.dead_letters (id, job_id, job, errors, created_at)
            VALUES (%(id)s, %(job_id)s, %(job)s, %(errors)s, %(created_at)s)"""
        self.release = f"""
            UPDATE {s}.jobs SET status = 'pending', attempts = attempts - 1,
                updated_at = now(), {CLEAR_LEASE}
            WHERE {FENCED}
            RETURNING {cols}"""
        self.lock_job = f"SELECT status, lease_token FROM {s}.jobs WHERE id = %(id)s FOR UPDATE"
        self.cancel = f"""
            UPDATE {s}.jobs SET status = 'cancelled', finished_at = now(), updated_at = now(),
                {CLEAR_LEASE}
            WHERE id = %(id)s
            RETURNING {cols}"""
        self.get = f"SELECT {cols} FROM {s}.jobs WHERE id = %(id)s"
        self.jobs_from = f"{s}.jobs"
        self.counts = f"SELECT status, count(*) FROM {s}.jobs GROUP BY status"
        self.depth = f"""
            SELECT queue, priority, count(*) FROM {s}.jobs WHERE status = 'pending'
            GROUP BY queue, priority"""
        self.dead_count = f"SELECT count(*) FROM {s}.dead_letters"
        self.queue_counts = (
            f"SELECT status, count(*) FROM {s}.jobs WHERE queue = %(queue)s GROUP BY status"
        )
        self.queue_depth = f"""
            SELECT priority, count(*) FROM {s}.jobs
            WHERE queue = %(queue)s AND status = 'pending' GROUP BY priority"""
        self.is_paused = f"SELECT EXISTS (SELECT 1 FROM {s}.paused_queues WHERE queue = %(queue)s)"
        self.pause = (
            f"INSERT INTO {s}.paused_queues (queue) VALUES (%(queue)s) ON CONFLICT DO NOTHING"
        )
        self.resume = f"DELETE FROM {s}.paused_queues WHERE queue = %(queue)s"
        self.notify = "SELECT pg_notify(%(channel)s, %(payload)s)"
        self.paused = f"SELECT queue FROM {s}.paused_queues"
        dead_cols = "id, job_id, job, errors, created_at"
        self.list_dead = f"""
            SELECT {dead_cols} FROM {s}.dead_letters ORDER BY created_at DESC, seq DESC
            LIMIT %(limit)s OFFSET %(offset)s"""
        self.get_dead = f"SELECT {dead_cols} FROM {s}.dead_letters WHERE id = %(id)s"
        self.take_dead = f"DELETE FROM {s}.dead_letters WHERE id = %(id)s RETURNING {dead_cols}"
        self.purge_dead = f"DELETE FROM {s}.dead_letters WHERE id = %(id)s"
        self.prune = f"""
            WITH gone AS (
                DELETE FROM {s}.jobs WHERE id IN (
                    SELECT id FROM {s}.jobs
                    WHERE status IN ('done', 'failed', 'cancelled')
                      AND finished_at < %(before)s
                    ORDER BY finished_at LIMIT %(limit)s)
                RETURNING id),
            trail AS (DELETE FROM {s}.events WHERE job_id IN (SELECT id FROM gone))
            SELECT count(*) FROM gone"""
        self.register = f"""
            INSERT INTO {s}.nodes (node_id, limits, heartbeat_at)
            VALUES (%(node)s, %(limits)s, now())
            ON CONFLICT (node_id) DO UPDATE SET limits = EXCLUDED.limits, heartbeat_at = now()"""
        self.forget_node = f"DELETE FROM {s}.nodes WHERE node_id = %(node)s"
        self.known_types = f"""
            SELECT DISTINCT jsonb_object_keys(limits) FROM {s}.nodes WHERE {LIVE_NODES}"""
        self.insert_events = f"""
            INSERT INTO {s}.events (job_id, event, at, node, attempt, detail)
            SELECT * FROM unnest(%(job_id)b::uuid[], %(event)b::text[], %(at)b::timestamptz[],
                %(node)b::text[], %(attempt)b::int4[], %(detail)b::text[])"""
        self.events = f"""
            SELECT job_id, event, at, node, attempt, detail FROM {s}.events
            WHERE job_id = %(id)s ORDER BY at, id"""
        self.expire_keys = f"""
            WITH d AS (DELETE FROM {s}.dedupe WHERE expires_at < now()),
                 i AS (DELETE FROM {s}.idempotency WHERE expires_at < now())
            DELETE FROM {s}.nodes WHERE heartbeat_at < now() - interval '1 day'"""
