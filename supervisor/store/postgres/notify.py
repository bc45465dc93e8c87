"""How PostgreSQL store nodes tell each other, and their dispatchers, about new work.

`Notifier` sends the hint (NOTIFY) after a commit made work claimable, coalesced so a
stream of commits costs at most one NOTIFY in flight, and none while no other node is
live; `Listener` keeps one dedicated connection LISTENing on the schema's channel,
reconnecting forever, and hands every notification (the sending node, and when the work
is due) on; `Wakeups` decides, after each commit or notification, whether to wake this
node's dispatcher and the others, and remembers when the next scheduled job is due. The
same channel carries a cancel ("<node> cancel <token> <job id>"): the node holding that
lease kills its worker at once, rather than at its next lease check.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from contextlib import suppress
from datetime import UTC, datetime
from typing import Any

import psycopg
from goqueue.supervisor.common.backoff import Backoff
from goqueue.supervisor.common.errors import StoreUnavailable
from goqueue.supervisor.common.jobs import Job
from goqueue.supervisor.store.postgres.floors import ClaimFloors
from goqueue.supervisor.store.postgres.sql.statements import Sql, Statements
from psycopg import AsyncConnection

# The store's logger: these records keep the name operators already filter on.
log = logging.getLogger("goqueue.store.postgres")


# The word after the node in a cancel's payload. A node older than this one reads it as
# a new-work hint with no due time: it wakes its dispatcher, harmlessly.
CANCEL_NOTE = "cancel"


def cancel_note(node_id: str, token: str, job_id: str) -> str:
    """The payload telling every node that `job_id`, leased under `token`, was cancelled."""
    return f"{node_id} {CANCEL_NOTE} {token} {job_id}"


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

    A node alone on its database (`alone`: its heartbeat counted no other live node)
    sends none: its own dispatcher was woken already, and the hint, a transaction of its
    own, would only wake this node's listener. A node joining announces itself
    (`announce`); a node that hears another (`heard`), or whose heartbeat counts one, is
    alone no more and pokes at once, so the newcomer claims what was committed unheard.
    """

    def __init__(
        self,
        node_id: str,
        send: Callable[[str], Awaitable[object]],
        *,
        spacing: float = 0.005,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.node_id = node_id
        self._send = send
        self.spacing = spacing  # at most one NOTIFY per `spacing` seconds under load
        self.clock = clock  # the heartbeat's `asked_at` is of this clock
        self.alone = False  # no other live node, as last counted: no hint is sent
        self._heard_at = -math.inf  # when another node was last heard from
        self._poked = False
        self._due: datetime | None = None
        self._task: asyncio.Task[None] | None = None

    def poke(self, due: datetime | None) -> None:
        """Announce work (due at `due` if that is later than now), unless alone."""
        if not self.alone:
            self._hint(due)

    def announce(self) -> None:
        """This node just joined: tell the others, alone or not (they count it then)."""
        self._hint(None)

    def _hint(self, due: datetime | None) -> None:
        self._poked = True
        if due is not None and due > datetime.now(UTC):
            self._due = due if self._due is None else min(self._due, due)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="goqueue-pg-notify")

    def heard(self) -> None:
        """Another node spoke on the channel: this node is not alone."""
        self._heard_at = self.clock()
        self._joined()

    def counted(self, others: int, asked_at: float) -> None:
        """The other live nodes, as a heartbeat sent at `asked_at` (`clock`) counted
        them. None counted is believed only if nobody was heard since it was sent: a node
        that joined meanwhile may not be in the count yet."""
        if others:
            self._joined()
        elif not self.alone and self._heard_at < asked_at:
            self.alone = True
            log.info("no other node on this database: new work is not announced")

    def _joined(self) -> None:
        if self.alone:
            self.alone = False
            log.info("another node is on this database: new work is announced")
            self._hint(None)  # what was committed unannounced, for the newcomer

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

    `on_note(node, due)` runs for every new-work hint, `on_cancel(node, token, job_id)`
    for every cancel; `on_connect()` after every (re)subscription, since notifications
    sent while disconnected are lost.
    """

    def __init__(
        self,
        dsn: str,
        sql: Statements,
        connect_kwargs: dict[str, Any],
        on_note: Callable[[str, datetime | None], None],
        on_connect: Callable[[], None],
        on_cancel: Callable[[str, str, str], None],
        *,
        keepalive: float = 10.0,
    ) -> None:
        self.dsn = dsn
        self._sql = sql
        self.connect_kwargs = connect_kwargs
        self.on_note = on_note
        self.on_cancel = on_cancel
        self.on_connect = on_connect
        self.keepalive = keepalive
        self.listening = asyncio.Event()

    async def run(self) -> None:
        """Listen until cancelled, reconnecting with backoff."""
        retry = Backoff(0.2, 5.0)
        while True:
            try:
                await self._listen()
            except (psycopg.Error, OSError, TimeoutError) as exc:
                lost = self.listening.is_set() or retry.failures == 0
                (log.warning if lost else log.debug)(
                    "LISTEN connection lost; reconnecting", extra={"err": str(exc)}
                )
            if self.listening.is_set():
                retry.reset()
            self.listening.clear()
            await asyncio.sleep(retry.next())

    async def _listen(self) -> None:
        conn = await AsyncConnection.connect(self.dsn, autocommit=True, **self.connect_kwargs)
        async with conn:
            await conn.execute(self._sql[Sql.LISTEN])
            self.listening.set()
            self.on_connect()
            while True:
                async for note in conn.notifies(timeout=self.keepalive):
                    self._dispatch(note.payload)
                async with asyncio.timeout(self.keepalive):
                    await conn.execute(self._sql[Sql.PING])  # notices a dead connection

    def _dispatch(self, payload: str) -> None:
        node, _, epoch = payload.partition(" ")
        kind, _, rest = epoch.partition(" ")
        if kind == CANCEL_NOTE:
            token, _, job_id = rest.partition(" ")
            self.on_cancel(node, token, job_id)
            return
        due = None
        with suppress(ValueError, OverflowError):
            due = datetime.fromtimestamp(float(epoch), UTC)
        self.on_note(node, due)


class Wakeups:
    """Who to wake when: this node's dispatcher (`wake`) and, through the
    `Notifier`, the other nodes. Also remembers when the next scheduled job is due.

    Work only in queues this node does not claim from (as of its last claim) does not
    wake its dispatcher; a job leaving `running` wakes everyone when its type is under a
    global limit, since a claim made a moment before that commit could not see the slot.
    """

    def __init__(self, notifier: Notifier, wake: Callable[[], None], floors: ClaimFloors) -> None:
        self._notifier = notifier
        self._wake = wake
        self._floors = floors
        self._next_due: datetime | None = None
        self._serves: frozenset[str] | None = None  # the queues claimed from (None: all)
        self.limited: set[str] = set()  # types under a global limit, as of the last claim

    def wake(self) -> None:
        """Wake this node's dispatcher (a failing waker is logged, not raised)."""
        try:
            self._wake()
        except Exception:
            log.exception("waker failed")

    def on_note(self, node: str, due: datetime | None) -> None:
        """A notification from a node (ours was handled right after our own commit)."""
        if node == self._notifier.node_id:
            return
        self._notifier.heard()
        self.saw_due(due)
        self.wake()

    def pending(self, jobs: Sequence[Job]) -> None:
        """After a commit that made `jobs` pending: remember due times, wake this node
        (if it claims from their queues) and the others; no claim floor stays above them."""
        if not jobs:
            return
        self._floors.lower(jobs)
        now = datetime.now(UTC)
        later = [job.run_at for job in jobs if job.run_at > now]
        due = min(later) if later else None
        self.saw_due(due)
        self._notifier.poke(due)
        serves = self._serves
        if serves is None or any(job.queue in serves for job in jobs):
            self.wake()

    def freed(self, job: Job) -> None:
        """`job` stopped running: wake everyone if its type is under a global limit."""
        if job.type in self.limited:
            self.everyone()

    def everyone(self) -> None:
        """Wake this node's dispatcher and the other nodes' (a queue was resumed...)."""
        self._notifier.poke(None)
        self.wake()

    def claimed(
        self,
        queues: frozenset[str] | None,
        types: Collection[str],
        limited: Collection[str],
        next_due: datetime | None,
        *,
        short: bool,
    ) -> None:
        """What a claim learnt: the queues this node serves, which of the `types` asked
        for are under a global limit and, if it came back `short`, when the next
        scheduled job is due. A full claim does not look (the dispatcher claims again as
        soon as a slot frees, due jobs and all): the time known before stands."""
        self._serves = queues
        self.limited = (self.limited - set(types)) | set(limited)
        if short:
            self._next_due = next_due

    def saw_due(self, due: datetime | None) -> None:
        """Remember a job scheduled for later (one due already needs no timer)."""
        if due is None or due <= datetime.now(UTC):
            return
        if self._next_due is None or due < self._next_due:
            self._next_due = due

    def next_due_at(self) -> datetime | None:
        """The earliest run_at still ahead among scheduled jobs, as of the last claim or
        notification. A time already past is answered once (the claim since may have
        been quicker than it), then this is None until the next claim refreshes it:
        answering it again would make a dispatcher with no free worker spin on its timer."""
        due = self._next_due
        if due is not None and due <= datetime.now(UTC):
            self._next_due = None
        return due
