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
        # Run first in the claim transaction. It locks the limited types in a fixed order
        # (by name) so claimers never deadlock; it is a statement of its own because the
        # claim must see a snapshot taken after the locks were granted, one that counts
        # the other nodes' committed claims. It also pins the claim's plan to ordered
        # index scans (the queue filters defeat the row estimates, and a bitmap scan plus
        # sort of every due job of a (type, priority) is ten times slower on a deep
        # queue), planned once: re-planning this statement costs more than running it.
        # It answers the types under a global limit.
        self.claim_setup = f"""
            WITH limited AS MATERIALIZED (
                SELECT DISTINCT key AS type FROM {s}.nodes, jsonb_each_text(limits)
                WHERE {LIVE_NODES} AND value IS NOT NULL AND key = ANY(%(types)s::text[])
                ORDER BY 1)
            SELECT set_config('enable_bitmapscan', 'off', true),
                   set_config('plan_cache_mode', 'force_generic_plan', true),
                   (SELECT count(pg_advisory_xact_lock(hashtextextended(%(lock_ns)s || type, 0)))
                    FROM limited),
                   (SELECT coalesce(array_agg(type), '{{}}') FROM limited)"""
        self.claim = f"""
            WITH lim AS (
                SELECT key AS type, min(value::int) AS lim
                FROM {s}.nodes, jsonb_each_text(limits)
                WHERE {LIVE_NODES} AND value IS NOT NULL AND key = ANY(%(types)s::text[])
                GROUP BY key),
            caps AS (
                SELECT t.type, CASE WHEN lim.lim IS NULL THEN t.cap ELSE least(t.cap,
                    lim.lim - (SELECT count(*) FROM {s}.jobs r
                               WHERE r.status = 'running' AND r.type = t.type)) END AS cap
                FROM unnest(%(types)s::text[], %(caps)s::int[]) AS t(type, cap)
                LEFT JOIN lim ON lim.type = t.type),
            cand AS (
                SELECT c.* FROM caps CROSS JOIN LATERAL (
                    SELECT x.* FROM generate_series(10, 0, -1) AS p(priority)
                    CROSS JOIN LATERAL (
                        SELECT j.id, j.priority, j.run_at, j.seq FROM {s}.jobs j
                        WHERE j.status = 'pending' AND j.type = caps.type
                          AND j.priority = p.priority AND j.run_at <= now()
                          AND (%(queues)s::text[] IS NULL OR j.queue = ANY(%(queues)s::text[]))
                          AND j.queue <> ALL (ARRAY(SELECT queue FROM {s}.paused_queues))
                        ORDER BY j.run_at, j.seq
                        LIMIT %(limit)s
                        FOR UPDATE OF j SKIP LOCKED) x
                    LIMIT least(caps.cap, %(limit)s)) c
                WHERE caps.cap > 0),
            pick AS (
                SELECT id FROM cand ORDER BY priority DESC, run_at, seq LIMIT %(limit)s)
            UPDATE {s}.jobs j SET status = 'running', attempts = j.attempts + 1,
                started_at = now(), updated_at = now(), lease_owner = %(node)s,
                lease_token = gen_random_uuid(),
                lease_expires_at = now() + %(lease)s::float8 * interval '1 second'
            FROM pick WHERE j.id = pick.id
            RETURNING {", ".join("j." + c.strip() for c in cols.split(","))},
                j.lease_token, j.lease_owner, j.lease_expires_at"""
        # One index probe per (type, priority): cheap even with many scheduled jobs.
        self.next_due = f"""
            SELECT min(x.run_at) FROM unnest(%(types)s::text[]) AS t(type)
            CROSS JOIN generate_series(0, 10) AS p(priority)
            CROSS JOIN LATERAL (
                SELECT j.run_at FROM {s}.jobs j
                WHERE j.status = 'pending' AND j.type = t.type AND j.priority = p.priority
                  AND j.run_at > now()
                ORDER BY j.run_at LIMIT 1) x"""
        self.next_due_any = (
            f"SELECT min(run_at) FROM {s}.jobs WHERE status = 'pending' AND run_at > now()"
        )
        self.heartbeat = f"""
            UPDATE {s}.jobs j
            SET lease_expires_at = now() + %(lease)s::float8 * interval '1 second'
            FROM unnest(%(ids)s::uuid[], %(tokens)s::uuid[]) AS l(id, token)
            WHERE j.id = l.id AND j.lease_token = l.token AND j.status = 'running'
            RETURNING j.lease_token"""
        self.expired = f"""
            SELECT id, lease_token, lease_owner, attempts, max_retries FROM {s}.jobs
            WHERE status = 'running' AND lease_expires_at < now()
            ORDER BY lease_expires_at LIMIT %(limit)s
            FOR UPDATE SKIP LOCKED"""
        self.complete = f"""
            UPDATE {s}.jobs SET status = 'done', result = %(result)s, finished_at = now(),
                updated_at = now(), {CLEAR_LEASE}
            WHERE {FENCED}
            RETURNING {cols}"""
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
        self.register = f"""
            INSERT INTO {s}.nodes (node_id, limits, heartbeat_at)
            VALUES (%(node)s, %(limits)s, now())
            ON CONFLICT (node_id) DO UPDATE SET limits = EXCLUDED.limits, heartbeat_at = now()"""
        self.forget_node = f"DELETE FROM {s}.nodes WHERE node_id = %(node)s"
        self.known_types = f"""
            SELECT DISTINCT jsonb_object_keys(limits) FROM {s}.nodes WHERE {LIVE_NODES}"""
        self.copy_events = f"COPY {s}.events (job_id, event, at, node, attempt, detail) FROM STDIN"
        self.events = f"""
            SELECT job_id, event, at, node, attempt, detail FROM {s}.events
            WHERE job_id = %(id)s ORDER BY at, id"""
        self.expire_keys = f"""
            WITH d AS (DELETE FROM {s}.dedupe WHERE expires_at < now()),
                 i AS (DELETE FROM {s}.idempotency WHERE expires_at < now())
            DELETE FROM {s}.nodes WHERE heartbeat_at < now() - interval '1 day'"""
