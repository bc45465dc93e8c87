"""Where a node's settings come from, each read and parsed the same way: flags, the
environment and the TOML file (`config.py` says which wins). Every bad value, whatever
its source, is a `ConfigError` naming the option and where it came from."""

from __future__ import annotations

import argparse
import contextlib
import tomllib
from collections.abc import Mapping
from difflib import get_close_matches

import msgspec
from goqueue.supervisor.common.errors import ConfigError
from goqueue.supervisor.common.schedule import ScheduleSpec
from goqueue.supervisor.settings.option import EXPECTED, Option
from goqueue.supervisor.settings.options import BY_NAME, OPTIONS

# The keys a config file may hold: every option but `config`, and the tables.
FILE_KEYS: frozenset[str] = frozenset(BY_NAME) - {"config"} | {
    "limits",
    "schedules",
    "rate_limits",
    "key_limits",
    "key_rate_limits",
}


def parse(option: Option, raw: object, source: str) -> object:
    """Parse and range-check one value, naming the option and its source on failure."""
    try:
        value = option.parse(raw)
    except ValueError:
        expected = "one of " + ", ".join(option.choices) if option.choices else None
        raise ConfigError(
            f"{option.name}: expected {expected or EXPECTED[option.kind]}, "
            f"got {raw!r} (from {source})"
        ) from None
    problem = option.check(value)
    if problem:
        raise ConfigError(f"{option.name}: {problem} (from {source})")
    return value


def from_flags(args: argparse.Namespace | None) -> dict[str, object]:
    """The options given as flags, parsed."""
    values: dict[str, object] = {}
    for option in OPTIONS:
        raw = getattr(args, option.name, None) if args is not None else None
        if isinstance(raw, list):  # a repeatable flag: every occurrence counts
            raw = ",".join(raw)
        if raw is not None:
            values[option.name] = parse(option, raw, f"flag {option.flag}")
    return values


def from_environ(environ: Mapping[str, str]) -> dict[str, object]:
    """The options given in the environment (`GOQUEUE_…`, then the plain spellings)."""
    values: dict[str, object] = {}
    for option in OPTIONS:
        for name in (option.env, option.legacy_env):
            raw = environ.get(name) if name else None
            if raw is not None and raw.strip():
                values[option.name] = parse(option, raw, f"environment {name}")
                break
    return values


def from_file(path: str) -> tuple[dict[str, object], dict[str, int]]:
    """The options of a TOML file, and its `[limits]` table."""
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
        elif key == "schedules":
            values[key] = _file_schedules(raw, source)
        elif key in ("rate_limits", "key_rate_limits"):
            values[key] = _file_rates(raw, source, key)
        elif key == "key_limits":
            values[key] = _file_limits(raw, source, key)
        elif key == "config":
            raise ConfigError(f"config: cannot be set inside the config file ({path})")
        elif key in FILE_KEYS:
            values[key] = parse(BY_NAME[key], raw, source)
        else:
            raise ConfigError(f"{key}: unknown option in {source}{_suggest(key)}")
    return values, limits


def _suggest(key: str) -> str:
    close = get_close_matches(key.replace("-", "_"), sorted(FILE_KEYS), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _file_limits(raw: object, source: str, table: str = "limits") -> dict[str, int]:
    if not isinstance(raw, dict):
        raise ConfigError(f"{table}: expected a table of TYPE = N, got {raw!r} (from {source})")
    return {str(key): _limit(str(key), value, source) for key, value in raw.items()}


def _file_rates(raw: object, source: str, table: str = "rate_limits") -> dict[str, str]:
    """A `[rate_limits]` or `[key_rate_limits]` table: TYPE = "N/s" (checked by `Settings`)."""
    if not isinstance(raw, dict) or not all(isinstance(v, str) for v in raw.values()):
        raise ConfigError(f'{table}: expected a table of TYPE = "N/s", got {raw!r} (from {source})')
    return {str(key): value for key, value in raw.items()}


def _file_schedules(raw: object, source: str) -> tuple[ScheduleSpec, ...]:
    """`[[schedules]]` tables, each a `ScheduleSpec` (checked by `Settings`)."""
    if not isinstance(raw, list):
        raise ConfigError(f"schedules: expected [[schedules]] tables, got {raw!r} (from {source})")
    specs = []
    for i, table in enumerate(raw):
        try:
            specs.append(msgspec.convert(table, ScheduleSpec))
        except msgspec.ValidationError as exc:
            raise ConfigError(f"schedules[{i}]: {exc} (from {source})") from None
    return tuple(specs)


def flag_limits(args: argparse.Namespace | None) -> dict[str, int]:
    """The `--limit TYPE=N` flags."""
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
    problem = check_limit(job_type, value)
    if problem:
        raise ConfigError(f"limits: {problem} (from {source})")
    return value


def check_limit(job_type: str, limit: int) -> str | None:
    """What is wrong with a per-type limit, or None."""
    if not job_type:
        return "a job type name is empty"
    if limit < 1:
        return f"{job_type}: must be at least 1, got {limit}"
    return None
