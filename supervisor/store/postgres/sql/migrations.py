"""GoQueue's released PostgreSQL migrations, in order (`MIGRATIONS`).

A step is never edited once released: add a new one instead
(`tests/e2e/store/test_pg_schema.py` pins a hash of each released step's text).
`sql/schema.py`'s `migrate` applies them; `{s}` in a step's SQL stands for the quoted schema.
"""

from __future__ import annotations

import msgspec
from goqueue.supervisor.store.postgres.sql.claim import CLAIM_V14, CLAIM_V15
from goqueue.supervisor.store.postgres.sql.claim_keys import FLOW_KEYS, KEY_PROBES
from goqueue.supervisor.store.postgres.sql.claim_paused import CLAIM_PAST_PAUSED
from goqueue.supervisor.store.postgres.sql.claim_starts import CLAIM_STARTS
from goqueue.supervisor.store.postgres.sql.counts import COUNTED
from goqueue.supervisor.store.postgres.sql.flow_counts import FLOW_STATUS
from goqueue.supervisor.store.postgres.sql.tallies import DEAD_GROUPS, TALLIED

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


# Migration 4's claim function: migration 2's, with one parameter more, `p_start`. The
# best `p_start` jobs picked start at once (running, attempt charged, started_at), as
# before; the others are `claimed` (held, not charged) until a worker takes them. Jobs
# held by claims count against the global limits as running ones do.
_TAKE_BEST_V4 = """        pick AS (
            SELECT id, row_number() OVER (ORDER BY priority DESC, run_at, seq) AS n
            FROM cand ORDER BY priority DESC, run_at, seq LIMIT p_limit),
        claimed AS (
            UPDATE {s}.jobs j SET
                status = CASE WHEN pick.n <= p_start THEN 'running' ELSE 'claimed' END,
                attempts = j.attempts + CASE WHEN pick.n <= p_start THEN 1 ELSE 0 END,
                started_at = CASE WHEN pick.n <= p_start THEN now() END,
                updated_at = now(), lease_owner = p_node,
                lease_token = gen_random_uuid(),
                lease_expires_at = now() + p_lease * interval '1 second'
            FROM pick WHERE j.id = pick.id
            RETURNING j)
        SELECT claimed.j, NULL::timestamptz, NULL::text[] FROM claimed;
"""


def _claim_v4(v2: str) -> str:
    """Migration 4's claim function, from migration 2's text (`v2`)."""
    edits = (
        (
            "p_lease float8, p_live float8, p_lock_ns text)",
            "p_lease float8, p_live float8, p_lock_ns text, p_start int)",
        ),
        (
            "WHERE r.status = 'running' AND r.type",
            "WHERE r.status IN ('running', 'claimed') AND r.type",
        ),
        (_TAKE_BEST, _TAKE_BEST_V4),
    )
    text = v2[v2.index("CREATE FUNCTION") :]
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new)
    return text


class Migration(msgspec.Struct, frozen=True):
    """One schema step; `{s}` in the SQL stands for the (quoted) schema name."""

    version: int
    name: str
    sql: str


_MIGRATION_2 = (
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
"""
)
_CLAIM_V4 = _claim_v4(_MIGRATION_2)


# Every event was in two indexes: its id's (the key, read by nothing) and its job's
# (job_id, at, id), which every read and every delete of a trail uses. That index alone,
# unique since it ends with the id, is the key now: each event written costs one index
# entry fewer (three a job on its happy path), and the table keeps a key (a replica
# identity, for logical replication).
EVENTS_KEYED = """
CREATE UNIQUE INDEX events_trail ON {s}.events (job_id, at, id);
ALTER TABLE {s}.events DROP CONSTRAINT events_pkey;
ALTER TABLE {s}.events ADD CONSTRAINT events_pkey PRIMARY KEY USING INDEX events_trail;
DROP INDEX {s}.events_job;
"""


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
    Migration(2, "claim function, claim index by queue", _MIGRATION_2),
    Migration(
        3,
        "index for pruning finished jobs",
        """
CREATE INDEX jobs_finished ON {s}.jobs (finished_at)
    WHERE status IN ('done', 'failed', 'cancelled');
""",
    ),
    Migration(
        4,
        "claimed status: an attempt starts when a worker takes the job",
        """
ALTER TABLE {s}.jobs DROP CONSTRAINT jobs_status_check;
ALTER TABLE {s}.jobs ADD CONSTRAINT jobs_status_check
    CHECK (status IN ('pending', 'claimed', 'running', 'done', 'failed', 'cancelled'));
-- Small: only jobs claimed ahead. Finds their expired leases; counts them per type.
CREATE INDEX jobs_claimed ON {s}.jobs (type, lease_expires_at) WHERE status = 'claimed';
DROP FUNCTION {s}.claim(text[], int[], text[], int, text, float8, float8, text);
"""
        + _CLAIM_V4,
    ),
    Migration(
        5,
        "webhook outbox",
        """
-- One row per webhook delivery, written by the statement that makes its job terminal,
-- so a delivery commits exactly when the status does; any live node delivers it.
CREATE TABLE {s}.webhook_deliveries (
    id              uuid PRIMARY KEY,  -- the X-GoQueue-Delivery header, the same on retries
    job_id          uuid NOT NULL,
    event           text NOT NULL
                    CHECK (event IN ('job.done', 'job.failed', 'job.cancelled')),
    url             text NOT NULL,
    body            text NOT NULL,  -- the job as the API shows it, encoded once
    created_at      timestamptz NOT NULL,
    attempts        integer NOT NULL DEFAULT 0,
    history         jsonb NOT NULL DEFAULT '[]',  -- each attempt: at, status_code, error, node
    -- When it is due; NULL once delivered or given up. A node delivering it pushes this
    -- a lease ahead (and holds lease_token), so if that node dies another takes it then.
    next_attempt_at timestamptz,
    lease_owner     text,
    lease_token     uuid,
    delivered_at    timestamptz,
    given_up_at     timestamptz
);
-- Small and cheap to poll: only deliveries still to make.
CREATE INDEX webhook_deliveries_due ON {s}.webhook_deliveries (next_attempt_at)
    WHERE next_attempt_at IS NOT NULL;
CREATE INDEX webhook_deliveries_job ON {s}.webhook_deliveries (job_id);
-- Pruning finished deliveries with their jobs.
CREATE INDEX webhook_deliveries_finished ON {s}.webhook_deliveries (created_at)
    WHERE next_attempt_at IS NULL;
""",
    ),
    Migration(
        6,
        "unique jobs, dead letters by job",
        """
-- A unique key is held while its job is not terminal: defined by the terminal set, so a
-- status added later (claimed...) holds the key too. Two enqueues racing on one key from
-- two nodes: the second waits for the first's transaction, then finds the key held.
ALTER TABLE {s}.jobs ADD COLUMN unique_key text;
CREATE UNIQUE INDEX jobs_unique_key ON {s}.jobs (unique_key)
    WHERE unique_key IS NOT NULL AND status NOT IN ('done', 'failed', 'cancelled');
-- GET /dlq/ID finds a letter by its job's id too; bulk actions take the oldest first.
CREATE INDEX dead_letters_job ON {s}.dead_letters (job_id);
CREATE INDEX dead_letters_oldest ON {s}.dead_letters (created_at, seq);
""",
    ),
    Migration(
        7,
        "periodic jobs",
        """
-- One row per schedule ever fired or switched: whether it is enabled (for every node,
-- across restarts), its last fire (the tick's time) and the job that made, and when it
-- was last enabled (ticks before that were refused, not missed).
CREATE TABLE {s}.schedules (
    name        text PRIMARY KEY,
    enabled     boolean NOT NULL DEFAULT true,
    last_fire   timestamptz,
    last_job_id uuid,
    enabled_at  timestamptz,
    updated_at  timestamptz NOT NULL DEFAULT now()
);
-- One row per fired tick: its primary key is what makes a tick fire once however many
-- nodes try it. The firing statement prunes a schedule's rows older than a day.
CREATE TABLE {s}.schedule_fires (
    schedule  text NOT NULL,
    fire_time timestamptz NOT NULL,
    job_id    uuid NOT NULL,
    node      text NOT NULL,
    fired_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (schedule, fire_time)
);
""",
    ),
    Migration(
        8,
        "rate limits",
        """
-- The starts taken in each rate-limited type's current window, shared by every node.
CREATE TABLE {s}.rate_windows (
    type         text NOT NULL,
    window_start timestamptz NOT NULL,
    used         integer NOT NULL,
    PRIMARY KEY (type, window_start)
);
-- Take up to p_want starts of p_type from its window of p_period seconds (aligned on
-- the epoch, on the database's clock), at most p_limit per window; nodes take turns on
-- the window's row. Older windows of the type are deleted on the way. Nothing is granted
-- in a window's last p_guard seconds: a job claimed then would start in the next one.
CREATE FUNCTION {s}.take_starts(p_type text, p_limit integer, p_period float8,
    p_want integer, p_guard float8,
    OUT o_granted integer, OUT o_window float8, OUT o_left float8)
LANGUAGE plpgsql AS $fn$
DECLARE
    v_now float8 := extract(epoch FROM clock_timestamp());
    v_used integer;
BEGIN
    o_window := floor(v_now / p_period) * p_period;
    o_left := o_window + p_period - v_now;
    IF o_left < p_guard THEN
        o_granted := 0;
        RETURN;
    END IF;
    INSERT INTO {s}.rate_windows (type, window_start, used)
    VALUES (p_type, to_timestamp(o_window), 0) ON CONFLICT DO NOTHING;
    SELECT r.used INTO v_used FROM {s}.rate_windows r
    WHERE r.type = p_type AND r.window_start = to_timestamp(o_window) FOR UPDATE;
    o_granted := least(p_want, greatest(0, p_limit - v_used));
    UPDATE {s}.rate_windows r SET used = r.used + o_granted
    WHERE r.type = p_type AND r.window_start = to_timestamp(o_window);
    DELETE FROM {s}.rate_windows r
    WHERE r.type = p_type AND r.window_start < to_timestamp(o_window);
END
$fn$;
""",
    ),
    Migration(
        9,
        "smooth rate limits",
        """
-- GCRA (see goqueue's dispatch/rates.py): each rate-limited type's theoretical arrival
-- time, in seconds since the epoch on the database's clock, and the seconds between
-- starts at its rate. rate_windows and take_starts stay for nodes of older versions.
CREATE TABLE {s}.rate_pace (
    type text PRIMARY KEY,
    tat  float8 NOT NULL,
    step float8 NOT NULL
);
-- Grant up to p_want of the starts of p_type due now: none while its TAT is ahead,
-- else those missed since it (one at least, p_limit at most), the TAT moved past them.
-- Nodes take turns on the type's row, so the pace holds across all of them.
CREATE FUNCTION {s}.take_paced_starts(p_type text, p_limit integer, p_period float8,
    p_want integer, OUT o_granted integer, OUT o_tat float8, OUT o_left float8)
LANGUAGE plpgsql AS $fn$
DECLARE
    v_now float8 := extract(epoch FROM clock_timestamp());
    v_step float8 := p_period / p_limit;
BEGIN
    INSERT INTO {s}.rate_pace (type, tat, step) VALUES (p_type, 0, v_step)
    ON CONFLICT DO NOTHING;
    SELECT r.tat INTO o_tat FROM {s}.rate_pace r WHERE r.type = p_type FOR UPDATE;
    IF o_tat > v_now OR p_want <= 0 THEN
        o_granted := 0;
        o_left := greatest(0, o_tat - v_now);
        RETURN;
    END IF;
    o_granted := least(p_want::float8, p_limit::float8,
                       1 + floor((v_now - o_tat) / v_step))::integer;
    o_tat := v_now + o_granted * v_step;
    o_left := o_tat - v_now;
    UPDATE {s}.rate_pace r SET tat = o_tat, step = v_step WHERE r.type = p_type;
END
$fn$;
""",
    ),
    Migration(
        10,
        "jobs by parent, node reports",
        """
-- What each node publishes with its heartbeat (its workers, its last minute's jobs), so
-- any node's dashboard shows the whole cluster. NULL from nodes that publish none.
ALTER TABLE {s}.nodes ADD COLUMN report json;
-- The dashboard links a job to the one its template enqueued (parent_id = its id); only
-- chained and child jobs have a parent, so the index stays small.
CREATE INDEX jobs_parent ON {s}.jobs (parent_id) WHERE parent_id IS NOT NULL;
""",
    ),
    Migration(
        11,
        "tracebacks in events",
        """
-- A failed attempt's traceback, beside its error (the errors in jobs are JSON: there
-- it is one more key, which needs no step).
ALTER TABLE {s}.events ADD COLUMN traceback text;
""",
    ),
    Migration(
        12,
        "trace context",
        """
-- With --otel, the enqueue's W3C trace context (traceparent, tracestate): an attempt's span
-- joins the enqueue's trace. NULL without tracing.
ALTER TABLE {s}.jobs ADD COLUMN trace_context jsonb;
""",
    ),
    Migration(
        13,
        "workflows: waiting steps, their parents and edges",
        """
-- A workflow step is a job with its workflow, its key there, its parents' job ids, their
-- results by key as they finish (`parents`), and while it waits the count of parents not
-- done yet (`unfinished`): the row each parent's completion decrements.
ALTER TABLE {s}.jobs DROP CONSTRAINT jobs_status_check;
ALTER TABLE {s}.jobs ADD CONSTRAINT jobs_status_check CHECK (status IN
    ('waiting', 'pending', 'claimed', 'running', 'done', 'failed', 'cancelled'));
ALTER TABLE {s}.jobs ADD COLUMN workflow_id uuid, ADD COLUMN step_key text,
    ADD COLUMN parent_ids uuid[], ADD COLUMN parents json, ADD COLUMN unfinished integer;
CREATE INDEX jobs_workflow ON {s}.jobs (workflow_id, step_key, seq)
    WHERE workflow_id IS NOT NULL;
CREATE TABLE {s}.workflows (
    id           uuid PRIMARY KEY,
    seq          bigserial NOT NULL,
    name         text NOT NULL,
    created_at   timestamptz NOT NULL,
    cancelled_at timestamptz
);
CREATE INDEX workflows_newest ON {s}.workflows (seq DESC);
CREATE TABLE {s}.workflow_edges (
    parent uuid NOT NULL,
    child  uuid NOT NULL,
    PRIMARY KEY (parent, child)
);
CREATE INDEX workflow_edges_child ON {s}.workflow_edges (child);
""",
    ),
    Migration(14, "a cheaper claim function, claim_leases", CLAIM_V14),
    Migration(15, "a claim from where the last left off, claim_floored", CLAIM_V15),
    Migration(16, "flow control by key: keys, per-key limits, the keyed claim", FLOW_KEYS),
    Migration(17, "the keyed claim's window probed from its cursor", KEY_PROBES),
    Migration(18, "a claim starts the jobs at its head whose type starts soon", CLAIM_STARTS),
    Migration(19, "a claim steps over paused queues' jobs on its usual walk", CLAIM_PAST_PAUSED),
    Migration(20, "the jobs counted as they change", COUNTED),
    Migration(21, "a workflow's status kept with it, and counted", FLOW_STATUS),
    Migration(22, "the dead letters counted as they come and go", TALLIED),
    Migration(23, "a job's events kept under one index, their key", EVENTS_KEYED),
    Migration(24, "the dead letters tallied and indexed by queue and type", DEAD_GROUPS),
)
