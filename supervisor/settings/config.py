"""The node's settings: one typed, frozen `Settings`, loaded from four sources.

Precedence, highest first, decided option by option:

1. command-line flags (`--shutdown-grace 10`);
2. the environment: `GOQUEUE_` + the flag's name in capitals with `_` for `-`
   (`GOQUEUE_SHUTDOWN_GRACE=10`), plus plain `DATABASE_URL` and `API_KEY`, which lose to
   their `GOQUEUE_` spelling when both are set; an empty variable counts as unset;
3. the TOML file named by `--config` / `GOQUEUE_CONFIG`: top-level keys are the option
   names with underscores (`shutdown_grace = 10`), per-type limits go in a `[limits]` table;
4. the defaults of `Settings`, the only place a default is written (`options.py` says what
   each option means; the help texts and the generated docs read the defaults from here).

Per-type limits (`[limits]` in the file, `--limit TYPE=N` flags) merge type by type, flags
winning. Each source is read in `sources.py`, so every bad value, whatever its source,
fails the same way: a `ConfigError` naming the option and where it came from.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import socket
from collections.abc import Collection, Mapping
from types import MappingProxyType
from typing import Any

import msgspec
from goqueue.actors.tracebacks import DEFAULT_MAX_TRACEBACK_BYTES
from goqueue.supervisor.common.errors import ConfigError
from goqueue.supervisor.common.rates import parse_rate
from goqueue.supervisor.common.schedule import ScheduleSpec
from goqueue.supervisor.settings.option import Option
from goqueue.supervisor.settings.options import (
    LIMIT_DEFAULT,
    LIMIT_FLAG,
    LIMIT_HELP,
    LIMIT_METAVAR,
    OPTIONS,
)
from goqueue.supervisor.settings.sources import (
    FILE_KEYS,
    check_limit,
    flag_limits,
    from_environ,
    from_file,
    from_flags,
)
from goqueue.supervisor.settings.stores import StoreKind, schema_name_problem, store_url

__all__ = [
    "COMPUTED_DEFAULTS",
    "FILE_KEYS",
    "OPTIONS",
    "Option",
    "Settings",
    "add_arguments",
    "default_of",
    "describe_default",
    "format_value",
    "load",
    "reload",
]


def network_problem(text: str) -> str | None:
    """What is wrong with `text` as a CIDR of `allow_networks`, or None."""
    try:
        ipaddress.ip_network(text, strict=False)
    except ValueError as exc:
        return f"not a network in CIDR notation ({exc})"
    return None


def cpu_count() -> int:
    """CPUs this process may run on (honours affinity/cpusets, unlike `os.cpu_count`)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


def default_node_id() -> str:
    """`hostname-pid`: unique per running node, readable in logs and the audit trail."""
    return f"{socket.gethostname()}-{os.getpid()}"


# The defaults that are computed when a node starts, so the docs can only describe them.
# Every other default is a value, read from `Settings` itself (`default_of`).
COMPUTED_DEFAULTS: Mapping[str, str] = MappingProxyType(
    {"workers": "the CPU count", "node_id": "hostname-pid"}
)


class Settings(msgspec.Struct, kw_only=True, frozen=True):
    """Everything a node is configured with. Constructing one validates it."""

    host: str = "127.0.0.1"  # containers pass 0.0.0.0 (deploy/)
    port: int = 8080
    workers: int | tuple[int, int] = msgspec.field(default_factory=cpu_count)  # N, MIN:MAX
    scale_down_after: float = 60.0
    actors: tuple[str, ...] = ("goqueue.actors.examples",)
    queues: tuple[str, ...] | None = None
    database_url: str | None = None
    database_schema: str = "goqueue"
    api_key: str | None = None
    default_timeout: float = 300.0
    retry_base: float = 1.0
    retry_cap: float = 3600.0
    shutdown_grace: float = 30.0
    max_jobs_per_worker: int | None = None
    max_worker_rss_mb: int | None = None
    max_pending: int | None = None  # None: unlimited on SQLite, MEMORY_MAX_PENDING in memory
    max_body_bytes: int = 1_048_576
    lease_seconds: float = 30.0
    prefetch: int = 31
    webhook_secret: str | None = None
    webhook_allow_hosts: tuple[str, ...] | None = None
    webhook_timeout: float = 5.0
    idempotency_ttl: float = 86_400.0
    retention_seconds: float = 604_800.0  # 0: keep finished jobs forever
    kill_grace: float = 0.05
    log_level: str = "info"
    log_format: str | None = None  # None: text on a terminal, else json
    config: str | None = None
    node_id: str = msgspec.field(default_factory=default_node_id)
    limits: dict[str, int] = msgspec.field(default_factory=dict)
    webhook_allow_networks: tuple[str, ...] | None = None
    path: tuple[str, ...] | None = None
    max_result_bytes: int = 1_048_576
    max_traceback_bytes: int = DEFAULT_MAX_TRACEBACK_BYTES
    public_reads: bool = False
    otel: bool = False
    max_queues: int = 10_000
    max_workflow_jobs: int = 10_000
    metrics_max_queues: int = 100
    max_connections: int = 10_000
    header_timeout: float = 15.0
    body_timeout: float = 30.0
    keepalive_timeout: float = 75.0
    schedules: tuple[ScheduleSpec, ...] = ()
    rate_limits: dict[str, str] = msgspec.field(default_factory=dict)  # TYPE -> "20/s"
    # flow control by key: `[key_limits]` TYPE = N (running jobs per key) and
    # `[key_rate_limits]` TYPE = "5/s" (starts per key), winning over the actors'
    key_limits: dict[str, int] = msgspec.field(default_factory=dict)
    key_rate_limits: dict[str, str] = msgspec.field(default_factory=dict)

    @property
    def store_kind(self) -> str:
        """Which store the node keeps its jobs in, for the start-up log line: `sqlite` (the
        default), `memory` or `postgresql`."""
        kind = store_url(self.database_url).kind
        return "postgresql" if kind == StoreKind.POSTGRES else str(kind)

    @property
    def keeps_jobs(self) -> bool:
        """False when a restart loses every job (the in-memory store)."""
        return store_url(self.database_url).kind != StoreKind.MEMORY

    @property
    def worker_bounds(self) -> tuple[int, int]:
        """(MIN, MAX) worker processes; equal for a fixed pool."""
        workers = self.workers
        return workers if isinstance(workers, tuple) else (workers, workers)

    def __post_init__(self) -> None:
        for option in OPTIONS:
            problem = option.check(getattr(self, option.name))
            if problem:
                raise ConfigError(f"{option.name}: {problem}")
        for job_type, limit in self.limits.items():
            if not isinstance(limit, int) or isinstance(limit, bool):
                raise ConfigError(f"limits: {job_type}: expected an integer, got {limit!r}")
            problem = check_limit(job_type, limit)
            if problem:
                raise ConfigError(f"limits: {problem}")
        for network in self.webhook_allow_networks or ():
            if problem := network_problem(network):
                raise ConfigError(f"webhook_allow_networks: {network!r} is {problem}")
        _check_schedules(self.schedules)
        _check_rates(self.rate_limits)
        _check_rates(self.key_rate_limits, "key_rate_limits")
        _check_key_limits(self.key_limits)
        if self.database_url is not None:
            _check_database_url(self.database_url)
        if problem := schema_name_problem(self.database_schema):
            raise ConfigError(f"database_schema: {problem}")
        if 0 < self.retention_seconds < self.idempotency_ttl:
            raise ConfigError(
                f"retention_seconds: must be at least idempotency_ttl ({self.idempotency_ttl:g}) "
                "so that a repeated Idempotency-Key still finds its job, "
                f"got {self.retention_seconds:g}"
            )
        if self.retry_cap < self.retry_base:
            raise ConfigError(
                f"retry_cap: must be at least retry_base ({self.retry_base}), got {self.retry_cap}"
            )


def _check_rates(rates: dict[str, str], table: str = "rate_limits") -> None:
    """Each rate limit readable."""
    for job_type, rate in rates.items():
        try:
            parse_rate(rate)
        except ValueError as exc:
            raise ConfigError(f"{table}: {job_type}: {exc}") from None


def _check_key_limits(limits: dict[str, int]) -> None:
    """Each per-key limit a positive integer."""
    for job_type, limit in limits.items():
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise ConfigError(f"key_limits: {job_type}: expected an integer >= 1, got {limit!r}")


def _check_schedules(schedules: tuple[ScheduleSpec, ...]) -> None:
    """Each schedule valid, each name once."""
    seen: set[str] = set()
    for i, spec in enumerate(schedules):
        label = f"schedules[{i}]" + (f" ({spec.name})" if isinstance(spec.name, str) else "")
        if problem := spec.problem():
            raise ConfigError(f"{label}: {problem}")
        if spec.name in seen:
            raise ConfigError(f"{label}: the name {spec.name!r} is taken by another schedule")
        seen.add(spec.name)


def _check_database_url(url: str) -> None:
    """A SQLite URL names a file; anything but SQLite or memory is a PostgreSQL DSN."""
    try:
        kind = store_url(url).kind
    except ValueError as exc:
        raise ConfigError(f"database_url: {exc}") from None
    if kind == StoreKind.POSTGRES:
        _check_dsn(url)


def _check_dsn(dsn: str) -> None:
    """Reject a DSN that cannot even be parsed (no point retrying a typo forever)."""
    from psycopg.conninfo import conninfo_to_dict

    try:
        conninfo_to_dict(dsn)
    except Exception as exc:
        raise ConfigError(f"database_url: not a valid PostgreSQL DSN: {exc}".strip()) from None


_FIELDS: Mapping[str, msgspec.structs.FieldInfo] = MappingProxyType(
    {field.name: field for field in msgspec.structs.fields(Settings)}
)


def default_of(option: Option) -> object:
    """The option's default as `Settings` declares it (None when unset or computed)."""
    field = _FIELDS[option.name]
    return None if field.default is msgspec.NODEFAULT else field.default


def describe_default(option: Option, quote: str = "") -> str:
    """The default in words for help texts and docs: the value (inside `quote`), what
    leaving the option unset means, or what is computed at start-up."""
    if option.name in COMPUTED_DEFAULTS:
        return COMPUTED_DEFAULTS[option.name]
    value = default_of(option)
    if value is None:
        if option.when_unset is None:
            raise LookupError(
                f"option {option.name}: unset by default but says not what that means"
            )
        return option.when_unset
    text = quote + format_value(value) + quote
    if option.metavar == "SECONDS" and isinstance(value, int | float):
        text += _long_duration(value)
    return text


def _long_duration(seconds: float) -> str:
    """` (7 days)` beside a default of many seconds, so no one has to divide by 86400."""
    for unit, size in (("day", 86_400), ("hour", 3_600)):
        count, rest = divmod(seconds, size)
        if count >= 1 and not rest:
            return f" ({count:g} {unit}{'s' if count > 1 else ''})"
    return ""


def format_value(value: object) -> str:
    """A setting as people write it on the command line: `30`, `0.05`, `a,b`, `off`."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, tuple):
        return ",".join(value)
    return str(value)


def add_arguments(
    parser: argparse.ArgumentParser,
    only: Collection[str] | None = None,
    when_unset: Mapping[str, str] | None = None,
) -> None:
    """One flag per option (or per option named in `only`), all defaulting to None so
    `load` can tell "not given" apart; `--limit` too unless `only` leaves it out.
    `when_unset` says, per option, what leaving it unset means to this command when that
    differs from `serve` (to `migrate`, no database URL is an error, not memory)."""
    for option in OPTIONS:
        if only is not None and option.name not in only:
            continue
        envs = " or ".join(option.envs)
        repeat = "; repeatable" if option.repeatable else ""
        default = (when_unset or {}).get(option.name) or describe_default(option)
        text = f"{option.help}{repeat} (default: {default}; env {envs})"
        help_text = text.replace("%", "%%")  # argparse formats help with %
        if option.kind == "bool":
            parser.add_argument(
                option.flag,
                dest=option.name,
                action=argparse.BooleanOptionalAction,
                default=None,
                help=help_text,
            )
            continue
        parser.add_argument(
            option.flag,
            dest=option.name,
            metavar=option.metavar,
            default=None,
            action="append" if option.repeatable else "store",
            help=help_text,
        )
    if only is None or "limits" in only:
        parser.add_argument(
            LIMIT_FLAG,
            dest="limits",
            action="append",
            metavar=LIMIT_METAVAR,
            default=None,
            help=f"{LIMIT_HELP}; repeatable (default: {LIMIT_DEFAULT}; also the [limits] "
            "table of the config file)",
        )


def load(args: argparse.Namespace | None, environ: Mapping[str, str]) -> Settings:
    """Settings from flags > environment > TOML file > defaults; raises ConfigError."""
    flags = from_flags(args)
    env = from_environ(environ)
    path = flags.get("config") or env.get("config")
    values: dict[str, Any] = {}  # parsed and range-checked above; Settings checks the rest
    limits: dict[str, int] = {}
    if isinstance(path, str):
        file_values, limits = from_file(path)
        values.update(file_values)
    values.update(env)
    values.update(flags)
    limits.update(flag_limits(args))
    return Settings(**values, limits=limits)


def reload(
    current: Settings, args: argparse.Namespace | None, environ: Mapping[str, str]
) -> Settings:
    """Re-read the same sources (SIGHUP); which changes apply live is the caller's call.

    The node id is kept: leases and audit events already written name it.
    """
    return msgspec.structs.replace(load(args, environ), node_id=current.node_id)


DEFAULTS = Settings()
"""Every default in one place: the parts that take a setting (the dispatch policy, the
stores) default to this, never to a number of their own."""
