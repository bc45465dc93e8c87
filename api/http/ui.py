"""The dashboard: static files shipped inside the package (`goqueue/api/http/ui_static/`),
served at `/ui/` by every node. Nothing to build or install: plain ES modules and one
vendored chart library.

The files are read once, when the app is built, and answered from memory with an ETag
(a revalidation is a 304) and gzip where the browser takes it. They hold no data and need
no API key; the page asks the API for everything it shows, with the key the operator
gives it. A strict Content-Security-Policy keeps anything but these files from running.
"""

from __future__ import annotations

import gzip
import hashlib
import mimetypes
from dataclasses import dataclass
from importlib import resources
from importlib.abc import Traversable

from aiohttp import web
from goqueue.api.http.openapi import Text, operation
from goqueue.api.http.replies import ApiError

routes = web.RouteTableDef()

PACKAGE = "goqueue.api.http"
FOLDER = "ui_static"
INDEX = "index.html"
HTML = "text/html; charset=utf-8"
COMPRESS_MIN = 1024  # bytes; smaller files are not worth a gzip header
TYPES = {
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".html": HTML,
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".md": "text/plain; charset=utf-8",
    "": "text/plain; charset=utf-8",  # LICENSE
}
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}


@dataclass(frozen=True, slots=True)
class Asset:
    """One file of the dashboard, ready to answer."""

    body: bytes
    gzipped: bytes | None
    content_type: str
    etag: str


def content_type(name: str) -> str:
    """The Content-Type of a dashboard file, by its extension."""
    suffix = name[name.rfind(".") :] if "." in name.rsplit("/", 1)[-1] else ""
    return TYPES.get(suffix) or mimetypes.guess_type(name)[0] or "application/octet-stream"


def load_assets() -> dict[str, Asset]:
    """Every file under `ui_static`, by its path relative to it."""
    assets: dict[str, Asset] = {}
    root = resources.files(PACKAGE).joinpath(FOLDER)
    for path, item in _walk(root, ""):
        body = item.read_bytes()
        kind = content_type(path)
        packed = None
        if len(body) >= COMPRESS_MIN and not kind.startswith("image/png"):
            packed = gzip.compress(body, compresslevel=9, mtime=0)
        etag = '"' + hashlib.sha256(body).hexdigest()[:20] + '"'
        assets[path] = Asset(body, packed, kind, etag)
    if INDEX not in assets:
        raise RuntimeError(f"the dashboard's {INDEX} is missing from {PACKAGE}/{FOLDER}")
    return assets


def _walk(folder: Traversable, prefix: str) -> list[tuple[str, Traversable]]:
    found: list[tuple[str, Traversable]] = []
    for item in folder.iterdir():
        if item.name.startswith(".") or item.name == "__pycache__":
            continue
        if item.is_dir():
            found += _walk(item, f"{prefix}{item.name}/")
        else:
            found.append((f"{prefix}{item.name}", item))
    return found


ASSETS = web.AppKey("ui_assets", dict)


@routes.get("/ui")
@operation(responses={308: Text("text/plain")}, strict_query=False)
async def ui_redirect(request: web.Request) -> web.Response:
    """The dashboard lives at /ui/ (relative links need the slash)."""
    return web.Response(status=308, headers={"Location": "ui/"})


@routes.get("/ui/{path:.*}")
@operation(responses={200: Text(HTML)}, strict_query=False)
async def ui_file(request: web.Request) -> web.Response:
    """The dashboard (its page, scripts and styles; no data, no API key needed)."""
    path = request.match_info["path"] or INDEX
    asset: Asset | None = request.app[ASSETS].get(path)
    if asset is None:
        raise ApiError(404, f"no dashboard file {path[:100]!r}")
    headers = {
        "Content-Type": asset.content_type,
        "ETag": asset.etag,
        "Cache-Control": "no-cache",  # revalidate: an upgraded node serves new files at once
        "Vary": "Accept-Encoding",
        **SECURITY_HEADERS,
    }
    if asset.etag in request.headers.get("If-None-Match", ""):
        return web.Response(status=304, headers=headers)
    if asset.gzipped is not None and "gzip" in request.headers.get("Accept-Encoding", ""):
        headers["Content-Encoding"] = "gzip"
        return web.Response(body=asset.gzipped, headers=headers)
    return web.Response(body=asset.body, headers=headers)
