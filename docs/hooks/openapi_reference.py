"""MkDocs hook: the HTTP reference page, written from the node's own OpenAPI document.

`reference/http.md` holds a marker; at build time it is replaced by one section per
operation (parameters, request body, responses) and one per schema, all read from the
document a node serves at `/openapi.json`, so the reference cannot drift from the code.
The document is built from the routes alone (no engine, store or server is started).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from aiohttp import web
from goqueue.api.http import openapi
from goqueue.api.http.app import ROUTE_TABLES
from goqueue.supervisor.settings import config

MARKER = "<!-- openapi-reference -->"
PAGE = "reference/http.md"
METHODS = ("get", "post", "put", "patch", "delete")
# Section titles by OpenAPI tag (a route's first path segment); tags not named keep theirs.
PROBES = "Probes, metrics and this document"
TAG_TITLES = {
    "dlq": "Dead letters",
    "summary": "Dashboard summaries",
    "ui": "Dashboard",
    "health": PROBES,
    "ready": PROBES,
    "metrics": PROBES,
    "openapi.json": PROBES,
}
# Built as for a node with an API key, so the reference says which routes need it.
DOCUMENTED_SETTINGS = {"GOQUEUE_API_KEY": "documented"}


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    """Replace the marker of the HTTP reference page with the generated reference."""
    if page.file.src_uri != PAGE:
        return markdown
    if MARKER not in markdown:
        raise RuntimeError(f"{PAGE} lost its marker {MARKER}")
    return markdown.replace(MARKER, reference(document()))


def document() -> dict[str, Any]:
    """The OpenAPI document a node with default settings (and an API key) serves."""
    app = web.Application()
    for table in ROUTE_TABLES:
        app.router.add_routes(table)
    built: dict[str, Any] = openapi.build(app, config.load(None, DOCUMENTED_SETTINGS))
    return built


def reference(doc: Mapping[str, Any]) -> str:
    """The Markdown of every operation, grouped by tag, then every schema."""
    by_title: dict[str, list[str]] = {}
    for path, item in doc["paths"].items():
        for method in METHODS:
            if method in item:
                op = item[method]
                tag = (op.get("tags") or ["other"])[0]
                title = TAG_TITLES.get(tag, tag.capitalize())
                by_title.setdefault(title, []).append(_operation(method, path, op))
    parts: list[str] = []
    for title, sections in by_title.items():
        parts.append(f"## {title}\n")
        parts.extend(sections)
    parts.append("## Schemas\n")
    for name, schema in doc["components"]["schemas"].items():
        parts.append(_schema(name, schema))
    return "\n".join(parts)


def _operation(method: str, path: str, op: Mapping[str, Any]) -> str:
    lines = [
        f"### `{method.upper()} {path}` {{#{op['operationId']}}}\n",
        _sentence(op.get("summary", "")),
        "",
    ]
    if op.get("security"):
        lines.append("Needs the `X-API-Key` header when the node has an API key.\n")
    params = op.get("parameters", [])
    if params:
        lines += ["| parameter | in | type | meaning |", "|---|---|---|---|"]
        for p in params:
            required = " (required)" if p.get("required") else ""
            # parameters arrive as text: one with no schema takes any string
            kind = _type(p["schema"]) if p.get("schema") else "string"
            lines.append(
                f"| `{p['name']}`{required} | {p['in']} | {kind} "
                f"| {_cell(p.get('description', ''))} |"
            )
        lines.append("")
    body = op.get("requestBody")
    if body:
        for media, content in body.get("content", {}).items():
            lines.append(f"**Request body** (`{media}`): {_type(content.get('schema', {}))}\n")
    lines += ["| status | meaning | body |", "|---|---|---|"]
    for status, response in op.get("responses", {}).items():
        bodies = [
            f"{_type(content.get('schema', {}))} (`{media}`)"
            if media != "application/json"
            else _type(content.get("schema", {}))
            for media, content in response.get("content", {}).items()
        ]
        lines.append(
            f"| {status} | {_cell(response.get('description', ''))} | {', '.join(bodies)} |"
        )
    return "\n".join(lines) + "\n"


def _schema(name: str, schema: Mapping[str, Any]) -> str:
    lines = [f"### {name} {{#schema-{name.lower()}}}\n"]
    if schema.get("description"):  # its first paragraph: what it is, for a client
        lines.append(" ".join(schema["description"].split("\n\n")[0].split()) + "\n")
    properties = schema.get("properties")
    if properties:
        required = set(schema.get("required", []))
        lines += ["| field | type | meaning |", "|---|---|---|"]
        for field, prop in properties.items():
            mark = " (required)" if field in required else ""
            lines.append(
                f"| `{field}`{mark} | {_type(prop)} | {_cell(prop.get('description', ''))} |"
            )
    elif "enum" in schema:
        lines.append("One of " + ", ".join(f"`{value}`" for value in schema["enum"]) + ".")
    else:
        lines.append(_type(schema))
    return "\n".join(lines) + "\n"


def _type(schema: Mapping[str, Any]) -> str:
    """A JSON Schema in a few words: types, references as links, bounds and formats."""
    if "$ref" in schema:
        name = schema["$ref"].removeprefix(openapi.REF_PREFIX)
        return f"[{name}](#schema-{name.lower()})"
    if "anyOf" in schema:
        return " or ".join(_type(option) for option in schema["anyOf"])
    if "enum" in schema:
        return "one of " + ", ".join(f"`{value}`" for value in schema["enum"])
    kind = schema.get("type")
    if kind == "array":
        return "array of " + _type(schema.get("items", {}))
    if kind == "object" and "additionalProperties" in schema:
        extra = schema["additionalProperties"]
        values = _type(extra) if isinstance(extra, dict) else "any JSON"
        return f"object of {values}"
    if kind is None:
        return "any JSON"
    words = [str(kind)]
    words += list(_constraints(schema))
    return words[0] + (f" ({', '.join(words[1:])})" if len(words) > 1 else "")


def _constraints(schema: Mapping[str, Any]) -> Iterator[str]:
    if "format" in schema:
        yield str(schema["format"])
    for key, word in (
        ("minimum", "≥"),
        ("exclusiveMinimum", ">"),
        ("maximum", "≤"),
        ("exclusiveMaximum", "<"),
    ):
        if key in schema:
            yield f"{word} {schema[key]}"
    if "minLength" in schema or "maxLength" in schema:
        yield f"{schema.get('minLength', 0)} to {schema.get('maxLength', '…')} characters"
    if "default" in schema and schema["default"] is not None:
        yield f"default `{schema['default']}`"


def _sentence(text: str) -> str:
    return text if text.endswith(".") else text + "."


def _cell(text: str) -> str:
    """Text fit for one table cell: on one line, its pipes escaped."""
    return " ".join(text.split()).replace("|", "\\|")
