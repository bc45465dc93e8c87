"""The one middleware every request passes through (`front_middleware`).

It does, in one layer and one coroutine, what used to be four wrapped around each other:
tell the connection guard a request's handler runs, check the API key (when the node has
one), refuse unknown or repeated query parameters (as the route's `@operation` declares),
turn every failure into `{"error", "details"}`, and count and time the answer by route,
method and status. The status counted is the one the client really got, error answers
included; the key is checked before the query, so a 401 comes before any 400.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from aiohttp import web
from aiohttp.typedefs import Middleware
from goqueue.api.http.params import QUERY_ATTR, QueryParam, check_query, too_large
from goqueue.api.http.replies import ApiError, from_domain
from goqueue.supervisor.common.errors import GoQueueError
from goqueue.supervisor.observe.metrics import Metrics

if TYPE_CHECKING:
    from goqueue.api.http.connections import ConnectionGuard

log = logging.getLogger("goqueue.api")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

API_KEY_HEADER = "X-API-Key"
MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
KNOWN_METHODS = frozenset({"GET", "HEAD", "OPTIONS", *MUTATING})
OPEN_ROUTES = frozenset({"/health", "/ready", "/metrics", "/ui", "/ui/{path}"})  # + dashboard files
UNMATCHED = "unmatched"
CLIENT_CLOSED = 499  # nginx's code for a request the client gave up on


def route_of(request: web.Request) -> str:
    """The route template (`/jobs/{id}`), never the raw path: metric labels stay bounded."""
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else UNMATCHED


@dataclass(frozen=True, slots=True)
class RouteInfo:
    """What the front middleware needs to know about one route, looked up once."""

    label: str  # the route template, or UNMATCHED
    query: Sequence[QueryParam] | None  # the parameters it takes; None: not checked
    open: bool  # reachable without the API key


_UNMATCHED = RouteInfo(UNMATCHED, None, False)


def route_info(request: web.Request) -> RouteInfo:
    """The route's label, declared query parameters and openness (uncached)."""
    match_info = request.match_info
    resource = match_info.route.resource
    if resource is None:
        return _UNMATCHED
    label = resource.canonical
    query = getattr(match_info.handler, QUERY_ATTR, None)
    return RouteInfo(label, query, label in OPEN_ROUTES)


def front_middleware(
    metrics: Metrics,
    max_body_bytes: int,
    guard: ConnectionGuard | None = None,
    api_key: str | None = None,
    public_reads: bool = False,
) -> Middleware:
    """The single layer around every handler (see the module's docstring). `api_key`
    None or empty: no key is required."""
    expected = api_key.encode() if api_key else None
    routes: dict[object, RouteInfo] = {}  # by aiohttp route object; routes are fixed
    perf_counter = time.perf_counter
    record = metrics.http

    def info_of(request: web.Request) -> RouteInfo:
        route = request.match_info.route
        info = routes.get(route)
        if info is None:
            info = route_info(request)
            if info is not _UNMATCHED:  # a 404 or 405 gets a fresh route object each time
                routes[route] = info
        return info

    @web.middleware
    async def front(request: web.Request, handler: Handler) -> web.StreamResponse:
        started = perf_counter()
        transport = request.transport
        if guard is not None:
            guard.busy(transport)
        info = _UNMATCHED
        status = 500
        try:
            info = info_of(request)
            try:
                if expected is not None and not info.open:
                    check_key(request, expected, public_reads)
                if info.query is not None and request.query_string:
                    check_query(request, info.query)
                response = await handler(request)
            except Exception as exc:  # every failure gets a JSON answer
                response = error_response(request, exc, max_body_bytes)
            status = response.status
            return response
        except web.HTTPException as exc:  # a redirect, re-raised for aiohttp to send
            status = exc.status
            raise
        except asyncio.CancelledError:
            status = CLIENT_CLOSED
            raise
        finally:
            if guard is not None:
                guard.idle(transport)
            method = request.method
            method = method if method in KNOWN_METHODS else "other"
            record(info.label, method, status, perf_counter() - started)

    return front


def error_response(request: web.Request, exc: Exception, max_body_bytes: int) -> web.Response:
    """The JSON answer to a failure: ours, the engine's, aiohttp's own (404, 405, 413) and,
    as a last resort, a logged 500. A redirect (an HTTPException below 400) is re-raised."""
    if isinstance(exc, ApiError):
        return exc.response()
    if isinstance(exc, GoQueueError):
        mapped = from_domain(exc)
        return fault(request, exc) if mapped is None else mapped.response()
    if isinstance(exc, web.HTTPException):
        if exc.status < 400:
            raise exc
        return http_error(request, exc, max_body_bytes).response()
    return fault(request, exc)


def check_key(request: web.Request, expected: bytes, public_reads: bool) -> None:
    """401 unless the request carries the key (reads are free with `public_reads`)."""
    if public_reads and request.method not in MUTATING:
        return
    given = request.headers.get(API_KEY_HEADER, "").encode("utf-8", "surrogateescape")
    if not hmac.compare_digest(given, expected):
        raise ApiError(401, f"missing or wrong {API_KEY_HEADER}", {"header": API_KEY_HEADER})


def http_error(request: web.Request, exc: web.HTTPException, max_body_bytes: int) -> ApiError:
    """aiohttp's exceptions in our error format."""
    if isinstance(exc, web.HTTPRequestEntityTooLarge):
        return too_large(max_body_bytes)
    if isinstance(exc, web.HTTPMethodNotAllowed):
        allowed = sorted(exc.allowed_methods)
        message = f"{request.method} is not allowed on {request.path}"
        return ApiError(405, message, {"allowed": allowed}, headers={"Allow": ",".join(allowed)})
    if isinstance(exc, web.HTTPNotFound):
        return ApiError(404, f"no route for {request.method} {request.path}")
    return ApiError(exc.status, exc.text or exc.reason)


def fault(request: web.Request, exc: Exception) -> web.Response:
    """A bug or an unexpected failure: logged with its traceback, counted as a 500, and
    answered without internals."""
    log.error(
        "unhandled error answering %s %s",
        request.method,
        request.path,
        exc_info=exc,
        extra={"route": route_of(request)},
    )
    return ApiError(500, "internal server error").response()
