"""Every option of a node (`Option`, in `option.py`): its name, type, allowed range and
meaning.

Not its default: `Settings` in `config.py` holds every default, and the help texts, the
README's options table and `deploy/goqueue.example.toml` all derive theirs from it. What is
written here is only what a default cannot say: what an unset option means
(`when_unset`) and a sample value for the example file where there is no default to show.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from goqueue.supervisor.settings.option import Option

LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("json", "text")  # `LogFormat`'s values (goqueue.supervisor.observe.logs)

OPTIONS: tuple[Option, ...] = (
    Option(
        "host",
        "str",
        "address the API listens on; beyond loopback (containers: 0.0.0.0) set an API key",
        metavar="ADDR",
    ),
    Option(
        "port",
        "int",
        "port the API listens on; 0 picks a free one",
        metavar="PORT",
        minimum=0,
        maximum=65535,
    ),
    Option(
        "workers",
        "bounds",
        "worker processes: N, or MIN:MAX to scale between MIN and MAX with the queue",
        metavar="N|MIN:MAX",
        minimum=1,
        example=4,
    ),
    Option(
        "scale_down_after",
        "float",
        "with --workers MIN:MAX, seconds a worker above MIN may stay idle before it exits",
        metavar="SECONDS",
        minimum=0,
        above_minimum=True,
    ),
    Option("actors", "list", "modules holding actors", metavar="MOD[,MOD...]"),
    Option(
        "queues",
        "list",
        "queues this node takes work from",
        metavar="Q[,Q...]",
        optional=True,
        when_unset="all queues",
        example=("default", "email"),
    ),
    Option(
        "database_url",
        "str",
        "where jobs are kept: sqlite:///relative/path.db or sqlite:////absolute/path.db "
        "(one node per file), memory:// (lost when the node stops), or a PostgreSQL DSN "
        "(nodes sharing one database share their queues)",
        metavar="URL",
        optional=True,
        when_unset="the SQLite file goqueue.db in the working directory",
        example="postgresql://goqueue:secret@db.internal:5432/goqueue",
        secret=True,
        legacy_env="DATABASE_URL",
    ),
    Option(
        "database_schema",
        "str",
        "PostgreSQL schema holding GoQueue's tables (nodes sharing a queue share it)",
        metavar="NAME",
    ),
    Option(
        "api_key",
        "str",
        "key required (X-API-Key) on every request but probes, metrics and the dashboard's "
        "files (reads too, unless --public-reads)",
        metavar="KEY",
        optional=True,
        when_unset="none: the API is open to whoever reaches it (logged loudly beyond loopback)",
        example="change-me",
        secret=True,
        legacy_env="API_KEY",
    ),
    Option(
        "default_timeout",
        "float",
        "seconds an attempt may run when neither job nor actor sets a timeout",
        metavar="SECONDS",
        minimum=0,
        above_minimum=True,
    ),
    Option(
        "retry_base",
        "float",
        "backoff base in seconds: a retry waits base * 2^(attempt-1), jittered by up to 25 %",
        metavar="SECONDS",
        minimum=0,
        above_minimum=True,
    ),
    Option(
        "retry_cap",
        "float",
        "longest backoff in seconds (before jitter)",
        metavar="SECONDS",
        minimum=0,
        above_minimum=True,
    ),
    Option(
        "shutdown_grace",
        "float",
        "seconds running jobs get to finish on SIGTERM before they are killed and handed back",
        metavar="SECONDS",
        minimum=0,
    ),
    Option(
        "max_jobs_per_worker",
        "int",
        "replace a worker after this many attempts",
        metavar="N",
        optional=True,
        when_unset="unlimited",
        example=1000,
        minimum=1,
    ),
    Option(
        "max_worker_rss_mb",
        "int",
        "memory limit of a worker in MiB: a job whose worker passes it is killed and fails "
        "(sampled every 50 ms), and a worker above it after a job is replaced",
        metavar="MIB",
        optional=True,
        when_unset="unlimited",
        example=512,
        minimum=1,
    ),
    Option(
        "max_pending",
        "int",
        "pending jobs the store holds; beyond it POST /jobs answers 503",
        metavar="N",
        minimum=1,
        optional=True,
        when_unset="unlimited on SQLite (the disk is the bound); 100000 in memory",
        example=1_000_000,
    ),
    Option(
        "max_body_bytes",
        "int",
        "largest request body; larger ones answer 413",
        metavar="BYTES",
        minimum=1,
    ),
    Option(
        "lease_seconds",
        "float",
        "PostgreSQL lease length; the heartbeat renews at a third of it",
        metavar="SECONDS",
        minimum=1,
    ),
    Option(
        "prefetch",
        "int",
        "most attempts of short jobs a worker may hold queued behind the one it runs "
        "(`claimed` until each starts), run back to back without a round trip through the "
        "supervisor; the queue deepens up to it only while jobs are waiting, and holds "
        "about 0.4 s of their usual work at most. 0: one at a time",
        metavar="N",
        minimum=0,
        example=2,
    ),
    Option(
        "webhook_secret",
        "str",
        "HMAC-SHA256 key for the X-GoQueue-Signature header of webhooks",
        metavar="SECRET",
        optional=True,
        when_unset="none, so webhooks are unsigned",
        example="change-me",
        secret=True,
    ),
    Option(
        "webhook_allow_hosts",
        "list",
        "hosts webhooks may be delivered to whatever they resolve to (by default loopback, "
        "private, link-local, CGNAT, multicast and other non-public addresses are refused)",
        metavar="HOST[,HOST...]",
        optional=True,
        when_unset="none: public addresses only",
        example=("hooks.internal.example.com",),
    ),
    Option(
        "webhook_timeout",
        "float",
        "seconds one webhook delivery attempt may take",
        metavar="SECONDS",
        minimum=0,
        above_minimum=True,
    ),
    Option(
        "idempotency_ttl",
        "float",
        "seconds an Idempotency-Key is remembered",
        metavar="SECONDS",
        minimum=0,
        above_minimum=True,
    ),
    Option(
        "retention_seconds",
        "float",
        "finished jobs (done, failed, cancelled) and their audit trails are deleted this "
        "long after they finish (looked for every tenth of it, between once a second and "
        "once a minute); 0 keeps them forever (dead letters always stay)",
        metavar="SECONDS",
        minimum=0,
    ),
    Option(
        "kill_grace",
        "float",
        "seconds between SIGTERM and SIGKILL for a timed-out worker",
        metavar="SECONDS",
        minimum=0,
    ),
    Option(
        "log_level",
        "str",
        "debug, info, warning or error",
        metavar="LEVEL",
        choices=LOG_LEVELS,
    ),
    Option(
        "log_format",
        "str",
        "the logs' shape: json (one object a line, for collectors) or text (a readable "
        "line per record)",
        metavar="FORMAT",
        optional=True,
        when_unset="text on a terminal, else json",
        example="json",
        choices=LOG_FORMATS,
    ),
    Option(
        "config",
        "str",
        "TOML file of settings",
        metavar="FILE",
        optional=True,
        when_unset="no file",
    ),
    Option(
        "node_id",
        "str",
        "this node's name in leases, logs and the audit trail; unique per node",
        metavar="ID",
        optional=True,
        example="node-1",
    ),
    Option(
        "webhook_allow_networks",
        "list",
        "networks webhooks may be delivered to although not public, in CIDR notation "
        "(checked on the resolved address of every connection)",
        metavar="CIDR[,CIDR...]",
        optional=True,
        when_unset="none: public addresses only",
        example=("10.20.0.0/16",),
    ),
    # -- worker processes (appended together: keep this block in one piece) -----------
    Option(
        "path",
        "list",
        "directories put first on the workers' import path, before PYTHONPATH (the "
        "working directory always is: run `goqueue serve` from your project)",
        metavar="DIR",
        optional=True,
        when_unset="the working directory only",
        example=("src",),
        repeatable=True,
    ),
    Option(
        "max_result_bytes",
        "int",
        "largest result a job may return, as JSON; a larger one fails the attempt, "
        "without retry, and nothing of it is stored",
        metavar="BYTES",
        minimum=1,
    ),
    Option(
        "max_traceback_bytes",
        "int",
        "most of a failed attempt's traceback kept with it (the last frames and the "
        "exception); 0 keeps none",
        metavar="BYTES",
        minimum=0,
    ),
    # -- exposure and bounded cost per client: hostile networks and greedy clients --
    Option(
        "otel",
        "bool",
        "OpenTelemetry traces of every enqueue and attempt, exported as the standard "
        "OTEL_* variables say (needs `pip install 'goqueue[otel]'`)",
    ),
    Option(
        "public_reads",
        "bool",
        "with an API key, let reads (GET) through without it; writes still need it",
    ),
    Option(
        "max_queues",
        "int",
        "queues with pending jobs, or paused, at once; an enqueue or pause that would add "
        "one more answers 429 (with PostgreSQL counted across nodes, a few seconds stale)",
        metavar="N",
        minimum=1,
    ),
    Option(
        "max_workflow_jobs",
        "int",
        "steps one workflow may have; POST /workflows with more answers 413",
        metavar="N",
        minimum=1,
    ),
    Option(
        "metrics_max_queues",
        "int",
        "deepest queues given their own goqueue_queue_depth series; the rest are summed "
        'under queue="(other)"',
        metavar="N",
        minimum=1,
    ),
    Option(
        "max_connections",
        "int",
        "open HTTP connections; beyond it the longest idle one is closed (or, none idle, the "
        "new one answered 503); lowered to fit the open-files limit",
        metavar="N",
        minimum=1,
    ),
    Option(
        "header_timeout",
        "float",
        "seconds a client has to send a request's headers, counted from connecting or from "
        "the request's first byte; then the connection is closed",
        metavar="SECONDS",
        minimum=0,
        above_minimum=True,
    ),
    Option(
        "body_timeout",
        "float",
        "seconds a client has to send a request's body; then it is answered 408",
        metavar="SECONDS",
        minimum=0,
        above_minimum=True,
    ),
    Option(
        "keepalive_timeout",
        "float",
        "seconds an idle kept-alive connection stays open",
        metavar="SECONDS",
        minimum=0,
        above_minimum=True,
    ),
)

BY_NAME: Mapping[str, Option] = MappingProxyType({option.name: option for option in OPTIONS})

# Per-type limits are not an `Option`: a repeatable flag and a `[limits]` table, no variable.
LIMIT_FLAG = "--limit"
LIMIT_METAVAR = "TYPE=N"
LIMIT_HELP = (
    "at most N attempts of TYPE at once (with PostgreSQL, the smallest limit among live "
    "nodes holds across all of them)"
)
LIMIT_DEFAULT = "the actor's concurrency"
LIMIT_EXAMPLE: Mapping[str, int] = MappingProxyType({"report": 2})

# Rate limits neither: a `[rate_limits]` table only.
RATE_HELP = (
    'at most N starts of TYPE per second, minute or hour (TYPE = "N/s", "N/m" or "N/h"), '
    "across every node with PostgreSQL; a throttled job waits, holding no worker"
)
RATE_DEFAULT = "the actor's rate_limit, else none"
RATE_EXAMPLE: Mapping[str, str] = MappingProxyType({"email": "20/s"})

# Periodic jobs are not an `Option` either: `[[schedules]]` tables in the file only.
KEY_LIMIT_HELP = (
    "at most N jobs of TYPE with the same concurrency_key running at once (with PostgreSQL, "
    "across every node); a key at its limit holds up no other key"
)
KEY_LIMIT_DEFAULT = "the actor's key_concurrency, else none"
KEY_LIMIT_EXAMPLE: Mapping[str, int] = MappingProxyType({"sync": 1})
KEY_RATE_HELP = (
    'at most N starts of TYPE per concurrency_key per second, minute or hour (TYPE = "N/s", '
    '"N/m" or "N/h"), each key paced on its own'
)
KEY_RATE_DEFAULT = "the actor's key_rate_limit, else none"
KEY_RATE_EXAMPLE: Mapping[str, str] = MappingProxyType({"sync": "5/s"})
SCHEDULE_HELP = (
    "one [[schedules]] table per periodic job: name, type, cron (five fields, in "
    "timezone, UTC unless given) or every_seconds, and optionally payload, queue, priority, "
    "concurrency_key and "
    'missed ("once": a tick missed while every node was down fires once on recovery, the '
    'default; "skip": it does not); an actor\'s schedule= of the same name loses to it'
)
SCHEDULE_EXAMPLE: tuple[tuple[str, str], ...] = (
    ("name", '"hourly-report"'),
    ("type", '"report"'),
    ("cron", '"0 * * * *"'),
    ("timezone", '"Europe/Paris"'),
    ("payload", "{rounds = 1000}"),
    ("missed", '"once"'),
)
