"""How the parts of the SQLite store make their calls: `Write` runs work in one
savepoint at one instant and waits for its commit (with `durable`, for the fsync after
it); `Read` runs a read on the connection at once. `SqliteStore` has both and hands them
to its parts (dead letters, workflows, pruning)."""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

from goqueue.supervisor.store.sqlite.rules import Tx

T = TypeVar("T")


class Write(Protocol):
    """Run `work` in one savepoint, then wait for its commit (and fsync, `durable`)."""

    def __call__(self, work: Callable[[Tx], T], durable: bool = False) -> Awaitable[T]: ...


class Read(Protocol):
    """Run `work` on the connection now."""

    def __call__(self, work: Callable[[sqlite3.Connection], T]) -> T: ...
