"""The jobs table looks after itself: dead row versions counted, VACUUMed by the node when
they pile up, and a transaction that keeps VACUUM from removing them named.

Every job leaves several dead row versions behind (its claim, its start, its outcome).
The server's autovacuum removes them, when it runs and keeps up; many servers have it
off, tuned for other tables, or behind. So every `every` seconds one node at a time
(an advisory lock) reads the table's statistics and, once the dead versions pass
`threshold` and a fifth of the live ones, runs `VACUUM (ANALYZE)` on it: bounded to this
one table, paced as autovacuum paces itself (`vacuum_cost_delay`), logged, counted.
ANALYZE also gives the planner the table's true size, which a table never analyzed does
not have.

VACUUM cannot remove a version some open snapshot may still see: a transaction left open
anywhere in the database (a report, a stuck session) holds every dead version since it
began. The node then does not VACUUM in vain over and over: it says so (a log line, the
`goqueue_store_oldest_snapshot_seconds` gauge and a `/ready` warning naming the session)
and tries again once that transaction is gone or an interval has passed.

The jobs' counts (`sql/counts.py`), the workflows' statuses (`sql/flow_counts.py`) and
the dead letters' tally (`sql/tallies.py`) look after themselves the same way: at each
reading, one node at a time folds the changes written since in, settles the workflows
touched, and VACUUMs those small tables, so a count reads a few rows however long the
node has run.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

import psycopg
from goqueue.supervisor.common.errors import StoreUnavailable
from goqueue.supervisor.store.base import Upkeep
from goqueue.supervisor.store.postgres.connection import Connections
from goqueue.supervisor.store.postgres.sql.counts import DROP_ZEROS, FOLD
from goqueue.supervisor.store.postgres.sql.flow_counts import FLOW_FOLD
from goqueue.supervisor.store.postgres.sql.tallies import TALLY_FOLD
from psycopg import AsyncConnection, sql

log = logging.getLogger("goqueue.store.postgres")

# the workflows' bookkeeping, vacuumed with the jobs' counts (`sql/flow_counts.py`)
_FLOW_TABLES = ("workflow_touches", "workflow_count_changes", "workflow_counts")
_TALLY_TABLES = ("tally_changes", "tallies")  # the dead letters' (`sql/tallies.py`)

# The table's statistics and the database's oldest open snapshot (its session named).
_LOOK = """
    SELECT (SELECT n_live_tup FROM pg_stat_user_tables
            WHERE schemaname = %(schema)s AND relname = 'jobs'),
           (SELECT n_dead_tup FROM pg_stat_user_tables
            WHERE schemaname = %(schema)s AND relname = 'jobs'),
           o.seconds, o.pid, o.application_name
    FROM (SELECT 1) one LEFT JOIN (
        SELECT extract(epoch FROM now() - xact_start)::float8 AS seconds, pid,
            application_name
        FROM pg_stat_activity
        WHERE datname = current_database() AND backend_xmin IS NOT NULL
          AND pid <> pg_backend_pid() AND xact_start IS NOT NULL
        ORDER BY xact_start LIMIT 1) o ON true"""


@dataclass(frozen=True, slots=True)
class Look:
    """One reading of the table and the oldest snapshot."""

    live: int
    dead: int
    oldest_seconds: float | None
    oldest_pid: int | None
    oldest_application: str | None


class TableCare:
    """Counts the jobs table's dead row versions and VACUUMs it when they pile up."""

    def __init__(
        self,
        db: Connections,
        schema: str,
        *,
        every: float = 10.0,
        threshold: int = 20_000,
        warn_after: float = 300.0,
        retry_held: float = 300.0,
    ) -> None:
        self._db = db
        self.schema = schema
        self.every = every  # seconds between readings
        self.threshold = threshold  # dead versions before a VACUUM is worth it
        self.warn_after = warn_after  # a snapshot this old is named in /ready
        self.retry_held = retry_held  # a VACUUM a snapshot made vain is retried after this
        self._lock = f"goqueue.vacuum.{schema}"
        self._fold_lock = f"goqueue.counts.{schema}"
        self._vacuums = 0
        self._look: Look | None = None
        self._vain: tuple[int | None, float] | None = None  # (holder pid, when)

    def upkeep(self) -> Upkeep:
        """What the last reading found, and the VACUUMs this node ran."""
        look = self._look
        if look is None:
            return Upkeep(vacuums=self._vacuums)
        warning = None
        if look.oldest_seconds is not None and look.oldest_seconds >= self.warn_after:
            warning = (
                f"a transaction open for {look.oldest_seconds:.0f} s (pid {look.oldest_pid},"
                f" application {look.oldest_application or 'unnamed'!r}) keeps VACUUM from"
                f" removing dead job rows ({look.dead} now); end it to keep the queue fast"
            )
        return Upkeep(
            dead_rows=look.dead,
            oldest_snapshot_seconds=look.oldest_seconds,
            vacuums=self._vacuums,
            warning=warning,
        )

    async def run(self) -> None:
        """Look, and VACUUM when due, every `every` seconds until cancelled."""
        while True:
            await asyncio.sleep(self.every)
            try:
                await self.fold()
                await self.step()
            except (StoreUnavailable, psycopg.Error, OSError) as exc:
                log.info("table upkeep skipped", extra={"err": str(exc)})

    async def step(self) -> bool:
        """One reading, and a VACUUM if one is due and no node runs one; True if run."""
        look = await self.look()
        if not self._due(look):
            return False
        conn = await AsyncConnection.connect(
            self._db.dsn, autocommit=True, **self._db.connect_kwargs()
        )
        async with conn:
            lock = "SELECT pg_try_advisory_lock(hashtextextended(%s, 0))"
            got = await conn.execute(lock, (self._lock,))
            row = await got.fetchone()
            if row is None or not row[0]:
                return False  # another node is at it
            started = time.monotonic()
            table = sql.Identifier(self.schema, "jobs")
            # paced as autovacuum paces itself: the node's own claims keep their share
            await conn.execute("SET vacuum_cost_delay = '2ms'")
            await conn.execute(sql.SQL("VACUUM (ANALYZE) {}").format(table))
        self._vacuums += 1
        after = await self.look()
        took = time.monotonic() - started
        vain = after.dead > look.dead // 2
        self._vain = (after.oldest_pid, time.monotonic()) if vain else None
        (log.warning if vain else log.info)(
            "jobs table vacuumed",
            extra={
                "dead_before": look.dead,
                "dead_after": after.dead,
                "seconds": round(took, 2),
                "held_by_pid": after.oldest_pid if vain else None,
            },
        )
        return True

    async def fold(self) -> int:
        """Fold the changes to the jobs' counts and the tallies in and settle the
        workflows touched, unless another node is at it, then VACUUM those tables (their
        deleted rows would stay, and be read by every count, until the server's
        autovacuum came); the groups, workflows and tallies it moved (0: nothing to
        fold, or another node at it). On a pooled connection (autocommit): the tables
        are small, and a connection of its own every reading would cost the server a
        backend."""
        ident = sql.Identifier(self.schema)
        async with self._db.connection() as conn:
            async with conn.transaction():
                lock = "SELECT pg_try_advisory_xact_lock(hashtextextended(%s, 0))"
                got = await (await conn.execute(lock, (self._fold_lock,))).fetchone()
                if got is None or not got[0]:
                    return 0
                folded = (await conn.execute(sql.SQL(FOLD).format(s=ident))).rowcount
                await conn.execute(sql.SQL(DROP_ZEROS).format(s=ident))
                flows = (await conn.execute(sql.SQL(FLOW_FOLD).format(s=ident))).rowcount
                tallied = (await conn.execute(sql.SQL(TALLY_FOLD).format(s=ident))).rowcount
            if folded or flows or tallied:
                names = ("job_count_changes", "job_counts", *_FLOW_TABLES, *_TALLY_TABLES)
                tables = sql.SQL("VACUUM {}").format(
                    sql.SQL(", ").join(sql.Identifier(self.schema, name) for name in names)
                )
                await conn.execute(tables)
        return folded + flows + tallied

    async def look(self) -> Look:
        """Read the table's statistics and the oldest snapshot."""
        async with self._db.connection() as conn:
            got = await conn.execute(_LOOK, {"schema": self.schema})
            row = await got.fetchone()
        assert row is not None
        live, dead, seconds, pid, application = row
        self._look = Look(int(live or 0), int(dead or 0), seconds, pid, application)
        return self._look

    def _due(self, look: Look) -> bool:
        if look.dead < max(self.threshold, look.live // 5):
            return False
        if self._vain is None:
            return True
        pid, when = self._vain
        # the snapshot that made the last one vain is gone, or it is time to try again
        return look.oldest_pid != pid or time.monotonic() - when >= self.retry_held
