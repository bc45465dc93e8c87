"""The PostgreSQL store's read statements: jobs, events, counts, dead letters and what
the dashboard shows. None of them changes a row. `statements.TEMPLATES` merges them with
the statements that do, into the one table `Statements` formats.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from goqueue.supervisor.store.base import RUN_TIMES_SAMPLE, SCHEDULE_WALK
from goqueue.supervisor.store.postgres.sql.counts import COUNTED_ROWS
from goqueue.supervisor.store.postgres.sql.fragments import Sql
from goqueue.supervisor.store.postgres.sql.tallies import DEAD_GROUP_TALLY, DEAD_TALLY

# The pending jobs' (queue, type, priority) groups as the counts kept have them, each with
# its oldest pending job's run_at: one probe along `jobs_claim_queue` per group.
_PENDING_GROUPS: Final = f"""groups AS MATERIALIZED (
                SELECT c.queue, c.type, c.priority, c.n, o.run_at AS oldest
                FROM (SELECT queue, type, priority, sum(n)::bigint AS n FROM {COUNTED_ROWS}
                      WHERE status = 'pending' GROUP BY queue, type, priority
                      HAVING sum(n) > 0) AS c
                LEFT JOIN LATERAL (
                    SELECT j.run_at FROM {{s}}.jobs j
                    WHERE j.status = 'pending' AND j.queue = c.queue AND j.type = c.type
                      AND j.priority = c.priority
                    ORDER BY j.run_at LIMIT 1) AS o ON true)"""

# A group's pending jobs, as `groups` names it (`{s}` left for the schema).
_GROUP_JOBS: Final = """{s}.jobs j
                    WHERE j.status = 'pending' AND j.queue = groups.queue
                      AND j.type = groups.type AND j.priority = groups.priority"""

READS: Final[Mapping[Sql, str]] = MappingProxyType(
    {
        Sql.GET: "SELECT {job} FROM {s}.jobs WHERE id = %(id)s",
        # `{where}`: empty here; `Statements.list_jobs` has a variant per filter.
        Sql.LIST_JOBS: """
            SELECT {job} FROM {s}.jobs {where}
            ORDER BY created_at DESC, seq DESC LIMIT %(limit)s OFFSET %(offset)s""",
        Sql.COUNT_JOBS: "SELECT count(*) FROM {s}.jobs {where}",
        # The same, for filters on the counts' own columns (type, status, queue) only.
        Sql.COUNT_COUNTED: f"SELECT coalesce(sum(n), 0)::bigint FROM {COUNTED_ROWS} {{where}}",
        # Counts come from the counts kept as jobs change (`sql/counts.py`), never from a
        # pass over the jobs: they cost the same however many finished jobs are kept.
        Sql.COUNTS: f"""
            SELECT status, sum(n)::bigint FROM {COUNTED_ROWS}
            GROUP BY status HAVING sum(n) > 0""",
        Sql.DEPTH: f"""
            SELECT queue, priority, sum(n)::bigint FROM {COUNTED_ROWS}
            WHERE status = 'pending' GROUP BY queue, priority HAVING sum(n) > 0""",
        Sql.QUEUE_COUNTS: f"""
            SELECT status, sum(n)::bigint FROM {COUNTED_ROWS}
            WHERE queue = %(queue)s GROUP BY status HAVING sum(n) > 0""",
        Sql.QUEUE_DEPTH: f"""
            SELECT priority, sum(n)::bigint FROM {COUNTED_ROWS}
            WHERE queue = %(queue)s AND status = 'pending' GROUP BY priority
            HAVING sum(n) > 0""",
        Sql.IS_PAUSED: """
            SELECT EXISTS (SELECT 1 FROM {s}.paused_queues WHERE queue = %(queue)s)""",
        # Rows (kind, queue, priority, n, seconds): 'depth' (queue, priority, n) for the
        # `top` deepest queues; 'all' (priority, n) over every queue; 'queues' (n queues);
        # 'wait' (queue, seconds its longest-waiting due job has waited) for the top queues;
        # 'other' (n other queues, their longest wait); 'dead' (n dead letters). A few
        # hundred rows however many queues there are: a scrape never parses one per queue.
        # Depths come from the counts kept, waits from one probe per group: it costs the
        # same however deep the queues are.
        Sql.QUEUE_DEPTHS: f"""
            WITH {_PENDING_GROUPS},
            per_queue AS MATERIALIZED (
                SELECT queue, sum(n) AS n, extract(epoch FROM
                    now() - min(oldest) FILTER (WHERE oldest <= now()))::float8 AS age
                FROM groups GROUP BY queue),
            top AS MATERIALIZED (
                SELECT queue FROM per_queue ORDER BY n DESC, queue LIMIT %(top)s)
            SELECT 'depth', queue, priority, sum(n)::bigint, NULL::float8 FROM groups
            WHERE queue IN (SELECT queue FROM top)
            GROUP BY queue, priority
            UNION ALL
            SELECT 'all', NULL, priority, sum(n)::bigint, NULL FROM groups GROUP BY priority
            UNION ALL
            SELECT 'queues', NULL, NULL, count(*), NULL FROM per_queue
            UNION ALL
            SELECT 'wait', queue, NULL, NULL, coalesce(greatest(age, 0), 0) FROM per_queue
            WHERE queue IN (SELECT queue FROM top)
            UNION ALL
            SELECT 'other', NULL, NULL, count(*), coalesce(greatest(max(age), 0), 0)
            FROM per_queue WHERE queue NOT IN (SELECT queue FROM top)
            UNION ALL
            SELECT 'dead', NULL, NULL, {DEAD_TALLY}, NULL""",
        # From the counts kept: a new queue name costs no walk over a deep backlog.
        Sql.QUEUE_NAMES: f"""
            (SELECT queue FROM {COUNTED_ROWS} WHERE status = 'pending'
             GROUP BY queue HAVING sum(n) > 0 LIMIT %(limit)s)
            UNION SELECT queue FROM {{s}}.paused_queues""",
        Sql.EVENTS: """
            SELECT job_id, event, at, node, attempt, detail, traceback FROM {s}.events
            WHERE job_id = %(id)s ORDER BY at, id""",
        Sql.DEAD_COUNT: f"SELECT {DEAD_TALLY}",
        Sql.LIST_DEAD: """
            SELECT id, job_id, job, errors, created_at FROM {s}.dead_letters {dead_where}
            ORDER BY created_at DESC, seq DESC LIMIT %(limit)s OFFSET %(offset)s""",
        # By its own id, else by its job's (a job has at most one letter).
        Sql.GET_DEAD: """
            SELECT id, job_id, job, errors, created_at FROM {s}.dead_letters
            WHERE id = %(id)s OR job_id = %(id)s ORDER BY id = %(id)s DESC LIMIT 1""",
        Sql.COUNT_DEAD_MATCHING: "SELECT count(*) FROM {s}.dead_letters {dead_where}",
        # Filtered by queue or type alone: from the tallies of the groups (no letter read).
        Sql.COUNT_DEAD_GROUPED: f"SELECT {DEAD_GROUP_TALLY}",
        # Per (queue, priority): pending, scheduled for later, the oldest due job's run_at
        # and its wait; from the counts kept and, per group, a probe for its oldest job.
        # Its jobs for later are counted by walking the shallower side of `now()`: up to
        # SCHEDULE_WALK jobs for later, else up to as many due ones (the rest are for
        # later: the kept count and the walk share the statement's snapshot); only a
        # group deep on both sides is walked whole. A deep backlog or a deep schedule
        # costs a short walk.
        Sql.QUEUE_PENDING: f"""
            WITH {_PENDING_GROUPS}
            SELECT queue, priority, sum(n)::bigint, sum(later)::bigint,
                min(oldest) FILTER (WHERE oldest <= now()),
                extract(epoch FROM now() - min(oldest) FILTER (WHERE oldest <= now()))::float8
            FROM groups CROSS JOIN LATERAL (
                SELECT count(*) AS walked FROM (
                    SELECT 1 FROM {_GROUP_JOBS} AND j.run_at > now() LIMIT {SCHEDULE_WALK}
                ) AS w) AS first
            CROSS JOIN LATERAL (
                SELECT CASE WHEN first.walked < {SCHEDULE_WALK} THEN first.walked ELSE (
                    SELECT CASE WHEN due.walked < {SCHEDULE_WALK} THEN groups.n - due.walked
                        ELSE (SELECT count(*) FROM {_GROUP_JOBS} AND j.run_at > now()) END
                    FROM (SELECT count(*) AS walked FROM (
                        SELECT 1 FROM {_GROUP_JOBS} AND j.run_at <= now() LIMIT {SCHEDULE_WALK}
                    ) AS w) AS due) END AS later
                ) AS scheduled
            GROUP BY queue, priority""",
        Sql.QUEUE_RUNNING: f"""
            SELECT queue, sum(n)::bigint FROM {COUNTED_ROWS}
            WHERE status = 'running' GROUP BY queue HAVING sum(n) > 0""",
        Sql.PAUSED: "SELECT queue FROM {s}.paused_queues",
        Sql.NODES: """
            SELECT node_id, started_at, heartbeat_at,
                heartbeat_at > now() - %(live)s * interval '1 second', limits, report
            FROM {s}.nodes WHERE heartbeat_at > now() - interval '1 hour' ORDER BY node_id""",
        # Per-type stats: the counts kept, and the run times of the latest finished jobs
        # (`RUN_TIMES_SAMPLE`, walked newest first along `jobs_finished`).
        Sql.TYPE_COUNTS: f"""
            SELECT type, status, sum(n)::bigint FROM {COUNTED_ROWS}
            GROUP BY type, status HAVING sum(n) > 0""",
        Sql.TYPE_RUN_TIMES: f"""
            SELECT type,
                percentile_cont(0.5) WITHIN GROUP (ORDER BY seconds),
                percentile_cont(0.95) WITHIN GROUP (ORDER BY seconds)
            FROM (
                SELECT type, extract(epoch FROM finished_at - started_at)::float8 AS seconds
                FROM {{s}}.jobs
                WHERE status IN ('done', 'failed') AND started_at IS NOT NULL
                ORDER BY finished_at DESC LIMIT {RUN_TIMES_SAMPLE}) AS latest
            GROUP BY type""",
        Sql.JOB_BRIEFS: """
            SELECT id, type, queue, priority, status, attempts, max_retries, run_at,
                created_at, started_at, finished_at, updated_at, parent_id, {previews}
            FROM {s}.jobs CROSS JOIN LATERAL
                (SELECT payload::text AS p, result::text AS r, last_error AS e) t
            {where}
            ORDER BY created_at DESC, seq DESC LIMIT %(limit)s OFFSET %(offset)s""",
        Sql.DEAD_BRIEFS: """
            SELECT id, job_id, type, queue, CASE WHEN NOT z.nul THEN (job ->> 'priority')::int END,
                CASE WHEN NOT z.nul THEN (job ->> 'attempts')::int END,
                CASE WHEN NOT z.nul THEN (job ->> 'max_retries')::int END, created_at,
                {previews}, CASE WHEN z.nul THEN job END
            {dead_from}
            ORDER BY created_at DESC, seq DESC LIMIT %(limit)s OFFSET %(offset)s""",
        Sql.COUNT_DEAD_BRIEFS: "SELECT count(*) {dead_from}",
        Sql.OUTBOX_OF_JOB: """
            SELECT id, event, url, history, delivered_at, next_attempt_at, given_up_at
            FROM {s}.webhook_deliveries WHERE job_id = %(id)s ORDER BY created_at, id""",
        Sql.SCHEDULE_STATES: """
            SELECT name, enabled, last_fire, last_job_id, enabled_at FROM {s}.schedules""",
    }
)
