"""Actors as producers: `.send()` and `.send_async()` through the client configured once,
with the actor's declared defaults; and what importing `goqueue` loads."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import goqueue
import pytest
from goqueue.client import default

from tests.conftest import FIXTURES, Node

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def configured(node: Node) -> Iterator[Node]:
    """`goqueue.configure` pointed at the node, undone afterwards."""
    goqueue.configure(url=node.url)
    yield node
    goqueue.configure()


@pytest.fixture
def testactors(monkeypatch: pytest.MonkeyPatch) -> object:
    monkeypatch.syspath_prepend(str(FIXTURES))
    import testactors

    return testactors


def test_send_uses_the_actors_declared_defaults(configured: Node, testactors: object) -> None:
    routed = testactors.routed  # type: ignore[attr-defined]
    job = routed.send({"a": 1})
    assert (job.type, job.queue, job.priority) == ("routed", "special", 8)
    assert (job.max_retries, job.timeout_seconds, job.payload) == (1, 20.0, {"a": 1})
    own = routed.send(None, queue="q2", priority=1, timeout_seconds=3.5)
    assert (own.queue, own.priority, own.timeout_seconds) == ("q2", 1, 3.5)
    assert default.client().wait(job.id, timeout=20).result == {"queue": "special"}


def test_send_takes_a_client_of_its_own(node: Node, testactors: object) -> None:
    goqueue.configure(url="http://127.0.0.1:9")  # nothing listens: must not be used
    try:
        with goqueue.Client(node.url) as client:
            job = testactors.noop.send({"x": 1}, client=client)  # type: ignore[attr-defined]
            assert client.wait(job.id, timeout=20).result == {"x": 1}
    finally:
        goqueue.configure()


def test_configure_checks_the_url_at_once() -> None:
    with pytest.raises(ValueError, match="invalid URL"):
        goqueue.configure(url="127.0.0.1:8080")


def run_python(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-X", "dev", "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": str(FIXTURES), "PATH": "/usr/bin:/bin", **(env or {})},
    )


def test_send_async_gets_a_client_per_loop_closed_with_the_loop(node: Node) -> None:
    out = run_python(
        """
        import asyncio
        import goqueue
        import testactors

        async def main():
            job = await testactors.noop.send_async({"n": 1}, priority=9)
            again = await testactors.noop.send_async({"n": 2})
            return job.priority, job.id != again.id

        print(asyncio.run(main()), asyncio.run(main()))
        """,
        {"GOQUEUE_URL": node.url},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "(9, True) (9, True)"
    # -X dev shows ResourceWarnings: an unclosed session or connector would be here.
    assert "Unclosed" not in out.stderr and "Exception ignored" not in out.stderr, out.stderr


def loaded(code: str) -> list[str]:
    """The GoQueue, aiohttp and psycopg modules loaded after running `code`."""
    probe = run_python(
        code + "\nimport sys\nprint(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('goqueue', 'aiohttp', 'psycopg')))"
    )
    assert probe.returncode == 0, probe.stderr
    return eval(probe.stdout)  # a list literal we printed ourselves


def test_importing_goqueue_loads_only_what_workers_need() -> None:
    modules = loaded("import goqueue")
    assert all(m == "goqueue" or m.startswith("goqueue.actors") for m in modules), modules


def test_the_blocking_client_loads_no_aiohttp_and_no_psycopg() -> None:
    modules = loaded("import goqueue\ngoqueue.Client\ngoqueue.configure\ngoqueue.JobFailed")
    assert "goqueue.client" in modules
    assert not [m for m in modules if m.startswith(("aiohttp", "psycopg", "goqueue.api.http.app"))]
    assert "goqueue.supervisor.engine" not in modules


def test_the_async_client_and_pg_load_their_own_dependencies() -> None:
    assert "aiohttp" in loaded("import goqueue\ngoqueue.AsyncClient")
    modules = loaded("import goqueue\ngoqueue.pg.enqueue")
    assert "psycopg" in modules and "aiohttp" not in modules


def test_an_actor_module_that_sends_loads_no_client_until_it_sends(tmp_path: Path) -> None:
    modules = loaded("import testactors\ntestactors.noop.send")
    assert "goqueue.client" not in modules
