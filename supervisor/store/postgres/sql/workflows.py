"""The PostgreSQL statements of workflows (migration 12's tables and columns).

A step is a row of `jobs` with `workflow_id`, `step_key`, `parent_ids` and, while it
waits, `unfinished` (its parents not done yet); `workflow_edges` holds parent -> child.
A step's parents' results gather in its `parents` column. `STEPS_RELEASE` runs in the
transaction of the parents' completion: each decrement is an `UPDATE` of the child's
row, so nodes completing parents at once take turns on it and exactly one of them sees
the count reach zero and makes it pending. Each is a statement of its own, apart from the
outcome statements it follows, so those stay as they are.

A workflow's current job for a key is its latest (a replay adds a fresh one); its status
is `workflows.workflow_status`, which `sql/flow_counts.py` mirrors to keep, count and list
workflows by status in SQL.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from goqueue.supervisor.common.enums import EventKind
from goqueue.supervisor.store.postgres.sql.counts import COUNTED_ROWS
from goqueue.supervisor.store.postgres.sql.flow_counts import CURRENT, TOUCHED
from goqueue.supervisor.store.postgres.sql.fragments import Sql

_EVENTS = """trail AS (
            INSERT INTO {{s}}.events (job_id, event, at, node, attempt, detail)
            SELECT id, '{event}', now(), %(node)s, attempts, {detail} FROM changed)"""

WORKFLOW_SQL: Final[Mapping[Sql, str]] = MappingProxyType(
    {
        Sql.WORKFLOW_INSERT: """
            INSERT INTO {s}.workflows (id, name, created_at) VALUES (%(id)s, %(name)s, now())
            RETURNING created_at""",
        # Every step in one statement (parameters one array per column, binary): roots
        # pending, the others waiting with their count of parents; then the edges.
        Sql.WORKFLOW_STEPS: f"""
            WITH changed AS (
                INSERT INTO {{s}}.jobs (id, type, queue, payload, priority, status, attempts,
                    max_retries, run_at, timeout_seconds, dedupe_key, unique_key, webhook_url,
                    on_success, on_failure, created_at, updated_at,
                    workflow_id, step_key, parent_ids, parents, unfinished, concurrency_key)
                SELECT t.id, t.type, t.queue, t.payload::json, t.priority,
                    CASE WHEN t.waiting > 0 THEN 'waiting' ELSE 'pending' END, 0,
                    t.max_retries, coalesce(t.run_at, now() + t.delay * interval '1 second'),
                    t.timeout, NULL, NULL, t.webhook_url, t.on_success::json,
                    t.on_failure::json, now(), now(),
                    %(workflow)s::uuid, t.key,
                    string_to_array(nullif(t.pids, ''), ' ')::uuid[],
                    CASE WHEN t.waiting > 0 THEN '{{{{}}}}'::json END,
                    nullif(t.waiting, 0), t.concurrency_key
                FROM unnest(%(id)b::uuid[], %(type)b::text[], %(queue)b::text[],
                    %(payload)b::text[], %(priority)b::int2[], %(max_retries)b::int4[],
                    %(run_at)b::timestamptz[], %(delay)b::float8[], %(timeout)b::float8[],
                    %(webhook_url)b::text[], %(on_success)b::text[], %(on_failure)b::text[],
                    %(key)b::text[], %(pids)b::text[], %(waiting)b::int4[],
                    %(concurrency_key)b::text[])
                    AS t(id, type, queue, payload, priority, max_retries, run_at, delay,
                         timeout, webhook_url, on_success, on_failure, key, pids, waiting,
                         concurrency_key)
                RETURNING *),
            edges AS (
                INSERT INTO {{s}}.workflow_edges (parent, child)
                SELECT * FROM unnest(%(parents)b::uuid[], %(children)b::uuid[])),
            {_EVENTS.format(event=EventKind.ENQUEUED, detail="'workflow ' || %(workflow)s")}
            SELECT {{job}} FROM changed WHERE status = 'pending'""",
        Sql.WORKFLOW_GET: """
            SELECT id, name, created_at, cancelled_at IS NOT NULL
            FROM {s}.workflows WHERE id = ANY (%(ids)s::uuid[])""",
        Sql.WORKFLOW_CURRENT: f"""
            SELECT c.workflow_id, c.step_key, c.id, c.status, j.parent_ids
            FROM {CURRENT.replace("IDS", "%(ids)s::uuid[]")} c JOIN {{s}}.jobs j ON j.id = c.id
            ORDER BY c.workflow_id, c.first""",
        # Newest first: the workflows not touched since the last fold by their kept
        # status, the touched ones by their status now (`sql/flow_counts.py`).
        Sql.WORKFLOW_LIST: f"""
            WITH touched AS {TOUCHED}
            SELECT id FROM (
                SELECT f.id, f.seq FROM {{s}}.workflows f
                WHERE f.status = %(status)s
                  AND f.id NOT IN (SELECT id FROM touched)
                UNION ALL
                SELECT id, seq FROM touched WHERE status = %(status)s) AS listed
            ORDER BY seq DESC LIMIT %(limit)s OFFSET %(offset)s""",
        Sql.WORKFLOW_LIST_ALL: """
            SELECT id FROM {s}.workflows ORDER BY seq DESC LIMIT %(limit)s OFFSET %(offset)s""",
        # Workflows by status: the kept counts, each touched workflow moved from its kept
        # status to its status now; then the steps waiting (from the jobs' counts).
        Sql.WORKFLOW_COUNTS: f"""
            WITH touched AS {TOUCHED}
            SELECT status, sum(n)::bigint FROM (
                SELECT status, n FROM {{s}}.workflow_counts
                UNION ALL SELECT status, n FROM {{s}}.workflow_count_changes
                UNION ALL SELECT kept, -1 FROM touched WHERE kept IS NOT NULL
                UNION ALL SELECT status, 1 FROM touched) AS counted
            GROUP BY status
            UNION ALL
            SELECT NULL, coalesce(sum(n), 0)::bigint FROM {COUNTED_ROWS}
            WHERE status = 'waiting'""",
        # Touched: its status is settled at the next fold (and read as cancelled now).
        Sql.WORKFLOW_CANCEL: """
            WITH cancelled AS (
                UPDATE {s}.workflows SET cancelled_at = now()
                WHERE id = %(id)s AND cancelled_at IS NULL RETURNING id),
            touch AS (INSERT INTO {s}.workflow_touches SELECT id FROM cancelled)
            SELECT id FROM cancelled""",
        # Every unfinished step, running ones too (their leases cleared: the holders are
        # fenced out; the tokens come back to kill the workers).
        Sql.WORKFLOW_CANCEL_STEPS: f"""
            WITH locked AS (
                SELECT id AS lid, lease_token AS ltoken FROM {{s}}.jobs
                WHERE workflow_id = %(id)s
                  AND status IN ('waiting', 'pending', 'claimed', 'running')
                FOR UPDATE),
            changed AS (
                UPDATE {{s}}.jobs j SET status = 'cancelled', finished_at = now(),
                    last_error = %(error)s, unfinished = NULL, updated_at = now(),
                    {{clear_lease}}
                FROM locked l WHERE j.id = l.lid
                RETURNING j.*, l.ltoken, {{hooked_j}}),
            {{outbox}},
            {_EVENTS.format(event=EventKind.CANCELLED, detail="%(error)s")}
            SELECT {{job}}, ltoken FROM changed""",
        # In the completing transaction: the steps these done jobs were parents of get
        # their results and one decrement per parent; those reaching zero are pending.
        Sql.STEPS_RELEASE: """
            WITH done AS (
                SELECT id, step_key, coalesce(result::jsonb, 'null') AS result
                FROM {s}.jobs
                WHERE id = ANY (%(ids)s::uuid[]) AND status = 'done' AND workflow_id IS NOT NULL),
            got AS (
                SELECT e.child, count(*) AS n, jsonb_object_agg(d.step_key, d.result) AS r
                FROM done d JOIN {s}.workflow_edges e ON e.parent = d.id
                GROUP BY e.child),
            changed AS (
                UPDATE {s}.jobs c SET unfinished = nullif(c.unfinished - g.n, 0),
                    parents = (coalesce(c.parents::jsonb, '{{}}') || g.r)::json,
                    status = CASE WHEN c.unfinished <= g.n THEN 'pending' ELSE c.status END,
                    run_at = CASE WHEN c.unfinished <= g.n THEN greatest(c.run_at, now())
                        ELSE c.run_at END,
                    updated_at = now()
                FROM got g WHERE c.id = g.child AND c.status = 'waiting'
                RETURNING c.*)
            SELECT {job} FROM changed WHERE status = 'pending'""",
        # In the dead-lettering (or cancelling) transaction: every waiting step below it.
        Sql.STEPS_CANCEL_BELOW: f"""
            WITH RECURSIVE below(id) AS (
                SELECT child FROM {{s}}.workflow_edges WHERE parent = %(id)s
                UNION SELECT e.child FROM {{s}}.workflow_edges e JOIN below b ON e.parent = b.id),
            changed AS (
                UPDATE {{s}}.jobs SET status = 'cancelled', finished_at = now(),
                    last_error = %(error)s, unfinished = NULL, updated_at = now()
                WHERE id IN (SELECT id FROM below) AND status = 'waiting'
                RETURNING id, attempts, {{hooked}}),
            {{outbox}},
            {_EVENTS.format(event=EventKind.CANCELLED, detail="%(error)s")}
            SELECT count(*) FROM changed""",
        # A replay's fresh job takes the place of the dead one (unless the workflow was
        # cancelled): its step, its parents, its edges, its children's parent ids.
        Sql.STEP_REPLACE: """
            WITH live AS (
                SELECT 1 FROM {s}.workflows WHERE id = %(workflow)s AND cancelled_at IS NULL),
            fresh AS (
                UPDATE {s}.jobs SET workflow_id = %(workflow)s, step_key = %(key)s,
                    parent_ids = %(pids)s::uuid[], parents = %(parents)s
                WHERE id = %(new)s AND EXISTS (SELECT 1 FROM live) RETURNING id),
            down AS (
                UPDATE {s}.workflow_edges SET parent = %(new)s
                WHERE parent = %(old)s AND EXISTS (SELECT 1 FROM fresh) RETURNING child),
            up AS (
                UPDATE {s}.workflow_edges SET child = %(new)s
                WHERE child = %(old)s AND EXISTS (SELECT 1 FROM fresh)),
            kids AS (
                UPDATE {s}.jobs SET parent_ids = array_replace(parent_ids, %(old)s, %(new)s)
                WHERE id IN (SELECT child FROM down))
            SELECT count(*) FROM fresh""",
        # Then the steps the failure cancelled wait again for their parents not done.
        Sql.STEPS_RESUME: f"""
            WITH RECURSIVE below(id) AS (
                SELECT child FROM {{s}}.workflow_edges WHERE parent = %(new)s
                UNION SELECT e.child FROM {{s}}.workflow_edges e JOIN below b ON e.parent = b.id),
            counts AS (
                SELECT b.id, count(*) FILTER (WHERE p.status <> 'done') AS waiting,
                    coalesce(jsonb_object_agg(p.step_key, coalesce(p.result::jsonb, 'null'))
                        FILTER (WHERE p.status = 'done'), '{{{{}}}}') AS r
                FROM below b JOIN {{s}}.workflow_edges e ON e.child = b.id
                JOIN {{s}}.jobs p ON p.id = e.parent
                GROUP BY b.id),
            changed AS (
                UPDATE {{s}}.jobs j SET status = 'waiting', unfinished = c.waiting,
                    parents = c.r::json, finished_at = NULL, last_error = NULL,
                    updated_at = now()
                FROM counts c
                WHERE j.id = c.id AND j.status = 'cancelled' AND c.waiting > 0
                  AND NOT EXISTS (SELECT 1 FROM {{s}}.workflows w
                      WHERE w.id = j.workflow_id AND w.cancelled_at IS NOT NULL)
                RETURNING j.id, j.attempts),
            {_EVENTS.format(event=EventKind.REPLAYED, detail="'waits again for ' || %(new)s")}
            SELECT count(*) FROM changed""",
    }
)
