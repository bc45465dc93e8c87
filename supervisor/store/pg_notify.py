"""How PostgreSQL store nodes tell each other about new work: NOTIFY and LISTEN.

`Notifier` sends the hint after a commit made work claimable, coalesced so a stream of
commits costs at most one NOTIFY in flight; `Listener` keeps one dedicated connection
LISTENing on the schema's channel, reconnecting forever, and hands every notification
(the sending node, and when the work is due) to the store, which wakes its dispatcher.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from contextlib import suppress
from datetime import UTC, datetime
from typing import Any

import psycopg
from goqueue.supervisor.errors import StoreUnavailable
from psycopg import AsyncConnection

# The store's logger: these records keep the name operators already filter on.
log = logging.getLogger("goqueue.store.postgres")


class Notifier:
    """Announces new work to the other nodes, coalesced: however many commits poke it,
    at most one NOTIFY is in flight, and the next one carries everything poked meanwhile.
    The first poke after a quiet spell goes at once; under a stream of commits they go
    at most every `spacing` seconds (each costs a round trip here and wakes every
    listener, this node's own included).

    A NOTIFY inside every enqueue transaction would serialize their commits on the
    server's notification queue lock; a hint sent after the commit costs one small
    statement per round trip instead. The payload is "<node> <epoch>", the epoch being
    the earliest future run_at poked (empty when all the work is due now).
    """

    def __init__(
        self, node_id: str, send: Callable[[str], Awaitable[object]], *, spacing: float = 0.005
    ) -> None:
        self.node_id = node_id
        self._send = send
        self.spacing = spacing  # at most one NOTIFY per `spacing` seconds under load
        self._poked = False
        self._due: datetime | None = None
        self._task: asyncio.Task[None] | None = None

    def poke(self, due: datetime | None) -> None:
        """Announce work (due at `due` if that is later than now)."""
        self._poked = True
        if due is not None and due > datetime.now(UTC):
            self._due = due if self._due is None else min(self._due, due)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="goqueue-pg-notify")

    async def _run(self) -> None:
        while self._poked:
            due, self._due, self._poked = self._due, None, False
            epoch = "" if due is None else repr(due.timestamp())
            try:
                await self._send(f"{self.node_id} {epoch}")
            except StoreUnavailable as exc:
                log.info("NOTIFY skipped: store unavailable", extra={"err": str(exc)})
            await asyncio.sleep(self.spacing)

    async def close(self) -> None:
        """Send what is pending (briefly), then stop."""
        if self._task is not None:
            with suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(self._task, timeout=1.0)


class Listener:
    """One dedicated connection LISTENing on the schema's channel, reconnecting forever.

    `on_note(node, due)` runs for every notification; `on_connect()` after every
    (re)subscription, since notifications sent while disconnected are lost.
    """

    def __init__(
        self,
        dsn: str,
        channel: str,
        connect_kwargs: dict[str, Any],
        on_note: Callable[[str, datetime | None], None],
        on_connect: Callable[[], None],
        *,
        keepalive: float = 10.0,
    ) -> None:
        self.dsn = dsn
        self.channel = channel
        self.connect_kwargs = connect_kwargs
        self.on_note = on_note
        self.on_connect = on_connect
        self.keepalive = keepalive
        self.listening = asyncio.Event()

    async def run(self) -> None:
        """Listen until cancelled, reconnecting with backoff."""
        delay = 0.2
        while True:
            try:
                await self._listen()
            except (psycopg.Error, OSError, TimeoutError) as exc:
                lost = self.listening.is_set() or delay == 0.2
                (log.warning if lost else log.debug)(
                    "LISTEN connection lost; reconnecting", extra={"err": str(exc)}
                )
            delay = 0.2 if self.listening.is_set() else min(delay * 2, 5.0)
            self.listening.clear()
            await asyncio.sleep(delay)

    async def _listen(self) -> None:
        conn = await AsyncConnection.connect(self.dsn, autocommit=True, **self.connect_kwargs)
        async with conn:
            await conn.execute(f'LISTEN "{self.channel}"')
            self.listening.set()
            self.on_connect()
            while True:
                async for note in conn.notifies(timeout=self.keepalive):
                    self._dispatch(note.payload)
                async with asyncio.timeout(self.keepalive):
                    await conn.execute("SELECT 1")  # notices a dead connection when idle

    def _dispatch(self, payload: str) -> None:
        node, _, epoch = payload.partition(" ")
        due = None
        with suppress(ValueError, OverflowError):
            due = datetime.fromtimestamp(float(epoch), UTC)
        self.on_note(node, due)
