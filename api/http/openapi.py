"""The OpenAPI 3.1 document, generated from the handlers themselves.

Each handler carries an `@operation(...)` naming its query parameters, headers, request
body and responses as the same msgspec types the code decodes and encodes; `build` walks
the app's router, so a route without a description fails at start-up instead of going
undocumented. The decorator also marks the declared query parameters, which the front
middleware enforces (no wrapper: a handler is called as written).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import msgspec
from aiohttp import web
from goqueue.actors.protocol import ActorInfo
from goqueue.api.http.middleware import API_KEY_HEADER, MUTATING, OPEN_ROUTES
from goqueue.api.http.params import NAME_SCHEMA, QUERY_ATTR, UUID_SCHEMA, QueryParam
from goqueue.api.http.replies import JSON, ErrorOut
from goqueue.supervisor.settings.config import Settings

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

OPENAPI_VERSION = "3.1.0"
REF_PREFIX = "#/components/schemas/"
REF_TEMPLATE = REF_PREFIX + "{name}"
_ATTR = "__goqueue_operation__"
_PATH_PARAM = re.compile(r"\{(\w+)\}")
# \A \Z (anchors), (?P<name> and (?P=name) (named groups), (?i) and kin (inline flags)
_PYTHON_ONLY = re.compile(r"\\[AZ]|\(\?P|\(\?[aiLmsux]")
_PATH_SCHEMAS: Mapping[str, dict[str, Any]] = {"id": UUID_SCHEMA, "name": NAME_SCHEMA}

DESCRIPTIONS: Mapping[int, str] = {
    200: "OK",
    201: "Created; `Location` is the new job's (or workflow's) URL",
    308: "Moved for good; `Location` says where",
    400: "Invalid input; `details` names the field, parameter or header",
    401: "Missing or wrong X-API-Key (when the node has an API key)",
    404: "No such job, workflow, dead letter, schedule or route",
    408: "The request body did not arrive in time (`--body-timeout`)",
    409: "Conflict: a duplicate (with `existing_id`) or a job in the wrong state",
    413: "Request body over the node's limit, or more steps than `--max-workflow-jobs`",
    422: "Idempotency-Key reused with a different job",
    429: "Too many queues (`--max-queues`); `details.field` names the queue; see `Retry-After`",
    503: "Queue full, store unavailable, or node draining; see `Retry-After`",
    504: "The outcome is unknown: the write may have been stored; retry with the same "
    "Idempotency-Key (or read the state first)",
}


@dataclass(frozen=True, slots=True)
class Text:
    """A non-JSON response body."""

    media_type: str


@dataclass(frozen=True, slots=True)
class Header:
    """A request header an operation reads."""

    name: str
    schema: dict[str, Any]
    description: str


@dataclass(frozen=True, slots=True)
class Operation:
    """What `build` needs to describe one handler."""

    summary: str
    responses: Mapping[int, Any]
    errors: tuple[int, ...] = ()
    body: Any = None
    query: Sequence[QueryParam] = ()
    headers: Sequence[Header] = ()
    strict_query: bool = True
    links: Mapping[int, Mapping[str, Any]] | None = None


def operation(
    *,
    responses: Mapping[int, Any],
    errors: Sequence[int] = (),
    body: Any = None,
    query_params: Sequence[QueryParam] = (),
    headers: Sequence[Header] = (),
    strict_query: bool = True,
    links: Mapping[int, Mapping[str, Any]] | None = None,
) -> Callable[[Handler], Handler]:
    """Describe a handler for OpenAPI; with `strict_query`, unknown or repeated query
    parameters are a 400 before it runs. `responses` maps a status to its body type
    (a msgspec type, `Text`, or None for any JSON); `links`, a status to its OpenAPI
    links (the operations its answer leads to)."""

    def describe(handler: Handler) -> Handler:
        summary = (handler.__doc__ or handler.__name__).strip().splitlines()[0]
        op = Operation(
            summary, responses, tuple(errors), body, query_params, headers, strict_query, links
        )
        handler.__dict__[_ATTR] = op
        handler.__dict__[QUERY_ATTR] = tuple(query_params) if strict_query else None
        return handler

    return describe


def build(app: web.Application, settings: Settings) -> dict[str, Any]:
    """The OpenAPI document for every route of `app`, its patterns in ECMA-262 syntax."""
    return cast("dict[str, Any]", portable(describe(app, settings)))


def describe(app: web.Application, settings: Settings) -> dict[str, Any]:
    """The document with the server's own (Python) patterns, as the code matches them."""
    routes: list[tuple[str, str, str, Operation]] = []
    for route in app.router.routes():
        if route.method == "HEAD" or route.resource is None:
            continue  # aiohttp adds HEAD beside each GET
        op = getattr(route.handler, _ATTR, None)
        if not isinstance(op, Operation):
            raise RuntimeError(f"{route.method} {route.resource.canonical} has no @operation")
        name = getattr(route.handler, "__name__", "handler")
        routes.append((route.resource.canonical, route.method.lower(), name, op))
    schemas, components = _components([op for *_, op in routes])
    paths: dict[str, dict[str, Any]] = {}
    for path, method, name, op in routes:
        secured = bool(settings.api_key) and path not in OPEN_ROUTES
        secured = secured and (method.upper() in MUTATING or not settings.public_reads)
        paths.setdefault(path, {})[method] = _operation(path, name, op, schemas, secured)
    document: dict[str, Any] = {
        "openapi": OPENAPI_VERSION,
        "info": {
            "title": "GoQueue",
            "version": "1",
            "description": "A background job processor: enqueue, inspect and manage jobs.",
        },
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {
                "ApiKey": {"type": "apiKey", "in": "header", "name": API_KEY_HEADER}
            },
        },
    }
    return document


class Document:
    """The served document: the routes' (built once), with each typed job type's payload
    schema added for the actors this node runs now (built again after a reload)."""

    def __init__(self, base: dict[str, Any]) -> None:
        self.base = base
        self._for: object = None
        self._encoded = msgspec.json.encode(base)

    def render(self, actors: Mapping[str, ActorInfo]) -> bytes:
        """The document as JSON for `actors` (the catalog's, by type)."""
        if actors is not self._for:
            typed = {n: msgspec.json.decode(a.schema) for n, a in actors.items() if a.schema}
            document = with_payloads(self.base, typed) if typed else self.base
            self._encoded = msgspec.json.encode(portable(document))
            self._for = actors
        return self._encoded


def payload_name(job_type: str) -> str:
    """The component of a job type's payload (a component name allows no `:`)."""
    return "payload." + job_type.replace(":", "_")


def with_payloads(document: dict[str, Any], typed: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
    """`document` with a component per typed job type's payload (`payload.resize`, its
    nested types as `payload.resize.Item`) and POST /jobs's body a union over `type`: one
    variant per typed type, whose payload is that schema, and one for any other type."""
    out = copy.deepcopy(document)
    components: dict[str, Any] = out["components"]["schemas"]
    variants: list[dict[str, Any]] = []
    for job_type, schema in sorted(typed.items()):
        name = payload_name(job_type)
        root = schema.get("$ref", "").removeprefix("#/$defs/")
        names = {d: name if d == root else f"{name}.{d}" for d in schema.get("$defs", {})}
        for d, definition in schema.get("$defs", {}).items():
            components[names[d]] = _rebased(definition, names)
        if not root:
            components[name] = _rebased({k: v for k, v in schema.items() if k != "$defs"}, names)
        variant = "JobSpec." + name.removeprefix("payload.")
        spec = copy.deepcopy(components["JobSpec"])
        spec["title"] = variant
        spec["properties"]["type"] = {"const": job_type}
        spec["properties"]["payload"] = {"$ref": REF_PREFIX + name}
        spec["required"] = sorted({*spec.get("required", []), "type", "payload"})
        components[variant] = spec
        variants.append({"$ref": REF_PREFIX + variant})
    other = copy.deepcopy(components["JobSpec"])
    other["title"] = "JobSpec (any other type)"
    other["properties"]["type"] = {
        **other["properties"]["type"],
        "not": {"enum": sorted(typed)},
    }
    variants.append(other)
    post = out["paths"]["/jobs"]["post"]
    post["requestBody"]["content"][JSON]["schema"] = {"oneOf": variants}
    return out


def _rebased(node: Any, names: Mapping[str, str]) -> Any:
    """A payload schema's `#/$defs/X` refs pointed at its components."""
    if isinstance(node, list):
        return [_rebased(item, names) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: _rebased(value, names) for key, value in node.items()}
    ref = out.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        out["$ref"] = REF_PREFIX + names.get(ref[8:], ref[8:])
    return out


def portable(node: Any) -> Any:
    """The document with every `pattern` in ECMA-262 syntax, as JSON Schema requires.

    The server matches with Python's `re`, where `$` also matches before a trailing newline,
    so its patterns end in `\\Z`; JavaScript's `$` (no `m` flag) already means the very end,
    and reads `\\Z` as a plain `Z`. A pattern using any other Python-only syntax stops
    the document from being built (a test compiles every pattern in both engines)."""
    if isinstance(node, list):
        return [portable(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: portable(value) for key, value in node.items()}
    if isinstance(out.get("pattern"), str):
        out["pattern"] = ecma_pattern(out["pattern"])
    return out


def ecma_pattern(pattern: str) -> str:
    """A Python pattern anchored with `\\A` / `\\Z` in ECMA-262 syntax (`^` / `$`)."""
    if pattern.endswith("\\Z"):
        pattern = pattern[:-2] + "$"
    if pattern.startswith("\\A"):
        pattern = "^" + pattern[2:]
    if _PYTHON_ONLY.search(pattern):
        raise RuntimeError(f"pattern {pattern!r} uses syntax JavaScript reads differently")
    return pattern


def _components(ops: Sequence[Operation]) -> tuple[dict[Any, Any], dict[str, Any]]:
    """Schemas of every body type, as refs into one shared components table."""
    types: list[Any] = [ErrorOut]
    for op in ops:
        for kind in (op.body, *op.responses.values()):
            if kind is not None and not isinstance(kind, Text) and kind not in types:
                types.append(kind)
    refs, components = msgspec.json.schema_components(types, ref_template=REF_TEMPLATE)
    names = {name: name.removesuffix("Out") or name for name in components}
    renamed_refs = [_renamed(ref, names) for ref in refs]
    renamed = {names[name]: _renamed(schema, names) for name, schema in components.items()}
    return dict(zip(types, renamed_refs, strict=True)), renamed


def _renamed(node: Any, names: Mapping[str, str]) -> Any:
    """`JobOut` is `Job` to a client: drop the suffix from names, titles and refs."""
    if isinstance(node, list):
        return [_renamed(item, names) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: _renamed(value, names) for key, value in node.items()}
    ref = out.get("$ref")
    if isinstance(ref, str) and ref.startswith(REF_PREFIX):
        out["$ref"] = REF_PREFIX + names.get(ref[len(REF_PREFIX) :], ref[len(REF_PREFIX) :])
    if isinstance(out.get("title"), str):
        out["title"] = names.get(out["title"], out["title"])
    return out


def _operation(
    path: str, name: str, op: Operation, schemas: Mapping[Any, Any], secured: bool
) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "operationId": name,
        "summary": op.summary,
        "tags": [_tag(path)],
        "parameters": _parameters(path, op),
        "responses": _responses(path, op, schemas, secured),
    }
    if op.body is not None:
        content = {JSON: {"schema": schemas[op.body]}}
        doc["requestBody"] = {"required": True, "content": content}
    if secured:
        doc["security"] = [{"ApiKey": []}]
    return doc


def _tag(path: str) -> str:
    """Group operations by their path's first segment (`jobs`, `dlq`, `queues`, ...)."""
    return path.strip("/").split("/")[0] or "ops"


def _parameters(path: str, op: Operation) -> list[dict[str, Any]]:
    params = [
        {"name": name, "in": "path", "required": True, "schema": _PATH_SCHEMAS.get(name, {})}
        for name in _PATH_PARAM.findall(path)
    ]
    params += [
        {"name": p.name, "in": "query", "description": p.description, "schema": p.schema()}
        for p in op.query
    ]
    params += [
        {"name": h.name, "in": "header", "description": h.description, "schema": h.schema}
        for h in op.headers
    ]
    return params


def _responses(
    path: str, op: Operation, schemas: Mapping[Any, Any], secured: bool
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for status, kind in op.responses.items():
        if isinstance(kind, Text):
            content = {kind.media_type: {"schema": {"type": "string"}}}
        else:
            content = {JSON: {"schema": schemas[kind] if kind is not None else {}}}
        out[str(status)] = {"description": DESCRIPTIONS.get(status, "OK"), "content": content}
        if op.links and status in op.links:
            out[str(status)]["links"] = dict(op.links[status])
    errors = set(op.errors)
    if op.body is not None:
        errors |= {400, 413}
    if op.strict_query or op.query or _PATH_PARAM.search(path):
        errors.add(400)
    if secured:
        errors.add(401)
    error = {JSON: {"schema": schemas[ErrorOut]}}
    for status in sorted(errors):
        out[str(status)] = {"description": DESCRIPTIONS[status], "content": error}
    out["default"] = {"description": "Unexpected error", "content": error}
    return out
