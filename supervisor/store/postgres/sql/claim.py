"""Migration 14's claim function, `claim_leases`: migration 4's `claim` at less cost.

The same parameters, rows, order and limits as `claim` (see migration 2's comments),
but each claim reads `nodes` only when some node declares a limit, and reads it once;
a type's running jobs are counted only when it is limited, each status on its own small
index; each type's priorities are walked from its highest pending one; and the last row
looks for the next scheduled job only when the claim came back short (a full one is
followed by another as soon as a slot frees: `Wakeups.claimed` keeps what it knew).
`claim` stays, unchanged, for nodes of older versions, which read the next due time off
every claim. `{s}` stands for the quoted schema.
"""

from __future__ import annotations

from typing import Final

# How either branch of the claim takes the candidates it found (`cand`): the best
# `p_limit` in claim order, the first `p_start` of them started, the rest claimed.
_TAKE: Final = """        pick AS (
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

# The declarations and the first step of every claim function since 14: the per-type
# limits the live nodes declare, each limited type claimed by one node at a time.
_LIMITS: Final = """DECLARE
    v_limited text[];
    v_limits int[];
    v_caps int[] := p_caps;
    v_type text;
    v_queues text[];
    v_taken bigint;
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    -- The smallest limit the live nodes declare on each type asked for, in name order.
    SELECT coalesce(array_agg(l.type ORDER BY l.type), '{{}}'), array_agg(l.lim ORDER BY l.type)
    INTO v_limited, v_limits
    FROM (SELECT e.key AS type, min(e.value::int) AS lim
          FROM {s}.nodes n CROSS JOIN LATERAL jsonb_each_text(n.limits) AS e
          WHERE jsonb_strip_nulls(n.limits) <> '{{}}'
            AND n.heartbeat_at > now() - p_live * interval '1 second'
            AND e.value IS NOT NULL AND e.key = ANY(p_types)
          GROUP BY e.key) l;
    IF cardinality(v_limited) > 0 THEN
        -- One node at a time claims a limited type, locked in name order (no deadlock);
        -- what runs is counted after the locks, on a snapshot that sees every claim
        -- committed before (each statement of a volatile function takes a fresh one).
        FOREACH v_type IN ARRAY v_limited LOOP
            PERFORM pg_advisory_xact_lock(hashtextextended(p_lock_ns || v_type, 0));
        END LOOP;
        v_caps := ARRAY(
            SELECT CASE WHEN l.lim IS NULL THEN t.cap ELSE least(t.cap, l.lim
                - (SELECT count(*) FROM {s}.jobs r
                   WHERE r.status = 'running' AND r.type = t.type)
                - (SELECT count(*) FROM {s}.jobs r
                   WHERE r.status = 'claimed' AND r.type = t.type))::int END
            FROM unnest(p_types, p_caps) WITH ORDINALITY AS t(type, cap, n)
            LEFT JOIN unnest(v_limited, v_limits) AS l(type, lim) ON l.type = t.type
            ORDER BY t.n);
    END IF;
"""

CLAIM_V14: Final = (
    """
-- Small and nearly always empty: the nodes declaring some per-type limit. A claim probes
-- it instead of reading every node's limits.
CREATE INDEX nodes_limiting ON {s}.nodes (node_id) WHERE jsonb_strip_nulls(limits) <> '{{}}';

CREATE FUNCTION {s}.claim_leases(
    p_types text[], p_caps int[], p_queues text[], p_limit int, p_node text,
    p_lease float8, p_live float8, p_lock_ns text, p_start int)
RETURNS TABLE (o_job {s}.jobs, o_next_due timestamptz, o_limited text[])
LANGUAGE plpgsql
SET enable_bitmapscan = off
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $fn$
"""
    + _LIMITS
    + """    -- Each type's priorities are walked from its highest pending one (one index probe)
    -- down: a type with nothing pending costs that probe, not one per priority. The bound
    -- is a filter on the 11 priorities, not generate_series' argument: the planner would
    -- guess that series a thousand rows long and join the update by hashing every job.
    IF p_queues IS NULL AND NOT EXISTS (SELECT 1 FROM {s}.paused_queues) THEN
        RETURN QUERY
        WITH cand AS (
            SELECT c.* FROM unnest(p_types, v_caps) AS caps(type, cap) CROSS JOIN LATERAL (
                SELECT max(h.priority) AS top FROM {s}.jobs h
                WHERE h.status = 'pending' AND h.type = caps.type) m CROSS JOIN LATERAL (
                SELECT x.* FROM generate_series(10, 0, -1) AS p(priority)
                CROSS JOIN LATERAL (
                    SELECT j.id, j.priority, j.run_at, j.seq FROM {s}.jobs j
                    WHERE j.status = 'pending' AND j.type = caps.type
                      AND j.priority = p.priority AND j.run_at <= now()
                    ORDER BY j.run_at, j.seq
                    LIMIT p_limit
                    FOR UPDATE OF j SKIP LOCKED) x
                WHERE p.priority <= m.top
                LIMIT least(caps.cap, p_limit)) c
            WHERE caps.cap > 0),
"""
    + _TAKE
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
        WITH cand AS (
            SELECT c.* FROM unnest(p_types, v_caps) AS caps(type, cap) CROSS JOIN LATERAL (
                SELECT max(h.priority) AS top FROM {s}.jobs h
                WHERE h.status = 'pending' AND h.type = caps.type) m CROSS JOIN LATERAL (
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
                WHERE p.priority <= m.top
                LIMIT least(caps.cap, p_limit)) c
            WHERE caps.cap > 0),
"""
    + _TAKE
    + """    END IF;
    -- The last row, with no job. A claim that took all it asked for is followed by another
    -- as soon as a slot frees, so only a short one looks for the next scheduled job: one
    -- index probe per (type, priority), up to the type's highest pending priority.
    GET DIAGNOSTICS v_taken = ROW_COUNT;
    IF v_taken < p_limit THEN
        RETURN QUERY
        SELECT NULL::{s}.jobs, min(x.run_at), v_limited
        FROM unnest(p_types) AS t(type) CROSS JOIN LATERAL (
            SELECT max(h.priority) AS top FROM {s}.jobs h
            WHERE h.status = 'pending' AND h.type = t.type) m
        CROSS JOIN generate_series(0, 10) AS p(priority)
        CROSS JOIN LATERAL (
            SELECT j.run_at FROM {s}.jobs j
            WHERE j.status = 'pending' AND j.type = t.type AND j.priority = p.priority
              AND j.run_at > now()
            ORDER BY j.run_at LIMIT 1) x
        WHERE p.priority <= m.top;
    ELSE
        o_job := NULL;
        o_next_due := NULL;
        o_limited := v_limited;
        RETURN NEXT;
    END IF;
END
$fn$;
"""
)

# Migration 15's claim function, `claim_floored`: `claim_leases` that starts each
# (type, priority) where this node's last claims left off, so it does not walk the index
# entries of jobs claimed already. A claimed job's pending row version stays in the claim
# index until VACUUM removes it, and VACUUM cannot while any snapshot older than the claim
# is open anywhere on the server: walked from its start, the index costs each claim
# every job drained since. `p_floor_at` and `p_floor_seq` hold, for the `n`th type asked
# for and priority `p`, at index `(n - 1) * 11 + p + 1`, the (run_at, seq) below which the
# node knows nothing is pending (NULL: walk from the start). A floor is a hint, reset
# from time to time; see `store/postgres/floors.py`. The last row also answers `now()`.
_FLOOR = """
                          AND (j.run_at, j.seq) >= (
                              coalesce(p_floor_at[(caps.n - 1) * 11 + p.priority + 1],
                                       '-infinity'::timestamptz),
                              coalesce(p_floor_seq[(caps.n - 1) * 11 + p.priority + 1], 0))"""

CLAIM_V15: Final = (
    """
CREATE FUNCTION {s}.claim_floored(
    p_types text[], p_caps int[], p_queues text[], p_limit int, p_node text,
    p_lease float8, p_live float8, p_lock_ns text, p_start int,
    p_floor_at timestamptz[], p_floor_seq bigint[])
RETURNS TABLE (o_job {s}.jobs, o_next_due timestamptz, o_limited text[], o_now timestamptz)
LANGUAGE plpgsql
SET enable_bitmapscan = off
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $fn$
"""
    + _LIMITS
    + """    -- Each (type, priority) is one index probe from its floor: eleven short probes a
    -- type, never a walk over what was claimed before (a probe for the type's highest
    -- pending priority would walk back over every job claimed at that priority).
    IF p_queues IS NULL AND NOT EXISTS (SELECT 1 FROM {s}.paused_queues) THEN
        RETURN QUERY
        WITH cand AS (
            SELECT c.* FROM unnest(p_types, v_caps) WITH ORDINALITY AS caps(type, cap, n)
            CROSS JOIN LATERAL (
                SELECT x.* FROM generate_series(10, 0, -1) AS p(priority)
                CROSS JOIN LATERAL (
                    SELECT j.id, j.priority, j.run_at, j.seq FROM {s}.jobs j
                    WHERE j.status = 'pending' AND j.type = caps.type
                      AND j.priority = p.priority AND j.run_at <= now()"""
    + _FLOOR
    + """
                    ORDER BY j.run_at, j.seq
                    LIMIT p_limit
                    FOR UPDATE OF j SKIP LOCKED) x
                LIMIT least(caps.cap, p_limit)) c
            WHERE caps.cap > 0),
"""
    + _TAKE.replace("NULL::text[] FROM", "NULL::text[], NULL::timestamptz FROM")
    + """    ELSE
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
        WITH cand AS (
            SELECT c.* FROM unnest(p_types, v_caps) WITH ORDINALITY AS caps(type, cap, n)
            CROSS JOIN LATERAL (
                SELECT x.* FROM generate_series(10, 0, -1) AS p(priority)
                CROSS JOIN LATERAL (
                    SELECT y.* FROM unnest(v_queues) AS q(queue) CROSS JOIN LATERAL (
                        SELECT j.id, j.priority, j.run_at, j.seq FROM {s}.jobs j
                        WHERE j.status = 'pending' AND j.queue = q.queue
                          AND j.type = caps.type AND j.priority = p.priority
                          AND j.run_at <= now()"""
    + _FLOOR
    + """
                        ORDER BY j.run_at, j.seq
                        LIMIT least(caps.cap, p_limit)
                        FOR UPDATE OF j SKIP LOCKED) y
                    ORDER BY y.run_at, y.seq) x
                LIMIT least(caps.cap, p_limit)) c
            WHERE caps.cap > 0),
"""
    + _TAKE.replace("NULL::text[] FROM", "NULL::text[], NULL::timestamptz FROM")
    + """    END IF;
    -- The last row, with no job: the limited types, now(), and after a short claim the
    -- next scheduled job's due time (one probe per type and priority, from now on).
    GET DIAGNOSTICS v_taken = ROW_COUNT;
    IF v_taken < p_limit THEN
        RETURN QUERY
        SELECT NULL::{s}.jobs, min(x.run_at), v_limited, now()
        FROM unnest(p_types) AS t(type)
        CROSS JOIN generate_series(0, 10) AS p(priority)
        CROSS JOIN LATERAL (
            SELECT j.run_at FROM {s}.jobs j
            WHERE j.status = 'pending' AND j.type = t.type AND j.priority = p.priority
              AND j.run_at > now()
            ORDER BY j.run_at LIMIT 1) x;
    ELSE
        o_job := NULL;
        o_next_due := NULL;
        o_limited := v_limited;
        o_now := now();
        RETURN NEXT;
    END IF;
END
$fn$;
"""
)
