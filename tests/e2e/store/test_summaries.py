"""The store's summaries for operators (queues, nodes, list rows with previews): the same
tests against the memory and PostgreSQL stores."""

from __future__ import annotations

import msgspec
import pytest
from goqueue.supervisor.common.jobs import utcnow
from goqueue.supervisor.common.reads import JobFilter
from goqueue.supervisor.common.summaries import DeadFilter, NodeReport, preview
from goqueue.supervisor.store.base import NodeLinks

from tests.e2e.store.test_contract import claim_one, new

pytestmark = pytest.mark.timeout(30)


async def test_queue_summaries_show_depth_wait_running_and_paused(open_store, clock) -> None:
    async with open_store() as store:
        await store.register_node({"a": None, "b": None})
        assert await store.queue_summaries() == []
        first = (await store.enqueue(new("a", queue="mail", priority=0))).job
        await clock.advance(0.1)  # `first` has waited longest
        for priority in (10, 10, 5):
            await store.enqueue(new("a", queue="mail", priority=priority))
        await store.enqueue(new("b", queue="mail", delay_seconds=600))
        await store.enqueue(new("a", queue="busy"))
        lease = await claim_one(store, {"a": 1})  # the best due job: mail's priority 10
        assert (lease.job.queue, lease.job.priority) == ("mail", 10)
        await store.set_paused("idle", True)
        cancelled = (await store.enqueue(new("a", queue="gone"))).job
        await store.cancel(cancelled.id, False)

        by_name = {q.name: q for q in await store.queue_summaries()}
        assert list(by_name) == ["busy", "idle", "mail"]  # sorted; `gone` has no work
        mail = by_name["mail"]
        assert (mail.pending, mail.scheduled, mail.running) == (4, 1, 1)
        assert mail.depth_by_priority == {"10": 1, "5": 2, "0": 1}
        assert list(mail.depth_by_priority) == ["10", "5", "0"]  # highest first
        assert mail.oldest_due_at is not None
        assert abs((mail.oldest_due_at - first.run_at).total_seconds()) < 0.01
        assert mail.waiting_seconds is not None and mail.waiting_seconds >= 0.05
        assert not mail.paused
        busy = by_name["busy"]
        assert (busy.pending, busy.running, busy.depth_by_priority) == (1, 0, {"5": 1})
        idle = by_name["idle"]
        assert idle.paused and idle.pending == idle.running == 0
        assert idle.oldest_due_at is None and idle.waiting_seconds is None


async def test_a_queue_with_only_scheduled_jobs_has_no_wait(open_store) -> None:
    async with open_store() as store:
        await store.enqueue(new("a", queue="later", delay_seconds=600))
        (later,) = await store.queue_summaries()
        assert (later.pending, later.scheduled, later.running) == (1, 1, 0)
        assert later.oldest_due_at is None and later.waiting_seconds is None


async def test_cancelled_jobs_leave_the_counts_right(open_store) -> None:
    async with open_store() as store:
        due = [(await store.enqueue(new("a", queue="q"))).job for _ in range(3)]
        delayed = new("a", queue="q", delay_seconds=600)
        later = [(await store.enqueue(delayed)).job for _ in range(2)]
        await store.cancel(due[0].id, False)
        await store.cancel(later[0].id, False)
        (q,) = await store.queue_summaries()
        assert (q.pending, q.scheduled) == (3, 1)
        await claim_one(store, {"a": 1})  # passes the cancelled entry by
        (q,) = await store.queue_summaries()
        assert (q.pending, q.scheduled, q.running) == (2, 1, 1)
        assert q.oldest_due_at is not None
        assert abs((q.oldest_due_at - due[2].run_at).total_seconds()) < 0.01


async def test_nodes_list_this_node_with_its_types(open_store) -> None:
    async with open_store("node-x") as store:
        await store.register_node({"a": 2, "b": None})
        (node,) = [n for n in await store.nodes() if n.node_id == "node-x"]
        assert node.live and node.types == ["a", "b"]
        assert node.started_at <= node.heartbeat_at
        assert abs((utcnow() - node.heartbeat_at).total_seconds()) < 30


async def test_job_briefs_cut_payloads_results_and_errors(open_store) -> None:
    async with open_store() as store:
        long = {"text": "é" * 500}
        big = (await store.enqueue(new("a", payload=long))).job
        small = (await store.enqueue(new("b", queue="q2", payload=[1, 2]))).job
        lease = await claim_one(store, {"b": 1})
        await store.complete(lease, msgspec.Raw(b'{"ok": true}'))
        page = await store.job_briefs(JobFilter(), 10, 0, 20)
        assert page.total == 2 and [b.id for b in page.items] == [small.id, big.id]
        small_row, big_row = page.items
        assert big_row.payload.truncated and len(big_row.payload.text) == 20
        raw = msgspec.json.encode(long)
        assert raw.decode().startswith(big_row.payload.text)
        assert big_row.payload.size == len(await _stored_payload(store, big.id))
        assert big_row.result is None and big_row.last_error is None
        assert big_row.status == "pending" and big_row.attempts == 0
        assert not small_row.payload.truncated
        assert small_row.result is not None and small_row.result.text == '{"ok": true}'
        assert small_row.status == "done" and small_row.finished_at is not None
        only = await store.job_briefs(JobFilter(queue="q2", status="done"), 10, 0, 20)
        assert [b.id for b in only.items] == [small.id] and only.total == 1
        assert (await store.job_briefs(JobFilter(type="a"), 1, 1, 20)).items == []


async def test_dead_briefs_filter_by_type_queue_error_and_job(open_store) -> None:
    async with open_store() as store:
        jobs = {}
        for name, queue, error in (
            ("a", "q1", "Timeout after 5s"),
            ("a", "q2", "100% broken_thing"),
            ("b", "q1", "KeyError: 'x'"),
        ):
            job = (await store.enqueue(new(name, queue=queue, payload={"n": "x" * 300}))).job
            lease = await claim_one(store, {name: 1})
            await store.fail(lease, error, None)
            jobs[error] = job

        async def ids(**filters: str) -> list[str]:
            page = await store.dead_briefs(DeadFilter(**filters), 10, 0, 50)
            assert page.total == len(page.items)
            return [d.job_id for d in page.items]

        assert len(await ids()) == 3
        assert await ids(type="b") == [jobs["KeyError: 'x'"].id]
        assert set(await ids(queue="q1", type="a")) == {jobs["Timeout after 5s"].id}
        assert await ids(error="timeout") == [jobs["Timeout after 5s"].id]  # any case
        assert await ids(error="0% b") == [jobs["100% broken_thing"].id]
        assert await ids(error="0%b") == []  # % is a character, not a wildcard
        assert await ids(error="m_o") == []  # so is _ (as a wildcard it would match "meo")
        assert await ids(error="nothing like it") == []
        target = jobs["KeyError: 'x'"].id
        assert await ids(job_id=target) == [target]
        assert await ids(job_id="00000000-0000-0000-0000-000000000000") == []
        (row,) = (await store.dead_briefs(DeadFilter(job_id=target), 10, 0, 10)).items
        assert row.type == "b" and row.queue == "q1" and row.attempts == 1
        assert row.payload.truncated and len(row.payload.text) == 10
        assert row.last_error is not None and row.last_error.text == "KeyError: "
        assert row.last_error.truncated
        dead = await store.get_dead(row.id)
        assert dead is not None and dead.job_id == target


async def _stored_payload(store, job_id: str) -> bytes:
    job = await store.get(job_id)
    return bytes(job.payload)


def test_preview_cuts_characters_not_bytes() -> None:
    assert preview(b'"abc"', 10) == preview(b'"abc"', 5)
    cut = preview("ééééé".encode(), 3)
    assert (cut.text, cut.size, cut.truncated) == ("ééé", 10, True)
    whole = preview("ééé".encode(), 3)
    assert (whole.text, whole.truncated) == ("ééé", False)
    wide = preview(("😀" * 4 + "x").encode(), 4)  # 4-byte characters: 4 * limit bytes read
    assert wide.text == "😀" * 4 and wide.truncated


async def test_type_stats_count_statuses_time_runs_and_rate_failures(open_store, clock) -> None:
    async with open_store() as store:
        await store.register_node({"a": None, "b": None})
        assert await store.type_stats() == []
        for _ in range(3):
            await store.enqueue(new("a", max_retries=0))
        await store.enqueue(new("b", queue="held"))
        await store.set_paused("held", True)
        for n in range(3):
            lease = await claim_one(store, {"a": 1})  # running
            await clock.advance(0.05 * (n + 1))
            if n < 2:
                await store.complete(lease, None)
            else:
                await store.fail(lease, "boom", None)
        by_type = {t.type: t for t in await store.type_stats()}
        assert list(by_type) == ["a", "b"]
        a, b = by_type["a"], by_type["b"]
        assert a.counts == {
            "waiting": 0, "pending": 0, "claimed": 0, "running": 0,
            "done": 2, "failed": 1, "cancelled": 0,
        }  # fmt: skip
        assert a.failure_rate == pytest.approx(1 / 3)
        assert a.p50_seconds is not None and a.p95_seconds is not None
        assert 0 <= a.p50_seconds <= a.p95_seconds
        assert b.counts["pending"] == 1 and sum(b.counts.values()) == 1
        assert b.failure_rate is None and b.p50_seconds is None and b.p95_seconds is None


async def test_job_briefs_find_the_jobs_a_job_enqueued(open_store) -> None:
    async with open_store() as store:
        parent = (await store.enqueue(new("a", on_success={"type": "b", "payload": 1}))).job
        await store.enqueue(new("b"))  # same type, no parent
        outcome = await store.complete(await claim_one(store, {"a": 1}), None)
        assert outcome is not None
        (chained,) = outcome.followups
        page = await store.job_briefs(JobFilter(parent_id=parent.id), 10, 0, 10)
        assert [brief.id for brief in page.items] == [chained.id] and page.total == 1
        both = JobFilter(parent_id=parent.id, type="b", status="pending")
        assert [b.id for b in (await store.job_briefs(both, 10, 0, 10)).items] == [chained.id]
        assert (await store.job_briefs(JobFilter(parent_id=chained.id), 10, 0, 10)).total == 0


async def test_nodes_answer_what_each_node_published_with_its_heartbeat(
    open_store, store_kind
) -> None:
    report = NodeReport([], done_last_minute=3, failed_last_minute=1)
    async with open_store(links=NodeLinks(report=lambda: report)) as store:
        await store.register_node({"a": None})
        (node,) = await store.nodes()
        assert node.report == report
        if store_kind == "postgres":  # another node reads it from the row
            async with open_store("node-b") as other:
                await other.register_node({"b": None})
                by_id = {n.node_id: n for n in await other.nodes()}
                assert by_id["node-a"].report == report
                assert by_id["node-b"].report is None  # it publishes none
