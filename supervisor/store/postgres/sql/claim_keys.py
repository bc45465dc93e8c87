"""The migration for flow control by key (`common/flow.py`): a job's `concurrency_key`
and `debounce_key`, the nodes' per-key rules, each paced key's TAT, their indexes, and
`claim_leases` (migration 14's) with the keyed walk spliced in.

The claim changes only where keys matter, each splice named below (`KEY_SPLICES`), so
the function reads as migration 14's with them applied:
- it reads the per-key rules each asked-for type has on a live node (the smallest limit,
  the slowest pace; only when some node declares one: a small partial index), and locks
  those types as it locks limited types (one node at a time claims a type with a per-key
  rule: counts and paces hold across nodes), reporting them as limited (so a job of
  theirs ending wakes every node);
- it lists each such type's pending keys by skipping along `jobs_key_due`;
- the type's walk leaves keyed jobs of such a type to `kcand`, which reads each key with
  room from its head (at most its limit less what it holds claimed or running, and the
  starts its pace allows), numbering each key's jobs from what it holds (its turn);
- the pick merges both, by priority, then turn, then run_at and enqueue order, at most
  a type's cap of each type;
- the claim's statement moves each paced key's TAT past the starts it made (`paced`),
  and a short claim's last row names the first held back key's next start when it comes
  before the next scheduled job.
"""

from __future__ import annotations

from typing import Final

from goqueue.supervisor.store.postgres.sql.claim import CLAIM_V14

# The keyed candidates of either branch of the claim: per key with room, its best jobs
# in claim order, numbered from the key's claimed and running jobs (`turn`).
_KCAND: Final = """        kcand AS (
            SELECT kk.type, x.id, x.priority, x.run_at, x.seq,
                b.busy + row_number() OVER (
                    PARTITION BY kk.type, kk.key ORDER BY x.priority DESC, x.run_at, x.seq)
                    - 1 AS turn
            FROM unnest(v_key_types, v_keys, v_key_lims, v_key_step, v_key_burst)
                AS kk(type, key, lim, step, burst)
            JOIN unnest(p_types, v_caps) AS kc(type, cap) ON kc.type = kk.type AND kc.cap > 0
            CROSS JOIN LATERAL (
                SELECT count(*)::int AS busy FROM {s}.jobs r
                WHERE r.status IN ('claimed', 'running') AND r.concurrency_key IS NOT NULL
                  AND r.type = kk.type AND r.concurrency_key = kk.key) b
            CROSS JOIN LATERAL (
                SELECT CASE WHEN kk.step IS NULL THEN p_limit
                    WHEN coalesce(max(p.tat), 0) > v_now THEN 0
                    ELSE least(kk.burst,
                               1 + floor((v_now - coalesce(max(p.tat), 0)) / kk.step))::int
                    END AS starts
                FROM {s}.key_pace p WHERE p.type = kk.type AND p.key = kk.key) r
            CROSS JOIN LATERAL (
                SELECT j.id, j.priority, j.run_at, j.seq FROM {s}.jobs j
                WHERE j.status = 'pending' AND j.concurrency_key IS NOT NULL
                  AND j.type = kk.type AND j.concurrency_key = kk.key AND j.run_at <= now()
                  AND (v_queues IS NULL OR j.queue = ANY (v_queues))
                ORDER BY j.priority DESC, j.run_at, j.seq
                LIMIT greatest(0, least(kk.lim - b.busy, r.starts, kc.cap, p_limit))
                FOR UPDATE OF j SKIP LOCKED) x),
"""

# The pick of either branch: both walks merged, at most each type's cap of each type.
_PICK: Final = """        pick AS (
            SELECT m.id, row_number() OVER (
                    ORDER BY m.priority DESC, m.turn, m.run_at, m.seq) AS n
            FROM (SELECT a.*, row_number() OVER (PARTITION BY a.type
                        ORDER BY a.priority DESC, a.turn, a.run_at, a.seq) AS tn
                  FROM (SELECT type, id, priority, run_at, seq, 0 AS turn FROM cand
                        UNION ALL SELECT * FROM kcand) a) m
            JOIN unnest(p_types, v_caps) AS pc(type, cap) ON pc.type = m.type
            WHERE m.tn <= pc.cap
            ORDER BY m.priority DESC, m.turn, m.run_at, m.seq LIMIT p_limit),
"""

_OLD_PICK: Final = """        pick AS (
            SELECT id, row_number() OVER (ORDER BY priority DESC, run_at, seq) AS n
            FROM cand ORDER BY priority DESC, run_at, seq LIMIT p_limit),
"""

_READ_KEY_LIMITS: Final = """
    -- The per-key rules of the live nodes on each type asked for (the smallest limit,
    -- the slowest pace), and the pending keys of those types (skipping along
    -- jobs_key_due); locked below with the limited types, reported as limited.
    IF EXISTS (SELECT 1 FROM {s}.nodes n WHERE n.key_limits IS NOT NULL) THEN
        SELECT coalesce(array_agg(l.type ORDER BY l.type), '{{}}'),
            coalesce(array_agg(coalesce(l.lim, 2147483647) ORDER BY l.type), '{{}}'),
            coalesce(array_agg(l.step ORDER BY l.type), '{{}}'),
            coalesce(array_agg(l.burst ORDER BY l.type), '{{}}')
        INTO v_key_limited, v_key_limits, v_key_steps, v_key_bursts
        FROM (SELECT e.key AS type, min((e.value ->> 'n')::int) AS lim,
                  max((e.value ->> 'step')::float8) AS step,
                  min((e.value ->> 'burst')::int) AS burst
              FROM {s}.nodes n CROSS JOIN LATERAL jsonb_each(n.key_limits) AS e
              WHERE n.key_limits IS NOT NULL
                AND n.heartbeat_at > now() - p_live * interval '1 second'
                AND e.key = ANY(p_types)
              GROUP BY e.key) l;
        SELECT coalesce(array_agg(kt.type), '{{}}'), coalesce(array_agg(k.key), '{{}}'),
            coalesce(array_agg(kt.lim), '{{}}'), coalesce(array_agg(kt.step), '{{}}'),
            coalesce(array_agg(kt.burst), '{{}}')
        INTO v_key_types, v_keys, v_key_lims, v_key_step, v_key_burst
        FROM unnest(v_key_limited, v_key_limits, v_key_steps, v_key_bursts)
            AS kt(type, lim, step, burst)
        CROSS JOIN LATERAL (
            WITH RECURSIVE k(key) AS (
                SELECT min(h.concurrency_key) FROM {s}.jobs h
                WHERE h.status = 'pending' AND h.concurrency_key IS NOT NULL
                  AND h.type = kt.type
                UNION ALL
                SELECT (SELECT min(h.concurrency_key) FROM {s}.jobs h
                        WHERE h.status = 'pending' AND h.concurrency_key IS NOT NULL
                          AND h.type = kt.type AND h.concurrency_key > k.key)
                FROM k WHERE k.key IS NOT NULL)
            SELECT k.key FROM k WHERE k.key IS NOT NULL) k;
        v_locked := ARRAY(SELECT DISTINCT x FROM unnest(v_limited || v_key_limited) AS x
                          ORDER BY x);
    ELSE
        v_locked := v_limited;
    END IF;
"""

# After the claim: each paced key's TAT moved past the starts it made (GCRA, as
# take_paced_starts moves a type's), in the claim's statement.
_PACED: Final = """        paced AS (
            INSERT INTO {s}.key_pace (type, key, tat)
            SELECT (c.j).type, (c.j).concurrency_key, v_now + count(*) * min(kp.step)
            FROM claimed c JOIN unnest(v_key_limited, v_key_steps) AS kp(type, step)
                ON kp.type = (c.j).type AND kp.step IS NOT NULL
            WHERE (c.j).concurrency_key IS NOT NULL
            GROUP BY 1, 2
            ON CONFLICT (type, key) DO UPDATE SET tat = EXCLUDED.tat)
"""

# A short claim also says when the first key held back by its pace may start again, and
# which types had a key held back (at its limit or paced): each `HELD_MARK` || type, after
# the limited types in the last row's `o_limited` (no type's name holds the mark).
HELD_MARK: Final = "~"
_PACE_DUE: Final = f"""    IF v_taken < p_limit AND cardinality(v_key_types) > 0 THEN
        SELECT to_timestamp(min(p.tat)) INTO v_pace_due
        FROM unnest(v_key_types, v_keys) AS k(type, key)
        JOIN {{s}}.key_pace p ON p.type = k.type AND p.key = k.key
        WHERE p.tat > v_now;
        SELECT coalesce(array_agg(DISTINCT '{HELD_MARK}' || k.type), '{{{{}}}}') INTO v_held
        FROM unnest(v_key_types, v_keys, v_key_lims) AS k(type, key, lim)
        WHERE (SELECT count(*) FROM {{s}}.jobs r
               WHERE r.status IN ('claimed', 'running') AND r.concurrency_key IS NOT NULL
                 AND r.type = k.type AND r.concurrency_key = k.key) >= k.lim
           OR EXISTS (SELECT 1 FROM {{s}}.key_pace p
                      WHERE p.type = k.type AND p.key = k.key AND p.tat > v_now);
    END IF;
"""

# (the text of migration 14's function, the text it becomes[, how many times it is there:
# once unless said]), in order
KEY_SPLICES: Final[tuple[tuple[str, str] | tuple[str, str, int], ...]] = (
    # the function is replaced, its signature and rows unchanged
    ("CREATE FUNCTION {s}.claim_leases(", "CREATE OR REPLACE FUNCTION {s}.claim_leases("),
    # the key-limited types, their keys, and every type locked
    (
        "    v_taken bigint;\n",
        "    v_taken bigint;\n"
        "    v_key_limited text[] := '{{}}';\n    v_key_limits int[];\n"
        "    v_key_steps float8[];\n    v_key_bursts int[];\n"
        "    v_key_types text[] := '{{}}';\n    v_keys text[] := '{{}}';\n"
        "    v_key_lims int[] := '{{}}';\n    v_key_step float8[] := '{{}}';\n"
        "    v_key_burst int[] := '{{}}';\n    v_locked text[];\n"
        "    v_now float8 := extract(epoch FROM now());\n    v_pace_due timestamptz;\n"
        "    v_held text[] := '{{}}';\n",
    ),
    (
        "    IF cardinality(v_limited) > 0 THEN\n",
        _READ_KEY_LIMITS + "    IF cardinality(v_locked) > 0 THEN\n",
    ),
    (
        "        FOREACH v_type IN ARRAY v_limited LOOP\n",
        "        FOREACH v_type IN ARRAY v_locked LOOP\n",
    ),
    # both walks of the types: the type in each row, keyed jobs of key-limited types left out
    (
        "            SELECT c.* FROM unnest(p_types, v_caps)",
        "            SELECT caps.type, c.* FROM unnest(p_types, v_caps)",
        2,
    ),
    (
        "                      AND j.priority = p.priority AND j.run_at <= now()\n",
        "                      AND j.priority = p.priority AND j.run_at <= now()\n"
        "                      AND (j.concurrency_key IS NULL\n"
        "                           OR NOT caps.type = ANY (v_key_limited))\n",
    ),
    (
        "                          AND j.run_at <= now()\n",
        "                          AND j.run_at <= now()\n"
        "                          AND (j.concurrency_key IS NULL\n"
        "                               OR NOT caps.type = ANY (v_key_limited))\n",
    ),
    # both picks merge the keyed candidates in
    (
        "            WHERE caps.cap > 0),\n" + _OLD_PICK,
        "            WHERE caps.cap > 0),\n" + _KCAND + _PICK,
        2,
    ),
    # the paced keys' TATs move on with the claim
    (
        "            RETURNING j)\n        SELECT claimed.j, NULL::timestamptz",
        "            RETURNING j),\n" + _PACED + "        SELECT claimed.j, NULL::timestamptz",
        2,
    ),
    # a short claim says when a held back key's pace is due, if that comes first
    (
        "    IF v_taken < p_limit THEN\n        RETURN QUERY\n",
        _PACE_DUE + "    IF v_taken < p_limit THEN\n        RETURN QUERY\n",
    ),
    # the key-limited types reported as limited
    (
        "        SELECT NULL::{s}.jobs, min(x.run_at), v_limited\n",
        "        SELECT NULL::{s}.jobs, least(min(x.run_at), v_pace_due), v_locked || v_held\n",
    ),
    ("        o_limited := v_limited;\n", "        o_limited := v_locked;\n"),
)


def _keyed_claim() -> str:
    """Migration 14's function text with `KEY_SPLICES` applied (each must apply)."""
    start = CLAIM_V14.index("CREATE FUNCTION {s}.claim_leases(")
    text = CLAIM_V14[start:]
    for old, new, *times in KEY_SPLICES:
        if text.count(old) != (times[0] if times else 1):
            raise AssertionError(f"claim_leases has not {times or 1} {old!r} to splice into")
        text = text.replace(old, new)
    return text


FLOW_KEYS: Final = """
-- Flow control by key. A job's key (immutable); the per-key limits a node declares by
-- type (NULL when none: the claim probes `nodes_key_limiting`).
ALTER TABLE {s}.jobs ADD COLUMN concurrency_key text;
ALTER TABLE {s}.nodes ADD COLUMN key_limits jsonb;
CREATE INDEX nodes_key_limiting ON {s}.nodes (node_id) WHERE key_limits IS NOT NULL;
-- A key-limited type's pending keys (skipped along) and each key's head in claim order;
-- a key's claimed and running jobs; a key's jobs listed (GET /jobs?concurrency_key=).
CREATE INDEX jobs_key_due ON {s}.jobs (type, concurrency_key, priority DESC, run_at, seq)
    WHERE status = 'pending' AND concurrency_key IS NOT NULL;
CREATE INDEX jobs_key_busy ON {s}.jobs (type, concurrency_key)
    WHERE status IN ('claimed', 'running') AND concurrency_key IS NOT NULL;
CREATE INDEX jobs_key ON {s}.jobs (concurrency_key, seq) WHERE concurrency_key IS NOT NULL;
-- Debounce: the job of a type and debounce key not started yet, to be replaced.
ALTER TABLE {s}.jobs ADD COLUMN debounce_key text;
CREATE INDEX jobs_debounce ON {s}.jobs (type, debounce_key)
    WHERE status = 'pending' AND debounce_key IS NOT NULL;
-- Each paced key's theoretical arrival time (GCRA, as rate_pace holds a type's), in
-- seconds since the epoch on the database's clock.
CREATE TABLE {s}.key_pace (
    type text NOT NULL,
    key  text NOT NULL,
    tat  float8 NOT NULL,
    PRIMARY KEY (type, key)
);
""" + _keyed_claim()
