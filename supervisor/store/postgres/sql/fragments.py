"""What the PostgreSQL store's statements are built from: their names (`Sql`) and the
fragments they share, with the schema filled in (`fragments`).

The columns of a `Job` are generated from the struct (`JOB_FIELDS`), in its field order,
which is also the order `pg_rows.job` decodes. A terminal status (done, failed,
cancelled) writes its webhook's outbox row in the same statement as the change: the
`outbox` fragment, a CTE over the `hooked` column of `changed` (the whole new row when
the job has a `webhook_url`, NULL otherwise). The deliveries are then read and updated by
the `OUTBOX_*` statements (`outbox.py`).
"""

from __future__ import annotations

from enum import StrEnum, auto
from typing import Final

import msgspec
from goqueue.supervisor.common.jobs import Job
from goqueue.supervisor.settings.stores import channel
from goqueue.supervisor.store.postgres.webhook_body import body_sql

JOB_FIELDS: Final = tuple(field.name for field in msgspec.structs.fields(Job))
N_JOB_FIELDS: Final = len(JOB_FIELDS)
# `JobFilter` fields: equality filters
FILTER_COLUMNS: Final = ("type", "status", "queue", "parent_id", "concurrency_key")
# An Idempotency-Key of POST /workflows shares the table of POST /jobs, apart by prefix.
WORKFLOW_KEY_PREFIX: Final = "workflow:"


# A CTE writing, for the one row of `changed`, the events `%(events)s` with their
# details `%(details)s` (two text arrays), in array order.
_TRAIL_OF_EVENTS = """trail AS (
            INSERT INTO {s}.events (job_id, event, at, node, attempt, detail)
            SELECT changed.id, e.event, now(), %(node)s, changed.attempts, e.detail
            FROM changed CROSS JOIN unnest(%(events)s::text[], %(details)s::text[])
                WITH ORDINALITY AS e(event, detail, n)
            ORDER BY e.n)"""
# The same, each event with a traceback (null but for a failed attempt's): the trail of
# the statements recording an attempt's failure.
_TRAIL_OF_FAILURE = """trail AS (
            INSERT INTO {s}.events (job_id, event, at, node, attempt, detail, traceback)
            SELECT changed.id, e.event, now(), %(node)s, changed.attempts, e.detail, e.tb
            FROM changed CROSS JOIN unnest(
                    %(events)s::text[], %(details)s::text[], %(tracebacks)s::text[])
                WITH ORDINALITY AS e(event, detail, tb, n)
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
_DEAD_WHERE = """WHERE (%(type)s::text IS NULL OR type = %(type)s::text)
              AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
              AND (%(job_id)s::uuid IS NULL OR job_id = %(job_id)s::uuid)
              AND (%(pattern)s::text IS NULL
                   OR {s}.job_field(job, 'last_error') ILIKE %(pattern)s::text)
              AND (%(before)s::timestamptz IS NULL OR created_at < %(before)s::timestamptz)
              AND (%(after)s::timestamptz IS NULL OR created_at > %(after)s::timestamptz)"""


LEASED: Final = ("running", "claimed")


def by_id(column: str, *statuses: str) -> str:
    """A row found by id must have one of `statuses`, written so that no partial index
    on the status (`jobs_running`, `jobs_claimed`) can serve it. Those indexes keep an
    entry for every row version ever in that status until VACUUM removes it, and without
    statistics (a table never vacuumed nor analyzed) the planner takes one as tiny and
    ANDs its whole bitmap with the primary key's: every start and complete then walks
    every attempt since the last VACUUM."""
    listed = ", ".join(f"'{status}'" for status in statuses)
    return f"({column} || '') IN ({listed})"


def fragments(schema: str) -> dict[str, str]:
    """The fragments the templates share, with the schema filled in."""
    quoted = f'"{schema}"'
    fragments = {
        "job": ", ".join(JOB_FIELDS),
        "claimed_job": ", ".join(f"(c.o_job).{name}" for name in JOB_FIELDS),
        "clear_lease": "lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL",
        "fenced": f"id = %(id)s AND lease_token = %(token)s AND {by_id('status', 'running')}",
        "held": f"id = %(id)s AND lease_token = %(token)s AND {by_id('status', *LEASED)}",
        "append_error": (
            "errors = errors || jsonb_build_array(jsonb_strip_nulls(jsonb_build_object("
            "'attempt', attempts, 'error', %(error)s::text, 'at', now(),"
            " 'traceback', %(traceback)s::text))),"
            " last_error = %(error)s"
        ),
        "live_nodes": "heartbeat_at > now() - %(live)s * interval '1 second'",
        "trail": _TRAIL_OF_EVENTS,
        "failure_trail": _TRAIL_OF_FAILURE,
        "where": "",
        # a preview is three columns: the first n characters, the size in bytes, whether cut
        "previews": ", ".join(
            f"left(t.{c}, %(n)s), octet_length(t.{c}), char_length(t.{c}) > %(n)s"
            for c in ("p", "r", "e")
        ),
        # `z.nul`: the letter's JSON holds the escape \u0000, which `->>` refuses; its
        # fields are read whole, as JSON, instead (`DEAD_BRIEFS`' last column)
        "dead_from": """FROM {s}.dead_letters
            CROSS JOIN LATERAL (SELECT strpos(job::text, '\\u0000') > 0 AS nul) z
            CROSS JOIN LATERAL (
                SELECT CASE WHEN NOT z.nul THEN (job -> 'payload')::text END AS p,
                    NULL::text AS r, CASE WHEN NOT z.nul THEN job ->> 'last_error' END AS e) t
            """
        + _DEAD_WHERE,
        "dead_where": _DEAD_WHERE,
        "workflow_key": f"left(key, {len(WORKFLOW_KEY_PREFIX)}) = '{WORKFLOW_KEY_PREFIX}'",
        "channel": f'"{channel(schema)}"',
        "hooked": _HOOKED.format(t="jobs"),
        "hooked_j": _HOOKED.format(t="j"),
        "outbox": _OUTBOX,
    }
    return {name: text.replace("{s}", quoted) for name, text in fragments.items()} | {"s": quoted}


class Sql(StrEnum):
    """The name of each statement of the store (a key of `statements.TEMPLATES`)."""

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
    ADD_JOB_KEYED = auto()
    ADD_JOBS = auto()
    ADD_JOBS_KEYED = auto()
    CLAIM_DEDUPE = auto()
    DEDUPE_HOLDER = auto()
    UNIQUE_HOLDER = auto()
    KEY_HOLDS = auto()
    DEBOUNCE_LOCK = auto()
    DEBOUNCE = auto()
    IDEMPOTENCY_MOVE = auto()
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
    COMPLETE_UNHOOKED = auto()
    COMPLETE_MANY = auto()
    COMPLETE_MANY_UNHOOKED = auto()
    RETRY = auto()
    BURY = auto()
    INSERT_DEAD = auto()
    RELEASE = auto()
    LOCK_JOB = auto()
    SALVAGE_LOCK = auto()
    SALVAGE_DEAD = auto()
    REOPEN = auto()
    CANCEL = auto()
    CANCEL_MANY = auto()
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
    COUNT_COUNTED = auto()
    LIST_DEAD = auto()
    GET_DEAD = auto()
    PURGE_DEAD = auto()
    PURGE_DEAD_MANY = auto()
    PURGE_DEAD_MANY_TALLIED = auto()
    COUNT_DEAD_MATCHING = auto()
    COUNT_DEAD_GROUPED = auto()
    PRUNE = auto()
    # summaries for operators (the dashboard)
    QUEUE_PENDING = auto()
    QUEUE_RUNNING = auto()
    PAUSED = auto()
    NODES = auto()
    TYPE_COUNTS = auto()
    TYPE_RUN_TIMES = auto()
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
    # workflows (`sql/workflows.py`)
    WORKFLOW_INSERT = auto()
    WORKFLOW_STEPS = auto()
    WORKFLOW_GET = auto()
    WORKFLOW_CURRENT = auto()
    WORKFLOW_LIST = auto()
    WORKFLOW_LIST_ALL = auto()
    WORKFLOW_COUNTS = auto()
    WORKFLOW_CANCEL = auto()
    WORKFLOW_CANCEL_STEPS = auto()
    STEPS_RELEASE = auto()
    STEPS_CANCEL_BELOW = auto()
    STEP_REPLACE = auto()
    STEPS_RESUME = auto()
