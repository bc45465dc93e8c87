"""`goqueue.pg`: enqueue inside the caller's own PostgreSQL transaction, on a real
database. A rollback leaves no job and no event; a commit stores the job, wakes the
nodes (NOTIFY delivered at commit) and a node runs it; refusals undo only the job."""

from __future__ import annotations

import asyncio
import select
from collections.abc import Callable

import goqueue
import goqueue.pg
import psycopg
import pytest
from goqueue.supervisor.settings.stores import channel

from tests.conftest import Node
from tests.e2e.client.conftest import Database

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(60)]


def rows(db: Database, sql: str, *params: object) -> list[tuple[object, ...]]:
    with psycopg.connect(db.dsn, autocommit=True) as conn:
        return conn.execute(sql.replace("{s}", db.schema), params).fetchall()


def stored(db: Database, job_id: str) -> tuple[int, list[str]]:
    """How many jobs have this id, and the events written for it."""
    (count,) = rows(db, "SELECT count(*) FROM {s}.jobs WHERE id = %s", job_id)[0]
    events = [r[0] for r in rows(db, "SELECT event FROM {s}.events WHERE job_id = %s", job_id)]
    return int(count), [str(e) for e in events]  # type: ignore[call-overload]


def test_a_rollback_leaves_no_job_and_no_event(registered: Database) -> None:
    with psycopg.connect(registered.dsn) as conn:  # not autocommit: psycopg's default
        job = goqueue.pg.enqueue(conn, "email", {"to": "a"}, schema=registered.schema)
        assert job.status == "pending" and job.payload == {"to": "a"}
        conn.rollback()
    assert stored(registered, job.id) == (0, [])


def test_a_commit_stores_the_job_with_its_event_and_wakes_nodes_at_commit(
    registered: Database,
) -> None:
    with psycopg.connect(registered.dsn, autocommit=True) as listener:
        listener.execute(f'LISTEN "{channel(registered.schema)}"')
        with psycopg.connect(registered.dsn, autocommit=True) as conn, conn.transaction():
            job = goqueue.pg.enqueue(
                conn, "email", [1, 2], schema=registered.schema, priority=9, queue="mail"
            )
            assert not _notes(listener, 0.3)  # nothing yet: the transaction is open
        notes = _notes(listener, 5)
    assert [n.payload for n in notes] == ["goqueue.pg "]
    assert stored(registered, job.id) == (1, ["enqueued"])
    ((node, queue, priority, max_retries),) = rows(
        registered,
        "SELECT e.node, j.queue, j.priority, j.max_retries FROM {s}.jobs j "
        "JOIN {s}.events e ON e.job_id = j.id WHERE j.id = %s",
        job.id,
    )
    assert (node, queue, priority, max_retries) == ("goqueue.pg", "mail", 9, 3)


def _notes(conn: psycopg.Connection[object], seconds: float) -> list[psycopg.Notify]:
    """Notifications that arrive on `conn` within `seconds` (at least one, or none)."""
    found: list[psycopg.Notify] = []
    if select.select([conn.fileno()], [], [], seconds)[0]:
        found += list(conn.notifies(timeout=0.5, stop_after=10))
    return found


def test_a_duplicate_raises_conflict_and_the_transaction_goes_on(registered: Database) -> None:
    keyed = {"dedupe_key": "signup:42", "dedupe_window_seconds": 60.0}
    with psycopg.connect(registered.dsn) as conn:
        conn.execute("CREATE TEMPORARY TABLE mine (n int)")
        first = goqueue.pg.enqueue(conn, "email", schema=registered.schema, **keyed)  # type: ignore[arg-type]
        with pytest.raises(goqueue.Conflict) as duplicate:
            goqueue.pg.enqueue(conn, "email", schema=registered.schema, **keyed)  # type: ignore[arg-type]
        assert duplicate.value.existing_id == first.id and duplicate.value.status == 409
        conn.execute("INSERT INTO mine VALUES (1)")  # the transaction is still usable
        with pytest.raises(goqueue.BadRequest) as unknown:
            goqueue.pg.enqueue(conn, "no_such_type", schema=registered.schema)
        assert unknown.value.field == "type" and "strict=False" in str(unknown.value)
        conn.execute("INSERT INTO mine VALUES (2)")
        later = goqueue.pg.enqueue(conn, "no_such_type", schema=registered.schema, strict=False)
        assert conn.execute("SELECT count(*) FROM mine").fetchone() == (2,)
        conn.commit()
    assert stored(registered, first.id)[0] == 1 and stored(registered, later.id)[0] == 1
    (count,) = rows(registered, "SELECT count(*) FROM {s}.jobs")[0]
    assert count == 2


def test_an_idempotency_key_answers_the_original_job(registered: Database) -> None:
    with psycopg.connect(registered.dsn, autocommit=True) as conn:
        options = {"schema": registered.schema, "idempotency_key": "order-7"}
        first = goqueue.pg.enqueue(conn, "email", {"n": 1}, **options)  # type: ignore[arg-type]
        again = goqueue.pg.enqueue(conn, "email", {"n": 1}, **options)  # type: ignore[arg-type]
        assert again.id == first.id
        with pytest.raises(goqueue.IdempotencyMismatch) as reused:
            goqueue.pg.enqueue(conn, "email", {"n": 2}, **options)  # type: ignore[arg-type]
        assert reused.value.existing_id == first.id
    (count,) = rows(registered, "SELECT count(*) FROM {s}.jobs")[0]
    assert count == 1


def test_an_invalid_job_is_refused_before_any_statement(registered: Database) -> None:
    with psycopg.connect(registered.dsn) as conn:
        with pytest.raises(goqueue.InvalidJob) as invalid:
            goqueue.pg.enqueue(conn, "email", schema=registered.schema, priority=11)
        assert invalid.value.field == "priority"
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


def test_the_actor_itself_gives_its_declared_defaults(registered: Database) -> None:
    @goqueue.actor("email", queue="mail", priority=2, max_retries=7, timeout=12)
    def send_email(payload: object, ctx: goqueue.Context) -> None:
        """Never run here."""

    with psycopg.connect(registered.dsn, autocommit=True) as conn:
        job = goqueue.pg.enqueue(conn, send_email, schema=registered.schema)
        own = goqueue.pg.enqueue(conn, send_email, schema=registered.schema, priority=10)
    assert (job.queue, job.priority, job.max_retries, job.timeout_seconds) == ("mail", 2, 7, 12)
    assert own.priority == 10 and own.queue == "mail"


def test_the_schema_comes_from_the_environment_and_must_exist(
    registered: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GOQUEUE_DATABASE_SCHEMA", registered.schema)
    with psycopg.connect(registered.dsn) as conn:
        job = goqueue.pg.enqueue(conn, "report")
        conn.execute("SAVEPOINT before")
        with pytest.raises(goqueue.ClientError, match="goqueue migrate"):
            goqueue.pg.enqueue(conn, "report", schema="gq_never_made")
        assert conn.execute("SELECT 1").fetchone() == (1,)  # still usable
        conn.commit()
    assert stored(registered, job.id)[0] == 1


def test_the_async_twin(registered: Database) -> None:
    async def main() -> tuple[str, str]:
        conn = await psycopg.AsyncConnection.connect(registered.dsn)
        async with conn:
            dropped = await goqueue.pg.enqueue_async(conn, "email", 1, schema=registered.schema)
            await conn.rollback()
            kept = await goqueue.pg.enqueue_async(
                conn, "email", 2, schema=registered.schema, dedupe_key="k",
                dedupe_window_seconds=30,
            )  # fmt: skip
            with pytest.raises(goqueue.Conflict):
                await goqueue.pg.enqueue_async(
                    conn, "email", 3, schema=registered.schema, dedupe_key="k",
                    dedupe_window_seconds=30,
                )  # fmt: skip
            await conn.commit()
        return dropped.id, kept.id

    dropped, kept = asyncio.run(main())
    assert stored(registered, dropped) == (0, [])
    assert stored(registered, kept) == (1, ["enqueued"])


def test_a_committed_job_is_run_by_a_node(pg_node: Callable[..., Node], database: Database) -> None:
    node = pg_node()
    with psycopg.connect(database.dsn, autocommit=True) as conn, conn.transaction():
        job = goqueue.pg.enqueue(conn, "noop", {"ran": True}, schema=database.schema)
    with goqueue.Client(node.url) as client:
        assert client.wait(job.id, timeout=30).result == {"ran": True}


def test_a_typed_actor_s_payload_is_checked_when_the_actor_itself_is_given(
    registered: Database,
) -> None:
    @goqueue.actor("email")
    def send_email(to: str, retries: int = 1, *, ctx: goqueue.Context) -> None:
        """Never run here."""

    with psycopg.connect(registered.dsn, autocommit=True) as conn:
        before = rows(registered, f"SELECT count(*) FROM {registered.schema}.jobs")
        with pytest.raises(goqueue.BadRequest) as misfit:
            goqueue.pg.enqueue(conn, send_email, {"to": 5}, schema=registered.schema)
        assert misfit.value.field == "payload.to"
        assert "payload.to: Expected `str`, got `int`" in str(misfit.value)
        assert rows(registered, f"SELECT count(*) FROM {registered.schema}.jobs") == before
        job = goqueue.pg.enqueue(
            conn, send_email, {"to": "a@example.com"}, schema=registered.schema
        )
    assert job.payload == {"to": "a@example.com"}


def test_a_key_and_a_debounce_inside_the_callers_transaction(registered: Database) -> None:
    def send(n: int) -> goqueue.JobOut:
        with psycopg.connect(registered.dsn, autocommit=True) as conn, conn.transaction():
            return goqueue.pg.enqueue(
                conn,
                "email",
                {"n": n},
                schema=registered.schema,
                concurrency_key="tenant-1",
                debounce_key="digest",
                debounce_seconds=30,
            )

    first, second = send(1), send(2)
    assert second.id == first.id and first.concurrency_key == "tenant-1"
    ((payload, key),) = rows(
        registered, "SELECT payload, concurrency_key FROM {s}.jobs WHERE id = %s", first.id
    )
    assert payload == {"n": 2} and key == "tenant-1"
    with psycopg.connect(registered.dsn) as conn, pytest.raises(goqueue.BadRequest) as refused:
        goqueue.pg.enqueue(conn, "email", schema=registered.schema, debounce_key="x")
    assert refused.value.field == "debounce_seconds"
