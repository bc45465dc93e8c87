"""What an option of a node is: its name, kind, allowed range and meaning, how a value
is parsed from a flag or a variable and checked, and how it is documented. The options
themselves are the table in `options.py`."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

ENV_PREFIX = "GOQUEUE_"
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})

Kind = Literal["str", "int", "float", "bool", "list", "bounds"]
EXPECTED: Mapping[str, str] = MappingProxyType(
    {
        "str": "a string",
        "int": "an integer",
        "float": "a number",
        "bool": "a boolean (1/true/yes or 0/false/no)",
        "list": "a comma-separated list",
        "bounds": "an integer N or a range MIN:MAX",
    }
)
TomlValue = str | int | float | bool | tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Option:
    """One scalar or list option: how to parse it, what range it allows, how to document it."""

    name: str
    kind: Kind
    help: str
    metavar: str | None = None
    optional: bool = False  # None (unset) is allowed; an empty flag or variable means unset
    when_unset: str | None = None  # what leaving an optional option unset means
    example: TomlValue | None = None  # shown in the example file where no default can be
    secret: bool = False  # better kept in the environment than in a file
    minimum: float | None = None
    above_minimum: bool = False  # True: the value must be strictly greater than `minimum`
    maximum: float | None = None
    choices: tuple[str, ...] | None = None
    legacy_env: str | None = None
    repeatable: bool = False  # a list flag that may be given more than once

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()

    @property
    def envs(self) -> tuple[str, ...]:
        """Every variable that sets it, the winning spelling first."""
        return (self.env, self.legacy_env) if self.legacy_env else (self.env,)

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
        if self.kind == "bounds" and isinstance(value, tuple):
            low, high = value
            if low > high:
                return f"MIN must not exceed MAX, got {low}:{high}"
            return self._check_number(low) or self._check_number(high)
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
        if self.kind == "bounds":
            return _bounds(text)
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
        if self.kind in ("int", "bounds") and isinstance(raw, int):
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


def _bounds(text: str) -> int | tuple[int, int]:
    """`N` (a fixed count) or `MIN:MAX` (a range; `N:N` is the fixed count N)."""
    low, colon, high = text.partition(":")
    if not colon:
        return int(text)
    bounds = int(low), int(high)
    return bounds[0] if bounds[0] == bounds[1] else bounds
