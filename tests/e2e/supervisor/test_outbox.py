"""The PostgreSQL outbox's delivery loop (`outbox.Outbox`) in process, against a real
database and aiohttp receivers on 127.0.0.1: woken by its own node's deliveries, polling
for the others', and cut short at shutdown without losing what it was sending."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from goqueue.supervisor.common.jobs import Job, JobSpec
from goqueue.supervisor.store.base import NewJob
from goqueue.supervisor.store.postgres.store import PostgresStore
from goqueue.supervisor.webhooks.delivery import Poster
from goqueue.supervisor.webhooks.egress import EgressPolicy
from goqueue.supervisor.webhooks.outbox import INTERRUPTED, Outbox

from tests.conftest import postgres_dsn
from tests.e2e.supervisor.test_webhooks import LOOPBACK, Outcomes, Receiver

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(60)]


@pytest.fixture
def schema() -> Iterator[str]:
    name = f"gq_test_{uuid.uuid4().hex[:12]}"
    yield name
    with psycopg.connect(postgres_dsn(), autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


class Node:
    """A store and its outbox loop, as one node has them."""

    def __init__(self, schema: str, node_id: str, *, poll: float, timeout: float) -> None:
        self.store = PostgresStore(postgres_dsn(), node_id, schema=schema)
        self.outcomes = Outcomes()
        poster = Poster(LOOPBACK, timeout=timeout, concurrency=4)
        self.outbox = Outbox(
            self.store.outbox, poster, secret=None, poll=poll, on_outcome=self.outcomes
        )

    async def finish_one(self, url: str) -> Job:
        """Enqueue, claim and complete a job with a webhook; tell the outbox, as the
        node's hook does."""
        spec = JobSpec(type="t", webhook_url=url)
        await self.store.enqueue(NewJob(spec=spec, max_retries=0))
        [lease] = await self.store.claim(1, None, {"t": 1})
        outcome = await self.store.complete(lease, None)
        assert outcome is not None
        self.outbox.notify(outcome.job)
        return outcome.job


async def started(schema: str, node_id: str, *, poll: float = 60.0, timeout: float = 5.0) -> Node:
    node = Node(schema, node_id, poll=poll, timeout=timeout)
    await node.store.open()
    await node.outbox.start()
    return node


async def stopped(node: Node, grace: float = 0.0) -> None:
    await node.outbox.close(grace)
    await node.store.close()


def test_its_own_delivery_is_sent_at_once_without_waiting_for_a_poll(schema: str) -> None:
    async def scenario() -> None:
        async with Receiver() as receiver:
            node = await started(schema, "a", poll=60.0)
            try:
                loop = asyncio.get_running_loop()
                began = loop.time()
                job = await node.finish_one(receiver.url)
                await receiver.wait_for_hits(1, timeout=5)
                assert loop.time() - began < 2.0
                await node.outcomes.wait_for("delivered")
                [view] = await node.outbox.deliveries(job.id)
                assert view.delivered_at is not None
            finally:
                await stopped(node)

    asyncio.run(scenario())


def test_another_nodes_delivery_is_found_by_polling(schema: str) -> None:
    async def scenario() -> None:
        async with Receiver() as receiver:
            writer = await started(schema, "writer", poll=60.0)
            await writer.outbox.close(0)  # writes deliveries, never sends them
            poller = await started(schema, "poller", poll=0.2)
            try:
                job = await writer.finish_one(receiver.url)
                await receiver.wait_for_hits(1, timeout=5)
                await poller.outcomes.wait_for("delivered")
                [view] = await poller.outbox.deliveries(job.id)
                assert [a.node for a in view.attempts] == ["poller"]
            finally:
                await stopped(poller)
                await writer.store.close()

    asyncio.run(scenario())


def test_an_attempt_cut_short_at_shutdown_is_recorded_and_due_again(schema: str) -> None:
    async def scenario() -> None:
        async with Receiver(hang=True) as hanging, Receiver() as healthy:
            a = await started(schema, "a", timeout=30.0)
            job = await a.finish_one(hanging.url)
            await hanging.wait_for_hits(1)
            loop = asyncio.get_running_loop()
            began = loop.time()
            await stopped(a, grace=0.3)
            assert loop.time() - began < 3.0  # the grace, not the 30 s timeout
            b = await started(schema, "b", poll=0.2)
            try:
                [view] = await b.outbox.deliveries(job.id)
                [cut] = view.attempts
                assert (cut.status_code, cut.error, cut.node) == (None, INTERRUPTED, "a")
                assert view.next_attempt_at is not None and not view.given_up
                # the same delivery, now due, goes out from the next node
                hanging.hang = False
                hanging.release.set()
                await b.outcomes.wait_for("delivered", timeout=10)
                assert hanging.hits[0].headers["X-GoQueue-Delivery"] == view.id
                assert hanging.hits[-1].headers["X-GoQueue-Delivery"] == view.id
            finally:
                await stopped(b)
            assert healthy.hits == []

    asyncio.run(scenario())


def test_a_refused_destination_is_given_up_at_once(schema: str) -> None:
    async def scenario() -> None:
        async with Receiver() as receiver:
            node = Node(schema, "a", poll=60.0, timeout=5.0)
            node.outbox = Outbox(
                node.store.outbox,
                Poster(EgressPolicy(), timeout=5.0, concurrency=1),
                secret=None,
                on_outcome=node.outcomes,
            )
            await node.store.open()
            await node.outbox.start()
            try:
                job = await node.finish_one(receiver.url)
                await node.outcomes.wait_for("refused")
                [view] = await node.outbox.deliveries(job.id)
                assert view.given_up and view.attempts[0].error is not None
                assert view.attempts[0].error.startswith("refused: webhook_url must not point")
                assert receiver.hits == []
            finally:
                await stopped(node)

    asyncio.run(scenario())
