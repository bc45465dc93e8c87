"""The node's settings: one typed, frozen `Settings`, loaded from four sources.

Precedence, highest first, decided option by option:

1. command-line flags (`--shutdown-grace 10`);
2. the environment: `GOQUEUE_` + the flag's name in capitals with `_` for `-`
   (`GOQUEUE_SHUTDOWN_GRACE=10`), plus the seeds' `DATABASE_URL` and `API_KEY`, which lose
   to their `GOQUEUE_` spelling when both are set; an empty variable counts as unset;
3. the TOML file named by `--config` / `GOQUEUE_CONFIG`: top-level keys are the option
   names with underscores (`shutdown_grace = 10`), per-type limits go in a `[limits]` table;
4. the defaults below.

Per-type limits (`[limits]` in the file, `--limit TYPE=N` flags) merge type by type, flags
winning. Flags and environment values are strings parsed here, so every bad value, whatever
its source, fails the same way: a `ConfigError` naming the option and where it came from.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import socket
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from difflib import get_close_matches
from types import MappingProxyType
from typing import Any, Literal

import msgspec
from goqueue.supervisor.errors import ConfigError
from goqueue.supervisor.store.pg_schema import schema_name_problem

ENV_PREFIX = "GOQUEUE_"
LOG_LEVELS = ("debug", "info", "warning", "error")
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})

Kind = Literal["str", "int", "float", "bool", "list"]
_EXPECTED: Mapping[str, str] = MappingProxyType(
    {
        "str": "a string",
        "int": "an integer",
        "float": "a number",
        "bool": "a boolean (1/true/yes or 0/false/no)",
        "list": "a comma-separated list",
    }
)


def cpu_count() -> int:
    """CPUs this process may run on (honours affinity/cpusets, unlike `os.cpu_count`)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


def default_node_id() -> str:
    """`hostname-pid`: unique per running node, readable in logs and the audit trail."""
    return f"{socket.gethostname()}-{os.getpid()}"


class Settings(msgspec.Struct, kw_only=True, frozen=True):
    """Everything a node is configured with. Constructing one validates it."""

    host: str = "0.0.0.0"
    port: int = 8080
    workers: int = msgspec.field(default_factory=cpu_count)
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
    max_pending: int = 100_000
    max_body_bytes: int = 1_048_576
    lease_seconds: float = 30.0
    webhook_secret: str | None = None
    webhook_allow_hosts: tuple[str, ...] | None = None
    webhook_timeout: float = 5.0
    idempotency_ttl: float = 86_400.0
    retention_seconds: float = 604_800.0  # 0: keep finished jobs forever
    kill_grace: float = 0.05
    log_level: str = "info"
    config: str | None = None
    node_id: str = msgspec.field(default_factory=default_node_id)
    limits: dict[str, int] = msgspec.field(default_factory=dict)
    read_api_key: bool = False

    def __post_init__(self) -> None:
        for option in OPTIONS:
            problem = option.check(getattr(self, option.name))
            if problem:
                raise ConfigError(f"{option.name}: {problem}")
        for job_type, limit in self.limits.items():
            if not isinstance(limit, int) or isinstance(limit, bool):
                raise ConfigError(f"limits: {job_type}: expected an integer, got {limit!r}")
            problem = _check_limit(job_type, limit)
            if problem:
                raise ConfigError(f"limits: {problem}")
        if self.database_url is not None:
            _check_dsn(self.database_url)
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


def _check_dsn(dsn: str) -> None:
    """Reject a DSN that cannot even be parsed (no point retrying a typo forever)."""
    from psycopg.conninfo import conninfo_to_dict

    try:
        conninfo_to_dict(dsn)
    except Exception as exc:
        raise ConfigError(f"database_url: not a valid PostgreSQL DSN: {exc}".strip()) from None


@dataclass(frozen=True, slots=True)
class Option:
    """One scalar or list option: how to parse it, what range it allows, how to document it."""

    name: str
    kind: Kind
    default_text: str
    help: str
    metavar: str | None = None
    optional: bool = False
    minimum: float | None = None
    above_minimum: bool = False  # True: the value must be strictly greater than `minimum`
    maximum: float | None = None
    choices: tuple[str, ...] | None = None
    legacy_env: str | None = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()

    def parse(self, raw: object) -> object:
        """A typed value from a string (flags, environment) or a TOML value; raises ValueError."""
        if isinstance(raw, str):
            return self._parse_text(raw)
        return self._accept_typed(raw)

    def check(self, value: object) -> str | None:
        """What is wrong with an already typed value, or None."""
        if value is None:
            return None if self.optional else "must be set"
        if isinstance(value, int | float) and not isinstance(value, bool):
            return self._check_number(value)
        if self.choices is not None and value not in self.choices:
            return f"must be one of {', '.join(self.choices)}, got {value!r}"
        if self.kind == "list" and not value and not self.optional:
            return "must name at least one entry"
        return None

    def _parse_text(self, raw: str) -> object:
        text = raw.strip()
        if not text and self.optional:
            return None
        if self.kind == "str":
            return text.lower() if self.choices else text
        if self.kind == "list":
            return tuple(item.strip() for item in text.split(",") if item.strip())
        if self.kind == "bool":
            if text.lower() in _TRUE | _FALSE:
                return text.lower() in _TRUE
            raise ValueError
        number = int(text) if self.kind == "int" else float(text)
        if not math.isfinite(number):
            raise ValueError
        return number

    def _accept_typed(self, raw: object) -> object:
        if self.kind == "bool" and isinstance(raw, bool):
            return raw
        if isinstance(raw, bool):
            raise ValueError
        if self.kind == "int" and isinstance(raw, int):
            return raw
        if self.kind == "float" and isinstance(raw, int | float) and math.isfinite(raw):
            return float(raw)
        if self.kind == "list" and isinstance(raw, list) and all(isinstance(i, str) for i in raw):
            return tuple(item.strip() for item in raw if item.strip())
        raise ValueError

    def _check_number(self, value: float) -> str | None:
        low, high = self.minimum, self.maximum
        if low is not None and (value <= low if self.above_minimum else value < low):
            bound = f"greater than {low:g}" if self.above_minimum else f"at least {low:g}"
            return f"must be {bound}, got {value:g}"
        if high is not None and value > high:
            return f"must be at most {high:g}, got {value:g}"
        return None


OPTIONS: tuple[Option, ...] = (
    Option("host", "str", "0.0.0.0", "address the API listens on", metavar="ADDR"),
    Option(
        "port",
        "int",
        "8080",
        "port the API listens on; 0 picks a free one",
        metavar="PORT",
        minimum=0,
        maximum=65535,
    ),
    Option("workers", "int", "the CPU count", "worker processes", metavar="N", minimum=1),
    Option(
        "actors",
        "list",
        "goqueue.actors.examples",
        "modules holding actors",
        metavar="MOD[,MOD...]",
    ),
    Option(
        "queues",
        "list",
        "all queues",
        "queues this node takes work from",
        metavar="Q[,Q...]",
        optional=True,
    ),
    Option(
        "database_url",
        "str",
        "the in-memory store",
        "PostgreSQL DSN",
        metavar="DSN",
        optional=True,
        legacy_env="DATABASE_URL",
    ),
    Option(
        "database_schema",
        "str",
        "goqueue",
        "PostgreSQL schema holding GoQueue's tables (nodes sharing a queue share it)",
        metavar="NAME",
    ),
    Option(
        "api_key",
        "str",
        "none",
        "key required (X-API-Key) on mutating requests",
        metavar="KEY",
        optional=True,
        legacy_env="API_KEY",
    ),
    Option(
        "default_timeout",
        "float",
        "300",
        "seconds an attempt may run when neither job nor actor sets a timeout",
        metavar="SECONDS",
        minimum=0,
        above_minimum=True,
    ),
    Option(
        "retry_base",
        "float",
        "1",
        "backoff base in seconds: base * 2^(attempt-1), jittered",
        metavar="SECONDS",
        minimum=0,
        above_minimum=True,
    ),
    Option(
        "retry_cap",
        "float",
        "3600",
        "longest backoff in seconds",
        metavar="SECONDS",
        minimum=0,
        above_minimum=True,
    ),
    Option(
        "shutdown_grace",
        "float",
        "30",
        "seconds running jobs get to finish on SIGTERM",
        metavar="SECONDS",
        minimum=0,
    ),
    Option(
        "max_jobs_per_worker",
        "int",
        "unlimited",
        "replace a worker after this many attempts",
        metavar="N",
        optional=True,
        minimum=1,
    ),
    Option(
        "max_worker_rss_mb",
        "int",
        "unlimited",
        "replace a worker between jobs once its RSS exceeds this many MiB",
        metavar="MIB",
        optional=True,
        minimum=1,
    ),
    Option(
        "max_pending",
        "int",
        "100000",
        "pending jobs the in-memory store holds; beyond it POST /jobs answers 503",
        metavar="N",
        minimum=1,
    ),
    Option(
        "max_body_bytes",
        "int",
        "1048576",
        "largest request body; larger ones answer 413",
        metavar="BYTES",
        minimum=1,
    ),
    Option(
        "lease_seconds",
        "float",
        "30",
        "PostgreSQL lease length; the heartbeat renews at a third of it",
        metavar="SECONDS",
        minimum=1,
    ),
    Option(
        "webhook_secret",
        "str",
        "unsigned",
        "HMAC-SHA256 key for X-GoQueue-Signature",
        metavar="SECRET",
        optional=True,
    ),
    Option(
        "webhook_allow_hosts",
        "list",
        "any host",
        "hosts webhooks may be delivered to",
        metavar="HOST[,HOST...]",
        optional=True,
    ),
    Option(
        "webhook_timeout",
        "float",
        "5",
        "seconds one webhook delivery attempt may take",
        metavar="SECONDS",
        minimum=0,
        above_minimum=True,
    ),
    Option(
        "idempotency_ttl",
        "float",
        "86400",
        "seconds an Idempotency-Key is remembered",
        metavar="SECONDS",
        minimum=0,
        above_minimum=True,
    ),
    Option(
        "retention_seconds",
        "float",
        "604800 (7 days)",
        "finished jobs (done, failed, cancelled) and their audit trails are deleted this "
        "long after they finish; 0 keeps them forever (dead letters always stay)",
        metavar="SECONDS",
        minimum=0,
    ),
    Option(
        "kill_grace",
        "float",
        "0.05",
        "seconds between SIGTERM and SIGKILL for a timed-out worker",
        metavar="SECONDS",
        minimum=0,
    ),
    Option(
        "log_level",
        "str",
        "info",
        "debug, info, warning or error",
        metavar="LEVEL",
        choices=LOG_LEVELS,
    ),
    Option("config", "str", "none", "TOML file of settings", metavar="FILE", optional=True),
    Option(
        "node_id",
        "str",
        "hostname-pid",
        "this node's name in leases, logs and the audit trail",
        metavar="ID",
        optional=True,
    ),
    Option(
        "read_api_key",
        "bool",
        "off",
        "require the API key on read endpoints too",
    ),
)
_BY_NAME: Mapping[str, Option] = MappingProxyType({option.name: option for option in OPTIONS})
FILE_KEYS: frozenset[str] = frozenset(_BY_NAME) - {"config"} | {"limits"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per option, all defaulting to None so `load` can tell "not given" apart."""
    for option in OPTIONS:
        env = option.env + (f" or {option.legacy_env}" if option.legacy_env else "")
        help_text = f"{option.help} (default: {option.default_text}; env {env})"
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
            option.flag, dest=option.name, metavar=option.metavar, default=None, help=help_text
        )
    parser.add_argument(
        "--limit",
        dest="limits",
        action="append",
        metavar="TYPE=N",
        default=None,
        help="at most N attempts of TYPE at once; repeatable "
        "(default: the actor's concurrency; also the [limits] table of the config file)",
    )


def load(args: argparse.Namespace | None, environ: Mapping[str, str]) -> Settings:
    """Settings from flags > environment > TOML file > defaults; raises ConfigError."""
    flags = _from_flags(args)
    env = _from_environ(environ)
    path = flags.get("config") or env.get("config")
    values: dict[str, Any] = {}  # each value already parsed and checked by its option
    limits: dict[str, int] = {}
    if isinstance(path, str):
        file_values, limits = _from_file(path)
        values.update(file_values)
    values.update(env)
    values.update(flags)
    limits.update(_flag_limits(args))
    return Settings(**values, limits=limits)


def reload(
    current: Settings, args: argparse.Namespace | None, environ: Mapping[str, str]
) -> Settings:
    """Re-read the same sources (SIGHUP); which changes apply live is the caller's call.

    The node id is kept: leases and audit events already written name it.
    """
    return msgspec.structs.replace(load(args, environ), node_id=current.node_id)


def _parse(option: Option, raw: object, source: str) -> object:
    """Parse and range-check one value, naming the option and its source on failure."""
    try:
        value = option.parse(raw)
    except ValueError:
        expected = "one of " + ", ".join(option.choices) if option.choices else None
        raise ConfigError(
            f"{option.name}: expected {expected or _EXPECTED[option.kind]}, "
            f"got {raw!r} (from {source})"
        ) from None
    problem = option.check(value)
    if problem:
        raise ConfigError(f"{option.name}: {problem} (from {source})")
    return value


def _from_flags(args: argparse.Namespace | None) -> dict[str, object]:
    values: dict[str, object] = {}
    for option in OPTIONS:
        raw = getattr(args, option.name, None) if args is not None else None
        if raw is not None:
            values[option.name] = _parse(option, raw, f"flag {option.flag}")
    return values


def _from_environ(environ: Mapping[str, str]) -> dict[str, object]:
    values: dict[str, object] = {}
    for option in OPTIONS:
        for name in (option.env, option.legacy_env):
            raw = environ.get(name) if name else None
            if raw is not None and raw.strip():
                values[option.name] = _parse(option, raw, f"environment {name}")
                break
    return values


def _from_file(path: str) -> tuple[dict[str, object], dict[str, int]]:
    source = f"config file {path}"
    try:
        with open(path, "rb") as file:
            data = tomllib.load(file)
    except OSError as exc:
        raise ConfigError(f"config: cannot read {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config: {path} is not valid TOML: {exc}") from None
    values: dict[str, object] = {}
    limits: dict[str, int] = {}
    for key, raw in data.items():
        if key == "limits":
            limits = _file_limits(raw, source)
        elif key == "config":
            raise ConfigError(f"config: cannot be set inside the config file ({path})")
        elif key in FILE_KEYS:
            values[key] = _parse(_BY_NAME[key], raw, source)
        else:
            raise ConfigError(f"{key}: unknown option in {source}{_suggest(key)}")
    return values, limits


def _suggest(key: str) -> str:
    close = get_close_matches(key.replace("-", "_"), sorted(FILE_KEYS), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _file_limits(raw: object, source: str) -> dict[str, int]:
    if not isinstance(raw, dict):
        raise ConfigError(f"limits: expected a table of TYPE = N, got {raw!r} (from {source})")
    return {str(key): _limit(str(key), value, source) for key, value in raw.items()}


def _flag_limits(args: argparse.Namespace | None) -> dict[str, int]:
    limits: dict[str, int] = {}
    for entry in getattr(args, "limits", None) or ():
        job_type, sep, count = str(entry).partition("=")
        if not sep:
            raise ConfigError(f"limits: expected TYPE=N, got {entry!r} (from flag --limit)")
        limits[job_type.strip()] = _limit(job_type.strip(), count.strip(), "flag --limit")
    return limits


def _limit(job_type: str, raw: object, source: str) -> int:
    value = raw
    if isinstance(raw, str):
        with contextlib.suppress(ValueError):
            value = int(raw)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ConfigError(
            f"limits: {job_type or '<empty>'}: expected an integer, got {raw!r} (from {source})"
        )
    problem = _check_limit(job_type, value)
    if problem:
        raise ConfigError(f"limits: {problem} (from {source})")
    return value


def _check_limit(job_type: str, limit: int) -> str | None:
    if not job_type:
        return "a job type name is empty"
    if limit < 1:
        return f"{job_type}: must be at least 1, got {limit}"
    return None
