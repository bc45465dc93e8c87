"""What a configuration may say of its store.

Which store a `database_url` names: `memory://`, a SQLite file (`sqlite:///relative.db`,
`sqlite:////absolute.db`, SQLAlchemy's form) or PostgreSQL (anything else, as before).
No URL at all is the SQLite file `goqueue.db` in the working directory. And the rules
for a PostgreSQL schema's name, which becomes its NOTIFY channel's."""

from __future__ import annotations

import re
from enum import StrEnum

import msgspec

DEFAULT_FILE = "goqueue.db"
MEMORY_URL = "memory://"
SQLITE_PREFIX = "sqlite:///"

# PostgreSQL truncates (LISTEN) or refuses (pg_notify) names longer than 63 bytes, and the
# schema's NOTIFY channel is its name behind this prefix.
CHANNEL_PREFIX = "goqueue_"
NAME_BYTES = 63
MAX_SCHEMA_NAME = NAME_BYTES - len(CHANNEL_PREFIX)
_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]*")


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


def schema_name_problem(schema: str) -> str | None:
    """What is wrong with `schema` as the name of GoQueue's schema, or None.

    A plain lower-case identifier (it is written into statements unquoted by users and
    quoted by the store), short enough for its NOTIFY channel `goqueue_<schema>`."""
    if not _SCHEMA_NAME.fullmatch(schema):
        return (
            "must be a lower-case SQL identifier (letters, digits and _, not starting "
            f"with a digit), got {schema!r}"
        )
    if len(schema) > MAX_SCHEMA_NAME:
        return (
            f"must be at most {MAX_SCHEMA_NAME} characters (its NOTIFY channel "
            f"{channel(schema)!r} must fit PostgreSQL's {NAME_BYTES}-byte names), "
            f"got {len(schema)}"
        )
    return None


def channel(schema: str) -> str:
    """The NOTIFY channel of the nodes sharing `schema`."""
    return CHANNEL_PREFIX + schema
