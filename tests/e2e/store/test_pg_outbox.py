"""The webhook outbox on a real PostgreSQL: rows written by the terminal statements
themselves (done, done in a group, failed, reaped, cancelled), their body equal to the
API's view of the job, leases that keep two nodes off one delivery, fenced records,
giving up, and pruning. Each test gets a fresh schema, dropped afterwards."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import msgspec
import psycopg
import pytest
from goqueue.supervisor.common.deliveries import Answer, job_body
from goqueue.supervisor.common.jobs import JobSpec, Lease, utcnow
from goqueue.supervisor.common.reads import JobFilter
from goqueue.supervisor.store.base import NewJob
from goqueue.supervisor.store.postgres.store import PostgresStore

from tests.conftest import postgres_dsn, wait_for_async

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(60)]

T = TypeVar("T")
URL = "https://hooks.example.com/goqueue?token=secret"
PAYLOAD = b'{"b": 1,  "a": [1.50, "\\u00e9\\n", null]}'  # kept byte for byte


class Db:
    """Stores ("nodes") on one fresh schema, and SQL on it."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.schema = f"gq_test_{uuid.uuid4().hex[:12]}"
        self.stores: list[PostgresStore] = []

    async def node(self, node_id: str = "node-a", **options: Any) -> PostgresStore:
        store = PostgresStore(self.dsn, node_id, schema=self.schema, **options)
        await store.open()
        self.stores.append(store)
        return store

    def run(self, body: Callable[[Db], Awaitable[T]]) -> T:
        async def main() -> T:
            try:
                return await body(self)
            finally:
                for store in self.stores:
                    await store.close()

        return asyncio.run(main())

    async def sql(self, query: str, params: Any = None) -> list[tuple[Any, ...]]:
        conn = await psycopg.AsyncConnection.connect(self.dsn, autocommit=True)
        async with conn:
            cur = await conn.execute(query.replace("{s}", f'"{self.schema}"'), params)
            return await cur.fetchall() if cur.description else []

    async def rows(self) -> list[tuple[Any, ...]]:
        return await self.sql(
            "SELECT job_id::text, event, url, body, attempts, next_attempt_at IS NOT NULL"
            " FROM {s}.webhook_deliveries ORDER BY created_at, id"
        )


@pytest.fixture
def db() -> Iterator[Db]:
    dsn = postgres_dsn()
    made = Db(dsn)
    yield made
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{made.schema}" CASCADE')


async def running(store: PostgresStore, n: int = 1, **fields: Any) -> list[Lease]:
    """`n` jobs of type t, claimed (running)."""
    spec = JobSpec(type="t", webhook_url=URL, payload=msgspec.Raw(PAYLOAD), **fields)
    for _ in range(n):
        await store.enqueue(NewJob(spec=spec, max_retries=fields.get("max_retries") or 0))
    leases = await store.claim(n, None, {"t": n})
    assert len(leases) == n
    return leases


async def api_view(store: PostgresStore, job_id: str) -> Any:
    job = await store.get(job_id)
    assert job is not None
    return json.loads(job_body(job))


def test_each_terminal_statement_writes_its_delivery_with_the_api_view(db: Db) -> None:
    async def body(db: Db) -> None:
        store = await db.node()
        [done] = await running(store)
        await store.complete(done, msgspec.Raw(b'{"ok":  true}'))
        group = await running(store, 4)  # completes arriving together share a statement
        await asyncio.gather(*(store.complete(lease, None) for lease in group))
        [failed] = await running(store)
        await store.fail(failed, 'boom\n"quoted"', None)
        await store.enqueue(NewJob(spec=JobSpec(type="t", webhook_url=URL), max_retries=0))
        [pending] = (await store.list_jobs(JobFilter(status="pending"), 1, 0)).items
        await store.cancel(pending.id, force=False)
        plain = await store.enqueue(NewJob(spec=JobSpec(type="t"), max_retries=0))
        [lease] = await store.claim(1, None, {"t": 1})
        await store.complete(lease, None)

        rows = await db.rows()
        events = {job_id: event for job_id, event, *_ in rows}
        assert events == {
            done.job.id: "job.done",
            **{lease.job.id: "job.done" for lease in group},
            failed.job.id: "job.failed",
            pending.id: "job.cancelled",
        }
        assert plain.job.id not in events  # no webhook_url, no delivery
        for job_id, _, url, text, attempts, due in rows:
            assert (url, attempts, due) == (URL, 0, True)
            assert json.loads(text) == await api_view(store, job_id)
        by_job = {job_id: text for job_id, _, _, text, *_ in rows}
        assert '"payload":' + PAYLOAD.decode() in by_job[done.job.id]
        assert '"result":{"ok":  true}' in by_job[done.job.id]
        failed_body = json.loads(by_job[failed.job.id])
        assert failed_body["status"] == "failed" and failed_body["errors"][0]["error"] == (
            'boom\n"quoted"'
        )
        assert failed_body["finished_at"].endswith("Z")

    db.run(body)


def test_completes_write_the_deliveries_of_their_hooked_jobs_only(db: Db) -> None:
    """Completes of jobs without a webhook take a statement without the outbox; plain and
    hooked jobs completed together (one group or several) write the hooked one's."""

    async def body(db: Db) -> None:
        store = await db.node()
        for url in (None, URL, None):
            spec = JobSpec(type="t", webhook_url=url)
            await store.enqueue(NewJob(spec=spec, max_retries=0))
        leases = await store.claim(3, None, {"t": 3})
        await asyncio.gather(*(store.complete(lease, None) for lease in leases))
        for lease in leases:
            stored = await store.get(lease.job.id)
            assert stored is not None and stored.status == "done"
        [hooked] = [lease.job.id for lease in leases if lease.job.webhook_url == URL]
        assert [(job_id, event) for job_id, event, *_ in await db.rows()] == [(hooked, "job.done")]

    db.run(body)


def test_a_reaped_job_dead_lettered_writes_its_delivery(db: Db) -> None:
    async def body(db: Db) -> None:
        store = await db.node()
        [lease] = await running(store)
        await db.sql("UPDATE {s}.jobs SET lease_expires_at = now() - interval '1 second'")
        await store.reap_expired()
        [(job_id, event, *_)] = await db.rows()
        assert (job_id, event) == (lease.job.id, "job.failed")

    db.run(body)


def test_a_delivery_is_leased_to_one_node_and_its_record_fenced(db: Db) -> None:
    async def body(db: Db) -> None:
        a, b = await db.node("node-a"), await db.node("node-b")
        for lease in await running(a, 6):
            await a.complete(lease, None)
        claims = await asyncio.gather(a.outbox.claim(4, 30.0), b.outbox.claim(4, 30.0))
        ids = [due.id for claim in claims for due in claim]
        assert len(ids) == len(set(ids)) == 6  # each delivery to exactly one node
        assert await a.outbox.claim(10, 30.0) == []  # leased: not due until the lease ends
        due = claims[0][0] if claims[0] else claims[1][0]
        holder = a if claims[0] else b
        assert (
            due.body
            == (await db.sql("SELECT body FROM {s}.webhook_deliveries WHERE id = %s", (due.id,)))[
                0
            ][0].encode()
        )
        # another node, holding a stale token, records nothing
        stale = msgspec.structs.replace(due, token=str(uuid.uuid4()))
        assert await b.outbox.record(stale, Answer(200), delay=1.0, max_age=86400) is None
        assert (
            await holder.outbox.record(due, Answer(503, "HTTP 503"), delay=0.0, max_age=86400)
            is False
        )
        [again] = await holder.outbox.claim(1, 30.0)  # due again at once (delay 0)
        assert (again.id, again.attempts) == (due.id, 1) and again.token != due.token
        assert await holder.outbox.record(again, Answer(200), delay=5.0, max_age=86400) is False
        [view] = await holder.outbox.of_job(due.job_id)
        assert view.url == "https://hooks.example.com/goqueue"  # no token in the view
        assert [(x.status_code, x.error) for x in view.attempts] == [(503, "HTTP 503"), (200, None)]
        assert {x.node for x in view.attempts} == {holder.node_id}
        assert view.delivered_at is not None and view.next_attempt_at is None
        assert not view.given_up

    db.run(body)


def test_an_expired_lease_makes_a_delivery_due_for_another_node(db: Db) -> None:
    async def body(db: Db) -> None:
        a, b = await db.node("node-a"), await db.node("node-b")
        [lease] = await running(a)
        await a.complete(lease, None)
        [due] = await a.outbox.claim(1, 0.5)  # node a dies holding it
        assert await b.outbox.claim(1, 30.0) == []
        [taken] = await wait_for_async(  # free once a's 0.5 s lease ran out
            lambda: b.outbox.claim(1, 30.0), timeout=2, what="the delivery due again"
        )
        assert taken.id == due.id
        assert await a.outbox.record(due, Answer(200), delay=1, max_age=86400) is None

    db.run(body)


def test_giving_up_past_the_max_age_or_at_once_when_refused(db: Db) -> None:
    async def body(db: Db) -> None:
        store = await db.node()
        for lease in await running(store, 2):
            await store.complete(lease, None)
        first, second = await store.outbox.claim(2, 30.0)
        late = await store.outbox.record(first, Answer(500, "HTTP 500"), delay=3600, max_age=60)
        refused = Answer(error="refused: x", refused=True)
        at_once = await store.outbox.record(second, refused, delay=1, max_age=86400, final=True)
        assert (late, at_once) == (True, True)
        for due in (first, second):
            [view] = await store.outbox.of_job(due.job_id)
            assert view.given_up and view.next_attempt_at is None and view.delivered_at is None
        assert await store.outbox.claim(10, 30.0) == []

    db.run(body)


def test_pruning_takes_finished_deliveries_with_their_jobs(db: Db) -> None:
    async def body(db: Db) -> None:
        store = await db.node()
        leases = await running(store, 3)
        for lease in leases:
            await store.complete(lease, None)
        delivered, given_up, _undelivered = await store.outbox.claim(3, 30.0)
        await store.outbox.record(delivered, Answer(204), delay=1, max_age=86400)
        await store.outbox.record(
            given_up, Answer(error="x", refused=True), delay=1, max_age=1, final=True
        )
        assert await store.prune(utcnow(), 100) == 3
        left = await db.sql("SELECT id::text FROM {s}.webhook_deliveries")
        assert left == [(_undelivered.id,)]  # still owed: it stays, for any node

    db.run(body)


def test_an_unknown_or_malformed_job_has_no_deliveries(db: Db) -> None:
    async def body(db: Db) -> None:
        store = await db.node()
        assert await store.outbox.of_job(str(uuid.uuid4())) == []
        assert await store.outbox.of_job("not-a-uuid") == []

    db.run(body)
