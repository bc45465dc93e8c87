"""Reading a request: path ids, query parameters, headers and JSON bodies.

Each query parameter is one small object that both parses itself (400 naming it on bad
input) and describes itself for the OpenAPI document, so the two cannot disagree.
Nothing here touches the engine: a request is fully checked before any state changes.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol, TypeVar

import msgspec
from aiohttp import web
from goqueue.api.http.replies import SPEC_DECODER, ApiError, bad_request
from goqueue.api.http.strict import check_raw_query, check_spec_text, check_utf8, header_text
from goqueue.api.wire import MAX_WAIT_SECONDS, error_field
from goqueue.supervisor.common.jobs import STATUSES, AwareTime, JobSpec, spec_problem
from goqueue.supervisor.webhooks.egress import EgressPolicy

T = TypeVar("T")

MAX_LIMIT = 1000
DEFAULT_LIMIT = 50
MAX_OFFSET = 2**31 - 1
MAX_IDEMPOTENCY_KEY = 200
IDEMPOTENCY_HEADER = "Idempotency-Key"
# On a handler: the query parameters it takes, checked before it runs (`front_middleware`).
QUERY_ATTR = "__goqueue_query__"

# Matched with `fullmatch`: `$` alone would let a trailing newline through.
_UUID = re.compile(r"[0-9a-fA-F]{8}-(?:[0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}")
_NAME = re.compile(r"[A-Za-z0-9_.:\-]{1,200}")
_DIGITS = re.compile(r"[0-9]{1,12}")
_DECIMAL = re.compile(r"[0-9]{1,6}(?:\.[0-9]{1,6})?")

# `\Z` as the server means it (`fullmatch`); the served document writes it `$` (ECMA-262).
NAME_SCHEMA: dict[str, Any] = {"type": "string", "pattern": f"^{_NAME.pattern}\\Z"}
UUID_SCHEMA: dict[str, Any] = {"type": "string", "format": "uuid"}
_BOOLS = {"true": True, "1": True, "false": False, "0": False}


class QueryParam(Protocol):
    """A query parameter that parses and documents itself."""

    @property
    def name(self) -> str:
        """Its name in the query string."""
        ...

    @property
    def description(self) -> str:
        """What it does, for OpenAPI."""
        ...

    def schema(self) -> dict[str, Any]:
        """Its JSON Schema, for OpenAPI."""
        ...


@dataclass(frozen=True, slots=True)
class IntParam:
    """An integer in `[low, high]`, plain decimal digits only."""

    name: str
    default: int
    low: int
    high: int
    description: str

    def parse(self, query: Mapping[str, str]) -> int:
        """The value, or the default when absent."""
        raw = query.get(self.name)
        if raw is None:
            return self.default
        if not _DIGITS.fullmatch(raw) or not self.low <= int(raw) <= self.high:
            raise bad_request(
                f"{self.name} must be an integer from {self.low} to {self.high}, got {raw!r}",
                parameter=self.name,
            )
        return int(raw)

    def schema(self) -> dict[str, Any]:
        """Its JSON Schema, for OpenAPI."""
        return {
            "type": "integer",
            "minimum": self.low,
            "maximum": self.high,
            "default": self.default,
        }


@dataclass(frozen=True, slots=True)
class ChoiceParam:
    """One of a fixed set of strings, or absent."""

    name: str
    choices: tuple[str, ...]
    description: str

    def parse(self, query: Mapping[str, str]) -> str | None:
        """The value, or None when absent."""
        raw = query.get(self.name)
        if raw is not None and raw not in self.choices:
            raise bad_request(
                f"{self.name} must be one of {', '.join(self.choices)}, got {raw!r}",
                parameter=self.name,
            )
        return raw

    def schema(self) -> dict[str, Any]:
        """Its JSON Schema, for OpenAPI."""
        return {"enum": list(self.choices)}


@dataclass(frozen=True, slots=True)
class NameParam:
    """A type or queue name (the same rule as in a job), or absent."""

    name: str
    description: str

    def parse(self, query: Mapping[str, str]) -> str | None:
        """The value, or None when absent."""
        raw = query.get(self.name)
        if raw is not None and not _NAME.fullmatch(raw):
            raise bad_request(
                f"{self.name} must be 1-200 characters of A-Z a-z 0-9 _ . : -, got {raw[:50]!r}",
                parameter=self.name,
            )
        return raw

    def schema(self) -> dict[str, Any]:
        """Its JSON Schema, for OpenAPI."""
        return dict(NAME_SCHEMA)


@dataclass(frozen=True, slots=True)
class BoolParam:
    """`true`/`false`/`1`/`0`, or absent (the default)."""

    name: str
    description: str
    default: bool = False

    def parse(self, query: Mapping[str, str]) -> bool:
        """The value, the default when absent."""
        raw = query.get(self.name)
        if raw is None:
            return self.default
        value = _BOOLS.get(raw.lower())
        if value is None:
            raise bad_request(
                f"{self.name} must be true, false, 1 or 0, got {raw[:50]!r}", parameter=self.name
            )
        return value

    def schema(self) -> dict[str, Any]:
        """Its JSON Schema, for OpenAPI."""
        return {"type": "boolean", "default": self.default}


@dataclass(frozen=True, slots=True)
class SecondsParam:
    """A number of seconds from 0 to `high` (plain decimal: `5`, `0.5`), or absent."""

    name: str
    high: float
    description: str

    def parse(self, query: Mapping[str, str]) -> float | None:
        """The value, or None when absent."""
        raw = query.get(self.name)
        if raw is None:
            return None
        if not _DECIMAL.fullmatch(raw) or float(raw) > self.high:
            raise bad_request(
                f"{self.name} must be a number of seconds from 0 to {self.high:g}, "
                f"got {raw[:50]!r}",
                parameter=self.name,
            )
        return float(raw)

    def schema(self) -> dict[str, Any]:
        """Its JSON Schema, for OpenAPI."""
        return {"type": "number", "minimum": 0, "maximum": self.high}


@dataclass(frozen=True, slots=True)
class TextParam:
    """Free text of 1 to `max_length` characters, or absent."""

    name: str
    max_length: int
    description: str

    def parse(self, query: Mapping[str, str]) -> str | None:
        """The value, or None when absent."""
        raw = query.get(self.name)
        if raw is not None and not 1 <= len(raw) <= self.max_length:
            raise bad_request(
                f"{self.name} must be 1 to {self.max_length} characters", parameter=self.name
            )
        return raw

    def schema(self) -> dict[str, Any]:
        """Its JSON Schema, for OpenAPI."""
        return {"type": "string", "minLength": 1, "maxLength": self.max_length}


@dataclass(frozen=True, slots=True)
class TimeParam:
    """An RFC 3339 time with its offset (`2030-01-31T09:00:00Z`), or absent."""

    name: str
    description: str

    def parse(self, query: Mapping[str, str]) -> datetime | None:
        """The value, or None when absent."""
        raw = query.get(self.name)
        if raw is None:
            return None
        try:
            return msgspec.convert(raw, AwareTime)
        except msgspec.ValidationError:
            raise bad_request(
                f"{self.name} must be an RFC 3339 time with an offset "
                f"(2030-01-31T09:00:00Z), got {raw[:50]!r}",
                parameter=self.name,
            ) from None

    def schema(self) -> dict[str, Any]:
        """Its JSON Schema, for OpenAPI."""
        return {"type": "string", "format": "date-time"}


LIMIT = IntParam("limit", DEFAULT_LIMIT, 1, MAX_LIMIT, "page size")
OFFSET = IntParam("offset", 0, 0, MAX_OFFSET, "items to skip")
STATUS = ChoiceParam("status", STATUSES, "only jobs in this status")
TYPE = NameParam("type", "only jobs of this type")
QUEUE = NameParam("queue", "only jobs in this queue")
FORCE = BoolParam("force", "also cancel a running job (its worker is killed; no retry)")
WAIT = SecondsParam(
    "wait",
    MAX_WAIT_SECONDS,
    "answer as soon as the job is done, failed or cancelled, or after this many seconds "
    "with its state then",
)
STRICT = BoolParam(
    "strict",
    "false: accept a job type no live node has registered yet (producers deploying ahead "
    "of their consumers); the job waits until a node runs that actor",
    default=True,
)

ERROR = TextParam("error", 200, "only dead letters whose last error contains this (any case)")
BEFORE = TimeParam("before", "only dead letters written before this time (RFC 3339)")
AFTER = TimeParam("after", "only dead letters written after this time (RFC 3339)")

PAGE = (LIMIT, OFFSET)
CONCURRENCY_KEY = TextParam("concurrency_key", 200, "only jobs with this flow-control key")
JOB_FILTERS = (TYPE, STATUS, QUEUE, CONCURRENCY_KEY, LIMIT, OFFSET)


def check_query(request: web.Request, params: Sequence[QueryParam]) -> None:
    """Refuse undecodable, unknown or repeated query parameters (a misspelt filter must not
    silently list everything)."""
    check_raw_query(request.rel_url.raw_query_string)
    raw = request.query
    allowed = {p.name for p in params}
    for name in raw:
        if name not in allowed:
            expected = ", ".join(sorted(allowed)) or "none"
            raise bad_request(
                f"unknown query parameter {name[:50]!r} (expected: {expected})", parameter=name[:50]
            )
        if len(raw.getall(name)) > 1:
            raise bad_request(f"query parameter {name!r} is given more than once", parameter=name)


def path_id(request: web.Request, what: str = "job") -> str:
    """The `{id}` path segment as a canonical (lower-case) UUID; 400 when it is not one."""
    raw = request.match_info["id"]
    if not _UUID.fullmatch(raw):
        raise bad_request(f"{what} id must be a UUID, got {raw[:50]!r}", parameter="id")
    return raw.lower()


def queue_name(request: web.Request) -> str:
    """The `{name}` path segment, checked like a job's queue name."""
    raw = request.match_info["name"]
    if not _NAME.fullmatch(raw):
        raise bad_request(
            f"queue name must be 1-200 characters of A-Z a-z 0-9 _ . : -, got {raw[:50]!r}",
            parameter="name",
        )
    return raw


def idempotency_key(request: web.Request) -> str | None:
    """The Idempotency-Key header (1-200 characters), or None."""
    values = request.headers.getall(IDEMPOTENCY_HEADER, [])
    if not values:
        return None
    key = values[0]
    if len(values) > 1 or not 1 <= len(key) <= MAX_IDEMPOTENCY_KEY:
        raise bad_request(
            f"{IDEMPOTENCY_HEADER} must be one value of 1 to {MAX_IDEMPOTENCY_KEY} characters",
            header=IDEMPOTENCY_HEADER,
        )
    return header_text(IDEMPOTENCY_HEADER, key)


async def read_body(request: web.Request, max_bytes: int, timeout: float) -> bytes:
    """The raw body; 413 (by Content-Length, before reading) when it is too large, 408 when
    it does not arrive within `timeout` seconds (a slow sender holds a connection)."""
    length = request.content_length
    if length is not None and length > max_bytes:
        raise too_large(max_bytes)
    if request.content.is_eof():  # the whole body came with the headers: no wait, no timer
        return await request.read()
    try:
        async with asyncio.timeout(timeout):
            return await request.read()  # aiohttp's client_max_size guards chunked bodies
    except TimeoutError:
        raise ApiError(
            408, f"the request body did not arrive within {timeout:g} s", close=True
        ) from None


def too_large(max_bytes: int) -> ApiError:
    """The 413 answer."""
    return ApiError(413, f"request body exceeds {max_bytes} bytes", {"max_bytes": max_bytes})


def decode(decoder: msgspec.json.Decoder[T], body: bytes, prefix: str = "") -> T:
    """Decode and validate a JSON document; a 400 naming the field on failure (`prefix`
    in front of its path, for an item of a batch). Text is checked for invalid UTF-8 by
    msgspec, except inside raw values (a payload): `check_utf8` covers those."""
    what = f"{prefix.rstrip('.')} is" if prefix else "request body is"
    if not body.strip():
        raise bad_request(f"{what} empty; expected a JSON object", **_field(prefix))
    try:
        return decoder.decode(body)
    except msgspec.ValidationError as exc:
        message, field = _located(str(exc), prefix)
        raise bad_request(message, **({"field": field} if field else {})) from None
    except msgspec.DecodeError as exc:
        raise bad_request(f"{what} not valid JSON: {_why(exc, body)}", **_field(prefix)) from None
    except RecursionError:
        raise bad_request(f"{what} nested too deeply", **_field(prefix)) from None


# A `\uD800`-`\uDFFF` escape not part of a pair: JSON's grammar lets it through, but it is
# no character, so no UTF-8 text can hold it (msgspec says only "Input data was truncated").
_LONE_SURROGATE = re.compile(
    rb"(?<!\\)(?:\\\\)*(\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})"
    rb"|(?<!\\u[dD][89abAB][0-9a-fA-F]{2})\\u[dD][c-fC-F][0-9a-fA-F]{2})"
)


def _why(exc: msgspec.DecodeError, body: bytes) -> str:
    """msgspec's reason a body is not JSON, or the lone surrogate it tripped on."""
    lone = _LONE_SURROGATE.search(body)
    if lone is not None and "truncated" in str(exc):
        escape = lone.group(1).decode()
        return f"{escape} is half of a UTF-16 surrogate pair, not a character"
    return str(exc)


def decode_spec(body: bytes, egress: EgressPolicy, prefix: str = "") -> JobSpec:
    """One job from its JSON: valid UTF-8 throughout, decoded, checked across fields and
    against the node's egress policy."""
    if not body.isascii():  # (ASCII is UTF-8 already: most bodies need no look)
        check_utf8(body, prefix)
    spec = decode(SPEC_DECODER, body, prefix)
    check_spec(spec, egress, prefix)
    if spec.dedupe_key or spec.webhook_url or spec.on_success or spec.on_failure:
        check_spec_text(spec, prefix)  # (the text it checks)
    return spec


def _field(prefix: str) -> dict[str, str]:
    return {"field": prefix.rstrip(".")} if prefix else {}


def _located(message: str, prefix: str) -> tuple[str, str | None]:
    """msgspec's message with its `$.path` rebased under `prefix`, and the field path."""
    message = message.replace("\\Z'", "$'")  # patterns as the OpenAPI document shows them
    field = error_field(message)
    if prefix:
        message = message.replace("`$", f"`$.{prefix.rstrip('.')}", 1)
        field = prefix + field if field else prefix.rstrip(".")
    return message, field


def check_spec(spec: JobSpec, egress: EgressPolicy, prefix: str = "") -> None:
    """Rules across fields that a schema cannot state, templates included, and the egress
    policy on `webhook_url` (400 naming the field; the rules themselves are
    `spec_problem`'s, which `goqueue.pg` and the client apply too)."""
    problem = spec_problem(spec, prefix, url_refusal=egress.url_refusal)
    if problem is not None:
        message, field = problem
        raise bad_request(message, field=field)
