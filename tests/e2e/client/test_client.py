"""`goqueue.Client` and `goqueue.AsyncClient` against real nodes over loopback: every
operation, waiting for results, threads and tasks sharing one client, keep-alive, and
retries that never enqueue twice (through a proxy that drops the first answer)."""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import goqueue
import pytest
from goqueue.client.calls import Retries

from tests.conftest import Node, wait_for

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def client(node: Node) -> Iterator[goqueue.Client]:
    with goqueue.Client(node.url) as made:
        yield made


def test_enqueue_get_wait_and_the_result(client: goqueue.Client) -> None:
    job = client.enqueue("noop", {"n": [1, 2]}, priority=7, queue="q1")
    # started in the enqueue's own commit when an idle worker waits for it (a node just
    # started may still be claiming: test_node.py shows the start at enqueue itself)
    assert (job.type, job.priority, job.queue) == ("noop", 7, "q1")
    assert job.status in ("pending", "running"), job
    assert client.get(job.id).payload == {"n": [1, 2]}
    done = client.wait(job.id, timeout=20)
    assert done.status == "done" and done.result == {"n": [1, 2]} and done.finished
    events = [e.event for e in client.events(job.id)]
    assert events[0] == "enqueued" and events[-1] == "succeeded"


def test_wait_answers_when_the_job_finishes_not_at_a_poll(client: goqueue.Client) -> None:
    job = client.enqueue("sleep", {"seconds": 1.0})
    started = time.monotonic()
    done = client.wait(job.id, timeout=20)
    waited = time.monotonic() - started
    assert done.result == {"slept": 1.0}
    # The job takes 1 s; the answer comes with its outcome, well before a poll would.
    assert 0.9 <= waited < 1.4, waited


def test_wait_raises_job_failed_with_the_error_and_attempts(client: goqueue.Client) -> None:
    job = client.enqueue("failnow", {})
    with pytest.raises(goqueue.JobFailed) as failed:
        client.wait(job.id, timeout=20)
    assert failed.value.attempts == 1 and "Fail: " in (failed.value.error or "")
    assert failed.value.job.status == "failed"


def test_wait_times_out_with_the_jobs_state_then(client: goqueue.Client) -> None:
    job = client.enqueue("sleep", {"seconds": 5})
    started = time.monotonic()
    with pytest.raises(TimeoutError) as timed_out:
        client.wait(job.id, timeout=0.6)
    assert 0.55 <= time.monotonic() - started < 2.0
    assert isinstance(timed_out.value, goqueue.WaitTimeout)
    assert timed_out.value.job.status in ("pending", "running")
    client.cancel(job.id, force=True)


def test_a_cancelled_job_ends_a_wait(client: goqueue.Client) -> None:
    client.pause("held")
    job = client.enqueue("noop", queue="held")
    threading.Timer(0.3, client.cancel, (job.id,)).start()
    with pytest.raises(goqueue.JobCancelled):
        client.wait(job.id, timeout=10)
    with pytest.raises(goqueue.Conflict):  # cancelling it again: it has finished
        client.cancel(job.id)


def test_list_walks_every_page_and_filters(client: goqueue.Client) -> None:
    client.pause("listed")
    made = [client.enqueue("noop", i, queue="listed").id for i in range(7)]
    listed = [job.id for job in client.list(queue="listed", page_size=3)]
    assert listed == made[::-1]  # newest first, across three pages
    assert client.jobs_page(queue="listed", limit=2).total == 7
    assert client.queue_stats("listed").counts["pending"] == 7
    assert client.resume("listed").paused is False


def test_enqueue_many_answers_each_job_on_its_own(client: goqueue.Client) -> None:
    jobs = [
        {"type": "noop", "payload": 1},
        {"type": "nope"},
        {"type": "noop", "priority": 99},
        {"type": "noop", "dedupe_key": "k", "dedupe_window_seconds": 60},
        {"type": "noop", "dedupe_key": "k", "dedupe_window_seconds": 60},
    ]
    first, unknown, invalid, keyed, duplicate = client.enqueue_many(jobs)
    assert isinstance(first, goqueue.Job) and first.payload == 1
    assert isinstance(unknown, goqueue.BadRequest) and unknown.field == "jobs[1].type"
    assert isinstance(invalid, goqueue.InvalidJob) and invalid.field == "priority"
    assert isinstance(keyed, goqueue.Job)
    assert isinstance(duplicate, goqueue.Conflict) and duplicate.existing_id == keyed.id


def test_enqueue_many_sends_a_request_per_thousand_jobs(client: goqueue.Client) -> None:
    client.pause("bulk")
    jobs = [{"type": "noop", "payload": i, "queue": "bulk"} for i in range(1500)]
    answers = client.enqueue_many(jobs)
    assert [a.payload for a in answers if isinstance(a, goqueue.Job)] == list(range(1500))
    assert client.queue_stats("bulk").counts["pending"] == 1500


def test_refusals_are_typed(client: goqueue.Client) -> None:
    with pytest.raises(goqueue.NotFound):
        client.get("00000000-0000-4000-8000-000000000000")
    with pytest.raises(goqueue.BadRequest) as unknown:
        client.enqueue("no_such_actor")
    assert unknown.value.field == "type"
    assert client.enqueue("no_such_actor", strict=False).status == "pending"
    client.enqueue("noop", idempotency_key="same")
    with pytest.raises(goqueue.IdempotencyMismatch):
        client.enqueue("noop", {"other": True}, idempotency_key="same")
    with pytest.raises(goqueue.Conflict) as duplicate:
        for _ in range(2):
            client.enqueue("noop", dedupe_key="d", dedupe_window_seconds=60)
    assert duplicate.value.existing_id is not None


def test_dead_letters_list_show_replay_purge(client: goqueue.Client) -> None:
    job = client.enqueue("failnow", {})
    with pytest.raises(goqueue.JobFailed):
        client.wait(job.id, timeout=20)
    (dead,) = [d for d in client.dlq.list() if d.job_id == job.id]
    assert client.dlq.get(dead.id).job.last_error == dead.job.last_error
    replayed = client.dlq.replay(dead.id)
    assert replayed.type == "failnow" and replayed.id != job.id
    with pytest.raises(goqueue.JobFailed):
        client.wait(replayed.id, timeout=20)
    (again,) = [d for d in client.dlq.list() if d.job_id == replayed.id]
    assert client.dlq.purge(again.id) == again.id
    with pytest.raises(goqueue.NotFound):
        client.dlq.get(again.id)
    assert sum(client.stats().workers.values()) == 2


def test_the_api_key_comes_from_the_environment(
    make_node: Callable[..., Node], monkeypatch: pytest.MonkeyPatch
) -> None:
    node = make_node(env={"GOQUEUE_API_KEY": "s3cret", "GOQUEUE_READ_API_KEY": "true"})
    monkeypatch.delenv("GOQUEUE_API_KEY", raising=False)
    monkeypatch.delenv("API_KEY", raising=False)
    with goqueue.Client(node.url) as keyless, pytest.raises(goqueue.Unauthorized):
        keyless.stats()
    monkeypatch.setenv("GOQUEUE_URL", node.url)
    monkeypatch.setenv("GOQUEUE_API_KEY", "s3cret")
    with goqueue.Client() as keyed:
        assert keyed.enqueue("noop").status in ("pending", "running")


def test_threads_share_one_client_and_its_connections(client: goqueue.Client) -> None:
    def produce(n: int) -> list[str]:
        return [client.enqueue("noop", {"n": n, "i": i}).id for i in range(25)]

    with ThreadPoolExecutor(8) as pool:
        ids = [job_id for batch in pool.map(produce, range(8)) for job_id in batch]
    assert len(set(ids)) == 200
    # Keep-alive: one thread reuses one socket for every request.
    conn = client._pool.take()
    client._pool.give(conn)
    sock = conn.sock
    for _ in range(20):
        client.get(ids[0])
    again = client._pool.take()
    assert again.sock is sock
    client._pool.give(again)


def test_the_async_client_shares_one_session_between_tasks(node: Node) -> None:
    async def main() -> None:
        async with goqueue.AsyncClient(node.url) as client:
            jobs = await asyncio.gather(*(client.enqueue("noop", i) for i in range(50)))
            assert len({job.id for job in jobs}) == 50
            done = await client.wait(jobs[-1].id, timeout=20)
            assert done.result == 49
            listed = [job.id async for job in client.list(type="noop", page_size=20)]
            assert set(listed) >= {job.id for job in jobs}
            with pytest.raises(goqueue.NotFound):
                await client.get("00000000-0000-4000-8000-000000000000")
            failed = await client.enqueue("failnow", {})
            with pytest.raises(goqueue.JobFailed):
                await client.wait(failed.id, timeout=20)
            assert any([d.job_id == failed.id async for d in client.dlq.list()])
            assert (await client.pause("aq")).paused and not (await client.resume("aq")).paused

    asyncio.run(main())


# -- retries ------------------------------------------------------------------------------


class DroppingProxy:
    """A TCP proxy on 127.0.0.1 in front of a node. The first `drops` connections
    forward the request, wait for the node's answer and then close without passing it
    on: the node did the work, the client never heard."""

    def __init__(self, upstream_port: int, drops: int) -> None:
        self.upstream = ("127.0.0.1", upstream_port)
        self.drops = drops
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.accepted = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self.listener.close()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            self.accepted += 1
            drop = self.accepted <= self.drops
            threading.Thread(target=self._pipe, args=(client, drop), daemon=True).start()

    def _pipe(self, client: socket.socket, drop: bool) -> None:
        upstream = socket.create_connection(self.upstream)
        if drop:
            upstream.sendall(_read_request(client))
            upstream.recv(65536)  # the node has answered: the job exists
            client.close()
            upstream.close()
            return
        pumps = [(client, upstream), (upstream, client)]
        threads = [threading.Thread(target=_pump, args=p, daemon=True) for p in pumps]
        for t in threads:
            t.start()


def _read_request(sock: socket.socket) -> bytes:
    """One whole HTTP request (head and Content-Length body), however TCP split it."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = re.search(rb"(?im)^content-length:\s*(\d+)", head)
    while length and len(body) < int(length.group(1)):
        body += sock.recv(65536)
    return head + b"\r\n\r\n" + body


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for s in (source, sink):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


@pytest.fixture
def proxy(node: Node) -> Iterator[Callable[[int], DroppingProxy]]:
    made: list[DroppingProxy] = []

    def make(drops: int) -> DroppingProxy:
        proxy = DroppingProxy(int(node.url.rsplit(":", 1)[1]), drops)
        made.append(proxy)
        return proxy

    yield make
    for proxy in made:
        proxy.close()


def test_a_dropped_answer_is_retried_and_never_enqueues_twice(
    node: Node, proxy: Callable[[int], DroppingProxy], tmp_path: Path
) -> None:
    front = proxy(1)
    with goqueue.Client(front.url, retries=Retries(attempts=2, base=0.05)) as client:
        job, created = client.submit("noop", {"tag": "once"})
    assert created  # the repeat answered 200, but this call's own first attempt made it
    assert front.accepted == 2
    with goqueue.Client(node.url) as direct:
        tagged = [j for j in direct.list(type="noop") if j.payload == {"tag": "once"}]
    assert [j.id for j in tagged] == [job.id]


def test_a_dropped_answer_to_an_unsafe_call_is_not_repeated(
    node: Node, proxy: Callable[[int], DroppingProxy]
) -> None:
    with goqueue.Client(node.url) as direct:
        direct.pause("held")
        job = direct.enqueue("noop", queue="held")
    front = proxy(1)
    with goqueue.Client(front.url, retries=Retries(attempts=3, base=0.05)) as client:
        with pytest.raises(goqueue.ConnectionFailed) as dropped:
            client.cancel(job.id)  # a second cancel would answer 409: not repeated
        assert dropped.value.sent
        assert front.accepted == 1
        assert client.get(job.id).status == "cancelled"


def test_a_refused_connection_is_retried_then_reported(tmp_path: Path) -> None:
    with socket.socket() as sock:  # bound, never listening: connections are refused
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        retries = Retries(attempts=2, base=0.05, cap=0.1)
        started = time.monotonic()
        with (
            goqueue.Client(url, retries=retries) as client,
            pytest.raises(goqueue.ConnectionFailed, match="connection refused") as info,
        ):
            client.cancel("00000000-0000-4000-8000-000000000000")
        assert not info.value.sent and time.monotonic() - started >= 0.07  # two retries


@pytest.mark.postgres
@pytest.mark.timeout(180)
def test_a_database_outage_is_ridden_out_with_one_job(
    make_node: Callable[..., Node], pg_cluster: object
) -> None:
    from tests.pgcluster import PgCluster

    assert isinstance(pg_cluster, PgCluster)
    node = make_node("--database-url", pg_cluster.dsn)
    met: list[goqueue.ClientError] = []

    class Counted(Retries):
        def delay(self, retry: int, error: goqueue.ClientError) -> float:
            met.append(error)
            return super().delay(retry, error)

    retries = Counted(attempts=60, base=0.2, cap=1.0)
    with goqueue.Client(node.url, timeout=15, retries=retries) as client:
        client.pause("outage")
        pg_cluster.stop("fast")
        try:
            wait_for(lambda: node.get("/ready").status == 503, timeout=20)
            result: list[object] = []
            producer = threading.Thread(
                target=lambda: result.append(client.submit("noop", "outage", queue="outage"))
            )
            producer.start()
            wait_for(lambda: len(met) >= 2, timeout=30)  # it meets the outage: 503s...
            assert producer.is_alive() and all(isinstance(e, goqueue.Unavailable) for e in met)
        finally:
            pg_cluster.start()
        producer.join(timeout=60)
        assert not producer.is_alive()
        ((job, created),) = result  # type: ignore[misc]
        assert created  # ...retried with the same key until the database was back
        assert [j.id for j in client.list(queue="outage")] == [job.id]


def test_templates_results_and_progress_come_back_as_python_values(
    client: goqueue.Client, tmp_path: Path
) -> None:
    then = {"type": "noop", "payload": {"step": 2}, "on_failure": {"type": "noop", "payload": [1]}}
    job = client.enqueue("noop", {"n": 1}, on_success=then, on_failure={"type": "noop"})
    done = client.wait(job.id, timeout=20)
    assert done.result == {"n": 1}
    assert done.on_success is not None and done.on_success.payload == {"step": 2}
    assert done.on_success.on_failure is not None and done.on_success.on_failure.payload == [1]
    assert done.on_failure is not None and done.on_failure.payload is None
    listed = next(j for j in client.list(type="noop") if j.id == job.id)
    assert listed.on_success == done.on_success
    report = client.enqueue(
        "reporter",
        {"reports": [0.4], "dir": str(tmp_path)},
        on_success={"type": "noop", "payload": {"after": True}},
    )
    try:
        running = wait_for(lambda: (j := client.get(report.id)).progress == 0.4 and j)
        assert running.on_success is not None and running.on_success.payload == {"after": True}
    finally:
        (tmp_path / "go").write_text("")  # the handler's cue to finish
    assert client.wait(report.id, timeout=20).result == "finished"


def test_the_async_client_decodes_templates_too(node: Node) -> None:
    async def main() -> None:
        async with goqueue.AsyncClient(node.url) as client:
            then = {"type": "noop", "payload": {"step": 2}}
            job = await client.enqueue("noop", {"n": 1}, on_success=then)
            assert job.on_success is not None and job.on_success.payload == {"step": 2}
            done = await client.wait(job.id, timeout=20)
            assert done.on_success == job.on_success and done.result == {"n": 1}

    asyncio.run(main())


def test_a_key_and_a_debounce_from_the_client(client: goqueue.Client) -> None:
    job = client.enqueue("noop", {"n": 1}, concurrency_key="tenant-9")
    assert job.concurrency_key == "tenant-9"
    listed = list(client.list(concurrency_key="tenant-9"))
    assert [j.id for j in listed] == [job.id]
    first, created = client.submit("noop", {"n": 1}, debounce_key="d", debounce_seconds=30)
    again, repeated = client.submit("noop", {"n": 2}, debounce_key="d", debounce_seconds=30)
    assert created and not repeated and again.id == first.id and again.payload == {"n": 2}
    with pytest.raises(goqueue.InvalidJob) as refused:  # checked before it is sent
        client.enqueue("noop", concurrency_key="")
    assert refused.value.field == "concurrency_key"
