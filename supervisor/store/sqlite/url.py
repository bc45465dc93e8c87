"""Which store a `database_url` names: `memory://`, a SQLite file (`sqlite:///relative.db`,
`sqlite:////absolute.db`, SQLAlchemy's form) or PostgreSQL (anything else, as before).
No URL at all is the SQLite file `goqueue.db` in the working directory."""

from __future__ import annotations

from enum import StrEnum

import msgspec

DEFAULT_FILE = "goqueue.db"
MEMORY_URL = "memory://"
SQLITE_PREFIX = "sqlite:///"


class StoreKind(StrEnum):
    """The three stores a node can keep its jobs in."""

    MEMORY = "memory"
    SQLITE = "sqlite"
    POSTGRES = "postgres"


class StoreUrl(msgspec.Struct, frozen=True):
    """A parsed `database_url`: its kind, and the file for SQLite."""

    kind: StoreKind
    path: str = ""


def store_url(url: str | None) -> StoreUrl:
    """What `url` names; raises ValueError for a SQLite URL without a file."""
    if url is None:
        return StoreUrl(StoreKind.SQLITE, DEFAULT_FILE)
    if url == MEMORY_URL:
        return StoreUrl(StoreKind.MEMORY)
    if url.startswith("sqlite:"):
        if not url.startswith(SQLITE_PREFIX):
            raise ValueError(
                f"{url!r}: a SQLite URL is sqlite:///relative/path.db or sqlite:////absolute/path.db"
            )
        path = url[len(SQLITE_PREFIX) :]
        if not path or path.endswith("/") or path == ":memory:":
            raise ValueError(f"{url!r}: name a file (use memory:// for the in-memory store)")
        return StoreUrl(StoreKind.SQLITE, path)
    return StoreUrl(StoreKind.POSTGRES)


def is_postgres(url: str | None) -> bool:
    """True when `url` names PostgreSQL (a store shared by several nodes)."""
    return url is not None and store_url(url).kind == StoreKind.POSTGRES
