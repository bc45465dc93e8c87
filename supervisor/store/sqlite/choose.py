"""The embedded stores a node can be given: the SQLite file (the default) or memory."""

from __future__ import annotations

from collections.abc import Callable

from goqueue.supervisor.settings.config import Settings
from goqueue.supervisor.settings.stores import StoreKind, store_url
from goqueue.supervisor.store.memory.store import MemoryStore
from goqueue.supervisor.store.sqlite.store import SqliteStore


def embedded_store(
    settings: Settings, node_id: str, wake: Callable[[], None]
) -> MemoryStore | SqliteStore | None:
    """The store `settings.database_url` names when it is not PostgreSQL (None then):
    the SQLite file (`goqueue.db` when no URL is set) or `memory://`."""
    url = store_url(settings.database_url)
    if url.kind == StoreKind.POSTGRES:
        return None
    if url.kind == StoreKind.MEMORY:
        return MemoryStore(
            node_id,
            lease_seconds=settings.lease_seconds,
            max_pending=settings.max_pending,
            idempotency_ttl=settings.idempotency_ttl,
            wake=wake,
        )
    return SqliteStore(
        url.path,
        node_id,
        lease_seconds=settings.lease_seconds,
        max_pending=settings.max_pending,
        idempotency_ttl=settings.idempotency_ttl,
        wake=wake,
    )
