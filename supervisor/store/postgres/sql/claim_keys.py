"""The migration for flow control by key (`common/flow.py`): a job's `concurrency_key`
and `debounce_key`, the nodes' per-key rules, each paced key's TAT, each key-ruled type's
cursor, their indexes, and `claim_floored` (migration 15's) with the keyed walk spliced in.

The claim changes only where keys matter, each splice named below (`KEY_SPLICES`), so
the function reads as migration 15's with them applied:
- before the locks, it reads the per-key rules each asked-for type has on a live node
  (the smallest limit, the slowest pace; only when some node declares one: a small
  partial index), and locks those types as it locks limited types (one node at a time
  claims a type with a per-key rule: counts and paces hold across nodes), reporting them
  as limited (so a job of theirs ending wakes every node);
- after the locks, it takes each such type's window of keys with room (`KEY_WINDOW` at
  most): skipping along `jobs_key_due` from the type's cursor round to it, counting each
  key's claimed and running jobs and reading its pace, keeping the keys that may start
  a job (so a claim costs a window of keys, not every key with jobs pending);
- the type's walk leaves keyed jobs of such a type to `kcand`, which reads each window
  key's room of jobs from its head, numbering them from what the key holds (its turn);
- the pick merges both, by priority, then turn, then the key's place in the window,
  then run_at and enqueue order, at most a type's cap of each type;
- the claim's statement moves each paced key's TAT past the starts it made (`paced`)
  and the type's cursor to the last key it took (`turned`: keys take turns across
  claims), and a short claim's last row names the first held back key's next start when
  it comes before the next scheduled job, and the types with a key held back.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from goqueue.supervisor.store.postgres.sql.claim import CLAIM_V15

# The keyed candidates of either branch of the claim: each key of the window (`KEY_WINDOW`)
# its room's best jobs in claim order, numbered from the key's claimed and running jobs
# (`turn`), with the key's place in the window (`ord`).
_KCAND: Final = """        kcand AS (
            SELECT kk.type, x.id, x.priority, x.run_at, x.seq,
                kk.busy + row_number() OVER (
                    PARTITION BY kk.type, kk.key ORDER BY x.priority DESC, x.run_at, x.seq)
                    - 1 AS turn,
                kk.ord
            FROM unnest(v_key_types, v_keys, v_key_room, v_key_busy)
                WITH ORDINALITY AS kk(type, key, room, busy, ord)
            JOIN unnest(p_types, v_caps) AS kc(type, cap) ON kc.type = kk.type AND kc.cap > 0
            CROSS JOIN LATERAL (
                SELECT j.id, j.priority, j.run_at, j.seq FROM {s}.jobs j
                WHERE j.status = 'pending' AND j.concurrency_key IS NOT NULL
                  AND j.type = kk.type AND j.concurrency_key = kk.key AND j.run_at <= now()
                  AND (v_queues IS NULL OR j.queue = ANY (v_queues))
                ORDER BY j.priority DESC, j.run_at, j.seq
                LIMIT least(kk.room, kc.cap, p_limit)
                FOR UPDATE OF j SKIP LOCKED) x),
"""

# The pick of either branch: both walks merged, at most each type's cap of each type, by
# priority, then turn, then the key's place in the window (keys in turn), then age.
_PICK: Final = """        pick AS (
            SELECT m.id, row_number() OVER (
                    ORDER BY m.priority DESC, m.turn, m.ord, m.run_at, m.seq) AS n
            FROM (SELECT a.*, row_number() OVER (PARTITION BY a.type
                        ORDER BY a.priority DESC, a.turn, a.ord, a.run_at, a.seq) AS tn
                  FROM (SELECT type, id, priority, run_at, seq, 0 AS turn, 0 AS ord FROM cand
                        UNION ALL SELECT * FROM kcand) a) m
            JOIN unnest(p_types, v_caps) AS pc(type, cap) ON pc.type = m.type
            WHERE m.tn <= pc.cap
            ORDER BY m.priority DESC, m.turn, m.ord, m.run_at, m.seq LIMIT p_limit),
"""

_OLD_PICK: Final = """        pick AS (
            SELECT id, row_number() OVER (ORDER BY priority DESC, run_at, seq) AS n
            FROM cand ORDER BY priority DESC, run_at, seq LIMIT p_limit),
"""

_READ_KEY_LIMITS: Final = """
    -- The per-key rules of the live nodes on each type asked for (the smallest limit,
    -- the slowest pace): those types are locked below with the limited ones, and
    -- reported as limited.
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
        v_locked := ARRAY(SELECT DISTINCT x FROM unnest(v_limited || v_key_limited) AS x
                          ORDER BY x);
    ELSE
        v_locked := v_limited;
    END IF;
"""

# How many keys with room a claim of `p_limit` jobs looks at, at most, per type: each key
# costs a few index probes, so a claim walks a window of keys, not all of them.
KEY_WINDOW: Final = "2 * p_limit + 8"

# After the locks: the window of each key-ruled type's keys with room (`v_keys`), in
# turn: the pending keys after the type's cursor (the last key a claim took), then from
# the first one round to it, skipping along jobs_key_due; a key's room is its limit less
# its claimed and running jobs, and the starts its pace allows.
_KEY_WINDOW: Final = f"""    IF cardinality(v_key_limited) > 0 THEN
        SELECT coalesce(array_agg(w.type ORDER BY w.t, w.n), '{{{{}}}}'),
            coalesce(array_agg(w.key ORDER BY w.t, w.n), '{{{{}}}}'),
            coalesce(array_agg(w.room ORDER BY w.t, w.n), '{{{{}}}}'),
            coalesce(array_agg(w.busy ORDER BY w.t, w.n), '{{{{}}}}')
        INTO v_key_types, v_keys, v_key_room, v_key_busy
        FROM unnest(v_key_limited, v_key_limits, v_key_steps, v_key_bursts)
            WITH ORDINALITY AS kt(type, lim, step, burst, t)
        JOIN unnest(p_types, v_caps) AS kc(type, cap) ON kc.type = kt.type AND kc.cap > 0
        CROSS JOIN LATERAL (
            SELECT kt.type, kt.t, k.n, k.key, least(kt.lim - b.busy, r.starts) AS room, b.busy
            FROM (
                WITH RECURSIVE cur AS (
                    SELECT coalesce((SELECT c.key FROM {{s}}.key_cursor c
                                     WHERE c.type = kt.type), '') AS key),
                after(key, n) AS (
                    SELECT min(h.concurrency_key), 1 FROM {{s}}.jobs h, cur
                    WHERE h.status = 'pending' AND h.concurrency_key IS NOT NULL
                      AND h.type = kt.type AND h.concurrency_key > cur.key
                    UNION ALL
                    SELECT (SELECT min(h.concurrency_key) FROM {{s}}.jobs h
                            WHERE h.status = 'pending' AND h.concurrency_key IS NOT NULL
                              AND h.type = kt.type AND h.concurrency_key > after.key),
                        after.n + 1
                    FROM after WHERE after.key IS NOT NULL),
                upto(key, n) AS (
                    SELECT min(h.concurrency_key), 1000000000 FROM {{s}}.jobs h, cur
                    WHERE h.status = 'pending' AND h.concurrency_key IS NOT NULL
                      AND h.type = kt.type AND h.concurrency_key <= cur.key
                    UNION ALL
                    SELECT (SELECT min(h.concurrency_key) FROM {{s}}.jobs h, cur
                            WHERE h.status = 'pending' AND h.concurrency_key IS NOT NULL
                              AND h.type = kt.type AND h.concurrency_key > upto.key
                              AND h.concurrency_key <= cur.key),
                        upto.n + 1
                    FROM upto WHERE upto.key IS NOT NULL)
                SELECT after.key, after.n FROM after WHERE after.key IS NOT NULL
                UNION ALL
                SELECT upto.key, upto.n FROM upto WHERE upto.key IS NOT NULL) k
            CROSS JOIN LATERAL (
                SELECT count(*)::int AS busy FROM {{s}}.jobs r
                WHERE r.status IN ('claimed', 'running') AND r.concurrency_key IS NOT NULL
                  AND r.type = kt.type AND r.concurrency_key = k.key) b
            CROSS JOIN LATERAL (
                SELECT CASE WHEN kt.step IS NULL THEN p_limit
                    WHEN coalesce(max(p.tat), 0) > v_now THEN 0
                    ELSE least(kt.burst,
                               1 + floor((v_now - coalesce(max(p.tat), 0)) / kt.step))::int
                    END AS starts
                FROM {{s}}.key_pace p WHERE p.type = kt.type AND p.key = k.key) r
            WHERE least(kt.lim - b.busy, r.starts) > 0
            LIMIT least(kc.cap, {KEY_WINDOW})) w;
    END IF;
"""

# After the claim: each paced key's TAT moved past the starts it made (GCRA, as
# take_paced_starts moves a type's), and each key-ruled type's cursor to the last key of
# its window the claim took jobs of (the next claim's window starts after it), in the
# claim's statement.
_PACED: Final = """        paced AS (
            INSERT INTO {s}.key_pace (type, key, tat)
            SELECT (c.j).type, (c.j).concurrency_key, v_now + count(*) * min(kp.step)
            FROM claimed c JOIN unnest(v_key_limited, v_key_steps) AS kp(type, step)
                ON kp.type = (c.j).type AND kp.step IS NOT NULL
            WHERE (c.j).concurrency_key IS NOT NULL
            GROUP BY 1, 2
            ON CONFLICT (type, key) DO UPDATE SET tat = EXCLUDED.tat),
        turned AS (
            INSERT INTO {s}.key_cursor (type, key)
            SELECT DISTINCT ON (w.type) w.type, w.key
            FROM claimed c JOIN unnest(v_key_types, v_keys) WITH ORDINALITY AS w(type, key, n)
                ON w.type = (c.j).type AND w.key = (c.j).concurrency_key
            ORDER BY w.type, w.n DESC
            ON CONFLICT (type) DO UPDATE SET key = EXCLUDED.key)
"""

# A short claim also says when the first key held back by its pace may start again, and
# which types had a key held back (at its limit or paced, with due jobs): each
# `HELD_MARK` || type, after the limited types in the last row's `o_limited` (no type's
# name holds the mark).
HELD_MARK: Final = "~"
_WAITING: Final = """EXISTS (SELECT 1 FROM {s}.jobs w
                    WHERE w.status = 'pending' AND w.concurrency_key IS NOT NULL
                      AND w.type = kt.type AND w.concurrency_key = {key}
                      AND w.run_at <= now())"""
_PACE_DUE: Final = f"""    IF v_taken < p_limit AND cardinality(v_key_limited) > 0 THEN
        SELECT to_timestamp(min(d.tat)) INTO v_pace_due
        FROM unnest(v_key_limited) AS kt(type) CROSS JOIN LATERAL (
            SELECT p.tat FROM {{s}}.key_pace p
            WHERE p.type = kt.type AND p.tat > v_now
              AND {_WAITING.format(s="{s}", key="p.key")}
            ORDER BY p.tat LIMIT 1) d;
        SELECT coalesce(array_agg('{HELD_MARK}' || kt.type), '{{{{}}}}') INTO v_held
        FROM unnest(v_key_limited, v_key_limits) AS kt(type, lim)
        WHERE EXISTS (
                SELECT 1 FROM {{s}}.jobs r
                WHERE r.status IN ('claimed', 'running') AND r.concurrency_key IS NOT NULL
                  AND r.type = kt.type
                GROUP BY r.concurrency_key
                HAVING count(*) >= kt.lim
                   AND {_WAITING.format(s="{s}", key="r.concurrency_key")})
           OR EXISTS (
                SELECT 1 FROM {{s}}.key_pace p
                WHERE p.type = kt.type AND p.tat > v_now
                  AND {_WAITING.format(s="{s}", key="p.key")});
    END IF;
"""

# The comment that opens migration 15's walks of the types.
_WALKS: Final = (
    "    -- Each (type, priority) is one index probe from its floor: eleven short probes a\n"
)

# (the text of migration 15's function, the text it becomes[, how many times it is there:
# once unless said]), in order
KEY_SPLICES: Final[tuple[tuple[str, str] | tuple[str, str, int], ...]] = (
    # the function is replaced, its signature and rows unchanged
    ("CREATE FUNCTION {s}.claim_floored(", "CREATE OR REPLACE FUNCTION {s}.claim_floored("),
    # the key-limited types, their keys, and every type locked
    (
        "    v_taken bigint;\n",
        "    v_taken bigint;\n"
        "    v_key_limited text[] := '{{}}';\n    v_key_limits int[];\n"
        "    v_key_steps float8[];\n    v_key_bursts int[];\n"
        "    v_key_types text[] := '{{}}';\n    v_keys text[] := '{{}}';\n"
        "    v_key_room int[] := '{{}}';\n    v_key_busy int[] := '{{}}';\n"
        "    v_locked text[];\n"
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
    # after the locks: each key-ruled type's window of keys with room
    (_WALKS, _KEY_WINDOW + _WALKS),
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
        "        SELECT NULL::{s}.jobs, min(x.run_at), v_limited, now()\n",
        "        SELECT NULL::{s}.jobs, least(min(x.run_at), v_pace_due), v_locked || v_held,"
        " now()\n",
    ),
    ("        o_limited := v_limited;\n", "        o_limited := v_locked;\n"),
)


def spliced(text: str, splices: Iterable[tuple[str, str] | tuple[str, str, int]], what: str) -> str:
    """`text` with each (old, new[, how many times old is there: once unless said])
    applied in order; each must apply exactly so (the frozen text it splices into did
    not change under it)."""
    for old, new, *times in splices:
        if text.count(old) != (times[0] if times else 1):
            raise AssertionError(f"{what} has not {times or 1} {old!r} to splice into")
        text = text.replace(old, new)
    return text


def _keyed_claim() -> str:
    """Migration 15's function text with `KEY_SPLICES` applied (each must apply)."""
    start = CLAIM_V15.index("CREATE FUNCTION {s}.claim_floored(")
    return spliced(CLAIM_V15[start:], KEY_SPLICES, "claim_floored")


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
-- Where each type with a per-key rule takes keys up again: after the last key a claim
-- took jobs of (keys take turns across claims).
CREATE TABLE {s}.key_cursor (
    type text PRIMARY KEY,
    key  text NOT NULL
);
-- Each paced key's theoretical arrival time (GCRA, as rate_pace holds a type's), in
-- seconds since the epoch on the database's clock.
CREATE TABLE {s}.key_pace (
    type text NOT NULL,
    key  text NOT NULL,
    tat  float8 NOT NULL,
    PRIMARY KEY (type, key)
);
CREATE INDEX key_pace_due ON {s}.key_pace (type, tat);
""" + _keyed_claim()


# Migration 17: the window's first key after the cursor, and each key up to it, found by
# one index probe each, and only keys with a job due in a queue served. Migration 16
# joined the cursor to the jobs, so the planner could not bound the index scan by it:
# each claim read every pending job of the type's keys. Here the cursor is an outer value
# of each probe, as the walk's next step always was.
_WINDOW_PROBES: Final[tuple[tuple[str, str], ...]] = (
    (
        """                    SELECT min(h.concurrency_key), 1 FROM {s}.jobs h, cur
                    WHERE h.status = 'pending' AND h.concurrency_key IS NOT NULL
                      AND h.type = kt.type AND h.concurrency_key > cur.key
""",
        """                    SELECT (SELECT min(h.concurrency_key) FROM {s}.jobs h
                            WHERE h.status = 'pending' AND h.concurrency_key IS NOT NULL
                              AND h.type = kt.type AND h.concurrency_key > cur.key),
                        1
                    FROM cur
""",
    ),
    (
        """                    SELECT min(h.concurrency_key), 1000000000 FROM {s}.jobs h, cur
                    WHERE h.status = 'pending' AND h.concurrency_key IS NOT NULL
                      AND h.type = kt.type AND h.concurrency_key <= cur.key
""",
        """                    SELECT (SELECT min(h.concurrency_key) FROM {s}.jobs h
                            WHERE h.status = 'pending' AND h.concurrency_key IS NOT NULL
                              AND h.type = kt.type AND h.concurrency_key <= cur.key),
                        1000000000
                    FROM cur
""",
    ),
    (
        """                    SELECT (SELECT min(h.concurrency_key) FROM {s}.jobs h, cur
                            WHERE h.status = 'pending' AND h.concurrency_key IS NOT NULL
                              AND h.type = kt.type AND h.concurrency_key > upto.key
                              AND h.concurrency_key <= cur.key),
                        upto.n + 1
                    FROM upto WHERE upto.key IS NOT NULL)""",
        """                    SELECT (SELECT min(h.concurrency_key) FROM {s}.jobs h
                            WHERE h.status = 'pending' AND h.concurrency_key IS NOT NULL
                              AND h.type = kt.type AND h.concurrency_key > upto.key
                              AND h.concurrency_key <= cur.key),
                        upto.n + 1
                    FROM upto, cur WHERE upto.key IS NOT NULL)""",
    ),
    # a key counts in the window only with a job due in a queue the claim serves: keys
    # whose jobs are all later, or in paused queues, never fill it (and starve the rest);
    # read along the key's own index (its order), whatever the planner guesses
    (
        """            WHERE least(kt.lim - b.busy, r.starts) > 0
""",
        """            WHERE least(kt.lim - b.busy, r.starts) > 0
              AND EXISTS (SELECT 1 FROM {s}.jobs d
                    WHERE d.status = 'pending' AND d.concurrency_key IS NOT NULL
                      AND d.type = kt.type AND d.concurrency_key = k.key
                      AND d.run_at <= now()
                      AND (p_queues IS NULL OR d.queue = ANY (p_queues))
                      AND NOT EXISTS (SELECT 1 FROM {s}.paused_queues pq
                                      WHERE pq.queue = d.queue)
                    ORDER BY d.priority DESC, d.run_at, d.seq
                    LIMIT 1 OFFSET 0)
""",
    ),
)


# And a short claim's test for a held back key's due jobs is a probe per key held back:
# as a plain EXISTS the planner, misled by a table never analyzed, hashed every due job
# of the type instead (an OFFSET keeps the subquery as it is written).
_WAITING_END: Final = "                      AND w.run_at <= now())"
_WAITING_PROBE: Final = "                      AND w.run_at <= now()\n                    OFFSET 0)"


# And every type's keys take turns, not only a key-ruled type's: the types asked for with
# a pending keyed job (one probe each) are walked key by key, those without a rule with
# no limit and no pace and without the lock (two nodes may give a key a turn each).
# Their unkeyed walk leaves their keyed jobs to the keys' walk, as a key-ruled type's.
_TURNS_FOR_EVERY_TYPE: Final[tuple[tuple[str, str, int], ...]] = (
    ("    v_held text[] := '{{}}';\n", "    v_held text[] := '{{}}';\n    v_turned text[];\n", 1),
    (
        "    IF cardinality(v_key_limited) > 0 THEN\n        SELECT coalesce(array_agg(w.type",
        """    -- The types asked for with a pending keyed job: their keys take turns.
    v_turned := ARRAY(
        SELECT t.type FROM unnest(p_types) AS t(type)
        WHERE EXISTS (SELECT 1 FROM {s}.jobs h
                      WHERE h.status = 'pending' AND h.concurrency_key IS NOT NULL
                        AND h.type = t.type
                      ORDER BY h.concurrency_key LIMIT 1 OFFSET 0));
    IF cardinality(v_turned) > 0 THEN
        SELECT coalesce(array_agg(w.type""",
        1,
    ),
    (
        """        FROM unnest(v_key_limited, v_key_limits, v_key_steps, v_key_bursts)
            WITH ORDINALITY AS kt(type, lim, step, burst, t)
""",
        """        FROM (SELECT u.type, r.lim, r.step, r.burst, u.t
              FROM unnest(v_turned) WITH ORDINALITY AS u(type, t)
              LEFT JOIN unnest(v_key_limited, v_key_limits, v_key_steps, v_key_bursts)
                  AS r(type, lim, step, burst) ON r.type = u.type) kt
""",
        1,
    ),
    (
        "NOT caps.type = ANY (v_key_limited))",
        "NOT caps.type = ANY (v_key_limited || v_turned))",
        2,
    ),
)


def _probed() -> str:
    """Migration 16's function text with its window's probes bounded by the cursor, its
    held back keys probed one by one, and every type's keys taking turns."""
    window = spliced(_KEY_WINDOW, _WINDOW_PROBES, "the key window")
    pace_due = spliced(_PACE_DUE, [(_WAITING_END, _WAITING_PROBE, 3)], "the held keys' test")
    text = spliced(_keyed_claim(), [(_KEY_WINDOW, window), (_PACE_DUE, pace_due)], "claim_floored")
    return spliced(text, _TURNS_FOR_EVERY_TYPE, "claim_floored")


KEY_PROBES: Final = _probed()
