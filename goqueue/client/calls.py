"""What a call to a node is, and how it travels, without I/O.

A `Call` is one request (method, path, body, headers, whether sending it twice is
harmless) and a function reading its successful answer. Here too: where the node is
(`Endpoint`, `url_from`, `key_from`), the headers every request carries, reading an
answer or the typed error it stands for, and when a failed call may be sent again
(`Retries`, `may_retry`). The API's operations, each a `Call`, are in `core`.
"""

from __future__ import annotations

import os
import random
import sys
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import msgspec
from goqueue.api.wire import ErrorOut
from goqueue.client.errors import (
    ClientError,
    ConnectionFailed,
    OutcomeUnknown,
    RequestError,
    Unavailable,
    UnexpectedAnswer,
    error_for,
)
from goqueue.supervisor.common.backoff import backoff

T = TypeVar("T")


DEFAULT_URL = "http://127.0.0.1:8080"
# longer than a node waits on its store (10 s), so the client hears the node's 503 or
# 504 instead of giving up first, not knowing which
DEFAULT_TIMEOUT = 15.0
URL_ENV = "GOQUEUE_URL"
KEY_ENVS = ("GOQUEUE_API_KEY", "API_KEY")  # as the node reads its key
API_KEY_HEADER = "X-API-Key"
USER_AGENT = "goqueue-python"


# -- where and how -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A node's base URL, split for `http.client` (and joined again for aiohttp)."""

    url: str
    scheme: str
    host: str
    port: int
    path: str  # a prefix for every route ("" or "/goqueue", behind a proxy)

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        """Check and split `http(s)://HOST[:PORT][/PREFIX]`; ValueError if it is not."""
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"invalid URL {url!r}: expected http://HOST[:PORT]")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            raise ValueError(f"invalid URL {url!r}: bad port") from None
        if parts.query or parts.fragment:
            raise ValueError(f"invalid URL {url!r}: no query or fragment expected")
        return cls(url.rstrip("/"), parts.scheme, parts.hostname, port, parts.path.rstrip("/"))


def url_from(url: str | None) -> str:
    """The node's URL: the argument, else $GOQUEUE_URL, else http://127.0.0.1:8080."""
    return url or os.environ.get(URL_ENV) or DEFAULT_URL


def key_from(api_key: str | None) -> str | None:
    """The API key: the argument, else $GOQUEUE_API_KEY, else $API_KEY (none: None)."""
    return api_key or next((os.environ[k] for k in KEY_ENVS if os.environ.get(k)), None)


@dataclass(frozen=True, slots=True)
class Retries:
    """How a request that is safe to send again is retried after a 503, a 504 or a
    dropped connection: at most `attempts` more times, waiting the project's one backoff
    (`base * 2^(n-1)`, capped, jittered), or the node's Retry-After when that is longer
    (still capped). A request refused before reaching the node is always safe."""

    attempts: int = 3
    base: float = 0.2
    cap: float = 5.0
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)

    def delay(self, retry: int, error: ClientError) -> float:
        """Seconds before retry number `retry` (from 1) after `error`."""
        wait = backoff(retry, self.base, self.cap, self.rng)
        if isinstance(error, Unavailable) and error.retry_after is not None:
            wait = max(wait, min(error.retry_after, self.cap))
        return wait

    def pause(self, call: Call[Any], error: ClientError, retry: int) -> float | None:
        """Seconds before retry number `retry` (from 1) of `call` after `error`, or None
        when it is not sent again (no retries left, or not safe to repeat)."""
        if retry > self.attempts or not may_retry(call, error):
            return None
        return self.delay(retry, error)


class BaseClient:
    """What `Client` and `AsyncClient` are set up with: the node (`url`, else
    $GOQUEUE_URL, else http://127.0.0.1:8080), its API key (else $GOQUEUE_API_KEY, else
    $API_KEY), each request's timeout in seconds, and how failed requests are retried."""

    def __init__(
        self, url: str | None, api_key: str | None, timeout: float, retries: Retries | None
    ) -> None:
        self.endpoint = Endpoint.parse(url_from(url))
        self.api_key = key_from(api_key)
        self.timeout = timeout
        self.retries = retries or Retries()

    @property
    def url(self) -> str:
        """The node's base URL."""
        return self.endpoint.url

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"


def may_retry(call: Call[Any], error: ClientError) -> bool:
    """True if `call` can be sent again after `error` without doing anything twice."""
    if isinstance(error, ConnectionFailed):
        return not error.timed_out and (not error.sent or call.safe)
    return isinstance(error, Unavailable | OutcomeUnknown) and call.safe


# -- calls ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """One request and how to read its successful answer (`read(status, body)`)."""

    method: str
    path: str  # quoted, with its query string, below the endpoint's prefix
    read: Callable[[int, bytes], T]
    body: bytes | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    safe: bool = False  # sending it twice does no harm (reads, keyed enqueues, pause)
    wait: float = 0.0  # seconds the node may hold the answer back (added to the timeout)


def headers(api_key: str | None, call: Call[Any]) -> dict[str, str]:
    """The headers of one request."""
    sent = {"Accept": "application/json", "User-Agent": USER_AGENT, **call.headers}
    if call.body is not None:
        sent["Content-Type"] = "application/json"
    if api_key:
        sent[API_KEY_HEADER] = api_key
    if "opentelemetry.trace" in sys.modules:  # the application traces: join its trace
        from opentelemetry import propagate

        propagate.inject(sent)
    return sent


def answer(call: Call[T], status: int, body: bytes, retry_after: str | None) -> T:
    """The result of `call` from the node's answer, or the error it stands for."""
    if status >= 400:
        raise refusal(status, body, retry_after)
    try:
        return call.read(status, body)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise UnexpectedAnswer(
            f"{call.method} {call.path}: the answer is not what the API describes ({exc})"
        ) from None


_ERROR = msgspec.json.Decoder(ErrorOut)


def refusal(status: int, body: bytes, retry_after: str | None = None) -> RequestError:
    """The typed error for an error answer (`{"error", "details", "existing_id"}`)."""
    try:
        error = _ERROR.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        text = body[:200].decode(errors="replace").strip()
        return error_for(status, text or f"HTTP {status}", retry_after=_seconds(retry_after))
    existing = error.existing_id if isinstance(error.existing_id, str) else None
    return error_for(
        status,
        error.error,
        error.details,
        existing_id=existing,
        retry_after=_seconds(retry_after),
    )


def _seconds(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None  # an HTTP date: not worth parsing here


def decoder(kind: type[T]) -> Callable[[int, bytes], T]:
    """A `Call.read` decoding the answer's body as `kind`."""
    decode = msgspec.json.Decoder(kind).decode
    return lambda status, body: decode(body)


def quote(segment: str) -> str:
    """A path segment, quoted so an id or queue name can never change the path."""
    return urllib.parse.quote(segment, safe="")


def with_query(path: str, query: Mapping[str, object]) -> str:
    """`path?a=1&b=2` from the items that are not None (booleans in lower case)."""
    items = {
        k: (str(v).lower() if isinstance(v, bool) else str(v))
        for k, v in query.items()
        if v is not None
    }
    return f"{path}?{urllib.parse.urlencode(items)}" if items else path
