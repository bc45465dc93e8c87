"""The three middlewares, outermost first: metrics, errors, auth.

Metrics is outermost so it records the status a client really got, including the error
answers the errors middleware builds; auth is innermost so its 401 is such an answer too.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Middleware
from goqueue.api.errors import ApiError, from_domain
from goqueue.api.params import too_large
from goqueue.supervisor.errors import GoQueueError
from goqueue.supervisor.metrics import Metrics

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


def metrics_middleware(metrics: Metrics) -> Middleware:
    """Count every answer by route, method and status, and time it."""

    @web.middleware
    async def record(request: web.Request, handler: Handler) -> web.StreamResponse:
        started = time.perf_counter()
        status = 500
        try:
            response = await handler(request)
            status = response.status
            return response
        except asyncio.CancelledError:
            status = CLIENT_CLOSED
            raise
        finally:
            method = request.method if request.method in KNOWN_METHODS else "other"
            metrics.http(route_of(request), method, status, time.perf_counter() - started)

    return record


def errors_middleware(max_body_bytes: int) -> Middleware:
    """Turn every failure into `{"error", "details"}`: ours, the engine's, aiohttp's own
    (404, 405, 413) and, as a last resort, a logged 500."""

    @web.middleware
    async def answer(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except ApiError as exc:
            return exc.response()
        except GoQueueError as exc:
            mapped = from_domain(exc)
            if mapped is None:
                return fault(request, exc)
            return mapped.response()
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            return http_error(request, exc, max_body_bytes).response()
        except Exception as exc:
            return fault(request, exc)

    return answer


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
    """A bug or an unexpected failure: logged with its traceback, counted as a 500 by the
    metrics middleware, and answered without internals."""
    log.error(
        "unhandled error answering %s %s",
        request.method,
        request.path,
        exc_info=exc,
        extra={"route": route_of(request)},
    )
    return ApiError(500, "internal server error").response()


def auth_middleware(api_key: str, public_reads: bool) -> Middleware:
    """Require `X-API-Key` on every request (only on mutating ones with `public_reads`);
    /health, /ready, /metrics and the dashboard's files stay open for probes, scrapers and
    browsers (the dashboard asks for the key before it reads anything)."""
    expected = api_key.encode()

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if needs_key(request, public_reads):
            given = request.headers.get(API_KEY_HEADER, "").encode("utf-8", "surrogateescape")
            if not hmac.compare_digest(given, expected):
                raise ApiError(
                    401, f"missing or wrong {API_KEY_HEADER}", {"header": API_KEY_HEADER}
                )
        return await handler(request)

    return check


def needs_key(request: web.Request, public_reads: bool) -> bool:
    """Whether this request must carry the API key."""
    if route_of(request) in OPEN_ROUTES:
        return False
    return request.method in MUTATING or not public_reads
