"""The `goqueue` client subcommands against a real HTTP server on loopback.

The real API is built elsewhere; `FakeApi` is a small aiohttp server in a background thread
that answers canned JSON per (method, path) and records every request, so these tests see
exactly what the client sent and how it prints what came back.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from goqueue.api.cli.jobs import add_client_commands
from multidict import CIMultiDict

JOB_ID = "0b6f3f5e-6a38-4c1e-9a55-3f0c1f6c2a01"
OTHER_ID = "7d1c2b9a-1111-4c1e-9a55-3f0c1f6c2a02"
DEAD_ID = "c3a4d5e6-2222-4c1e-9a55-3f0c1f6c2a03"


def job(**overrides: Any) -> dict[str, Any]:
    """A job as the API returns it."""
    fields: dict[str, Any] = {
        "id": JOB_ID,
        "type": "email",
        "queue": "default",
        "payload": {"to": "a@example.com"},
        "priority": 5,
        "status": "pending",
        "attempts": 0,
        "max_retries": 3,
        "run_at": "2025-01-31T09:00:00.123456Z",
        "timeout_seconds": None,
        "dedupe_key": None,
        "webhook_url": None,
        "on_success": None,
        "on_failure": None,
        "parent_id": None,
        "result": None,
        "last_error": None,
        "errors": [],
        "created_at": "2025-01-31T09:00:00.123456Z",
        "started_at": None,
        "finished_at": None,
        "updated_at": "2025-01-31T09:00:00.123456Z",
        "unique_key": None,
        "workflow_id": None,
        "step_key": None,
        "parent_ids": None,
        "parents": None,
        "concurrency_key": None,
        "debounce_key": None,
    }
    return fields | overrides


def queue_stats(name: str, paused: bool) -> dict[str, Any]:
    """One queue's stats as the API returns them."""
    statuses = ("pending", "running", "done", "failed", "cancelled")
    return {"queue": name, "counts": dict.fromkeys(statuses, 0), "depth_by_priority": {},
            "paused": paused}  # fmt: skip


def dead_letter() -> dict[str, Any]:
    """A dead letter as the API returns it."""
    errors = [
        {"attempt": 1, "error": "boom", "at": "2025-01-31T09:00:01Z"},
        {"attempt": 2, "error": "boom again", "at": "2025-01-31T09:00:03Z"},
    ]
    snapshot = job(status="failed", attempts=2, last_error="boom again", errors=errors)
    return {
        "id": DEAD_ID,
        "job_id": JOB_ID,
        "job": snapshot,
        "errors": errors,
        "created_at": "2025-01-31T09:00:04Z",
    }


@dataclass
class Recorded:
    """One request the fake received."""

    method: str
    path: str
    raw_path: str
    query: dict[str, str]
    headers: CIMultiDict[str]
    body: Any


@dataclass
class Reply:
    """A canned answer; `hang` holds it until the server stops (to provoke timeouts)."""

    status: int
    body: Any
    hang: bool = False


class FakeApi:
    """A real aiohttp server on 127.0.0.1 (ephemeral port), run in a background thread."""

    def __init__(self) -> None:
        self.replies: dict[tuple[str, str], Reply] = {}
        self.requests: list[Recorded] = []
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None
        self._release: asyncio.Event | None = None

    def reply(self, method: str, path: str, status: int, body: Any, hang: bool = False) -> None:
        """Answer `method path` with `status` and the JSON `body`."""
        self.replies[(method, path)] = Reply(status, body, hang)

    def last(self) -> Recorded:
        """The most recent request."""
        assert self.requests, "the client sent no request"
        return self.requests[-1]

    def start(self) -> None:
        """Start the loop thread and wait until the server listens."""
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._serve(), self._loop).result(timeout=10)

    def stop(self) -> None:
        """Release hanging handlers, shut the server down, end the thread."""
        if self._release is not None:
            self._loop.call_soon_threadsafe(self._release.set)
        if self._runner is not None:
            cleanup = asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop)
            cleanup.result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    async def _serve(self) -> None:
        self._release = asyncio.Event()
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"

    async def _handle(self, request: web.Request) -> web.Response:
        raw = await request.read()
        self.requests.append(
            Recorded(
                method=request.method,
                path=request.path,
                raw_path=request.raw_path,
                query=dict(request.query),
                headers=request.headers.copy(),
                body=json.loads(raw) if raw else None,
            )
        )
        reply = self.replies.get((request.method, request.path))
        if reply is None:
            return web.json_response(
                {"error": "not found", "details": {"path": request.path}}, status=404
            )
        if reply.hang:
            assert self._release is not None
            await self._release.wait()
        return web.json_response(reply.body, status=reply.status)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No ambient URL, key or proxy may leak into a test."""
    for name in ("GOQUEUE_URL", "GOQUEUE_API_KEY", "API_KEY"):
        monkeypatch.delenv(name, raising=False)
    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)


@pytest.fixture
def api() -> Iterator[FakeApi]:
    """A running fake API, stopped after the test."""
    fake = FakeApi()
    fake.start()
    yield fake
    fake.stop()


def run(*argv: str) -> int:
    """Parse argv as `goqueue` would and run the chosen subcommand."""
    parser = argparse.ArgumentParser(prog="goqueue")
    add_client_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


@pytest.mark.timeout(30)
def test_enqueue_sends_every_field_and_both_headers(
    api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    api.reply("POST", "/jobs", 201, job())
    code = run(
        "enqueue", "email", "--url", api.url, "--api-key", "s3cret",
        "--payload", '{"to": "a@example.com", "n": [1, 2]}',
        "--queue", "mail", "--priority", "9", "--max-retries", "5", "--delay", "2.5",
        "--timeout", "30", "--dedupe-key", "welcome-42", "--dedupe-window", "600",
        "--idempotency-key", "req-1", "--webhook-url", "http://127.0.0.1:9/hook",
        "--on-success", '{"type": "report"}',
    )  # fmt: skip
    assert code == 0
    sent = api.last()
    assert (sent.method, sent.path) == ("POST", "/jobs")
    assert sent.headers["X-API-Key"] == "s3cret"
    assert sent.headers["Idempotency-Key"] == "req-1"
    assert sent.headers["Content-Type"] == "application/json"
    assert sent.body == {
        "type": "email",
        "queue": "mail",
        "payload": {"to": "a@example.com", "n": [1, 2]},
        "priority": 9,
        "max_retries": 5,
        "delay_seconds": 2.5,
        "timeout_seconds": 30.0,
        "dedupe_key": "welcome-42",
        "dedupe_window_seconds": 600.0,
        "webhook_url": "http://127.0.0.1:9/hook",
        "on_success": {"type": "report"},
    }
    out = capsys.readouterr().out
    assert f"enqueued job {JOB_ID}" in out
    assert "status" in out and "pending" in out


@pytest.mark.timeout(30)
def test_enqueue_sends_only_what_was_given_and_a_fresh_idempotency_key(
    api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    api.reply("POST", "/jobs", 201, job())
    assert run("enqueue", "email", "--url", api.url, "--run-at", "2030-01-01T00:00:00Z") == 0
    first = api.last()
    assert first.body == {"type": "email", "run_at": "2030-01-01T00:00:00Z"}
    assert "X-API-Key" not in first.headers
    # A key of its own (a UUID), so a retry can never enqueue twice; a new one per command.
    assert run("enqueue", "email", "--url", api.url) == 0
    # (only the enqueues: under load another test's stray request may reach this port)
    enqueues = [r for r in api.requests if (r.method, r.path) == ("POST", "/jobs")]
    keys = [r.headers["Idempotency-Key"] for r in enqueues]
    assert len({str(uuid.UUID(key)) for key in keys}) == 2


@pytest.mark.timeout(30)
def test_a_repeat_of_its_own_key_is_still_reported_as_enqueued(
    api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    # A 200 to a key the client made up means its own earlier attempt created the job.
    api.reply("POST", "/jobs", 200, job())
    assert run("enqueue", "email", "--url", api.url) == 0
    assert f"enqueued job {JOB_ID}" in capsys.readouterr().out


@pytest.mark.timeout(30)
def test_enqueue_idempotent_repeat_says_nothing_was_enqueued(
    api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    api.reply("POST", "/jobs", 200, job())
    assert run("enqueue", "email", "--url", api.url, "--idempotency-key", "req-1") == 0
    out = capsys.readouterr().out
    assert "already exists" in out and JOB_ID in out


@pytest.mark.timeout(30)
def test_payload_is_read_from_a_file(
    api: FakeApi, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "payload.json"
    path.write_text('{"rows": 3}', encoding="utf-8")
    api.reply("POST", "/jobs", 201, job())
    assert run("enqueue", "report", "--url", api.url, "--payload", f"@{path}") == 0
    assert api.last().body == {"type": "report", "payload": {"rows": 3}}


@pytest.mark.timeout(30)
def test_invalid_payload_is_a_usage_error_before_any_request(
    api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        run("enqueue", "email", "--url", api.url, "--payload", "{not json")
    assert exc.value.code == 2
    assert "--payload" in capsys.readouterr().err
    assert api.requests == []


@pytest.mark.timeout(30)
def test_dedupe_window_without_key_is_refused_locally(
    api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run("enqueue", "email", "--url", api.url, "--dedupe-window", "60") == 2
    assert "--dedupe-key" in capsys.readouterr().err
    assert api.requests == []


@pytest.mark.timeout(30)
def test_api_key_comes_from_the_environment(
    api: FakeApi, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    api.reply("POST", "/queues/mail/pause", 200, queue_stats("mail", paused=True))
    monkeypatch.setenv("API_KEY", "from-api-key")
    assert run("pause", "mail", "--url", api.url) == 0
    assert api.last().headers["X-API-Key"] == "from-api-key"

    monkeypatch.setenv("GOQUEUE_API_KEY", "from-goqueue")
    assert run("pause", "mail", "--url", api.url) == 0
    assert api.last().headers["X-API-Key"] == "from-goqueue"

    assert run("pause", "mail", "--url", api.url, "--api-key", "from-flag") == 0
    assert api.last().headers["X-API-Key"] == "from-flag"
    assert "queue mail: paused" in capsys.readouterr().out


@pytest.mark.timeout(30)
def test_url_comes_from_the_environment(
    api: FakeApi, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    api.reply("POST", "/queues/mail/resume", 200, queue_stats("mail", paused=False))
    monkeypatch.setenv("GOQUEUE_URL", api.url + "/")
    assert run("resume", "mail") == 0
    assert api.last().path == "/queues/mail/resume"
    assert "queue mail: resumed" in capsys.readouterr().out


@pytest.mark.timeout(30)
def test_jobs_table_lists_ids_and_passes_filters(
    api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    jobs = [job(), job(id=OTHER_ID, type="report", status="running", attempts=1, priority=10)]
    api.reply("GET", "/jobs", 200, {"jobs": jobs, "total": 12, "limit": 2, "offset": 4})
    code = run(
        "jobs", "--url", api.url, "--type", "email", "--status", "running",
        "--queue", "mail", "--limit", "2", "--offset", "4",
    )  # fmt: skip
    assert code == 0
    query = api.last().query
    assert query == {"type": "email", "status": "running", "queue": "mail", "limit": "2",
                     "offset": "4"}  # fmt: skip
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == [
        "ID", "TYPE", "QUEUE", "STATUS", "PRIORITY", "ATTEMPTS", "CREATED_AT"
    ]  # fmt: skip
    assert JOB_ID in lines[1] and "2025-01-31 09:00:00Z" in lines[1]
    assert OTHER_ID in lines[2] and "running" in lines[2]
    # Columns line up: every row's status starts where the header's does.
    column = lines[0].index("STATUS")
    assert lines[1][column:].startswith("pending")
    assert lines[2][column:].startswith("running")
    assert lines[-1] == "showing 5-6 of 12 jobs"


@pytest.mark.timeout(30)
def test_jobs_json_prints_the_answer_as_is(
    api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    page = {"jobs": [job()], "total": 1, "limit": 50, "offset": 0}
    api.reply("GET", "/jobs", 200, page)
    assert run("jobs", "--url", api.url, "--json") == 0
    assert json.loads(capsys.readouterr().out) == page
    assert api.last().query == {}


@pytest.mark.timeout(30)
def test_empty_job_list(api: FakeApi, capsys: pytest.CaptureFixture[str]) -> None:
    api.reply("GET", "/jobs", 200, {"jobs": [], "total": 0, "limit": 50, "offset": 0})
    assert run("jobs", "--url", api.url) == 0
    assert capsys.readouterr().out.strip() == "no jobs"


@pytest.mark.timeout(30)
def test_job_shows_a_key_value_block(api: FakeApi, capsys: pytest.CaptureFixture[str]) -> None:
    errors = [{"attempt": 1, "error": "smtp down", "at": "2025-01-31T09:00:01Z"}]
    failed = job(attempts=1, last_error="smtp down\nretry later", errors=errors)
    api.reply("GET", f"/jobs/{JOB_ID}", 200, failed)
    assert run("job", JOB_ID, "--url", api.url) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split() == ["id", JOB_ID]
    at = next(i for i, line in enumerate(lines) if line.startswith("last_error"))
    assert lines[at].split() == ["last_error", "smtp", "down"]
    # A multi-line value continues in the value column, not at the margin.
    assert lines[at + 1].index("retry later") == lines[at].index("smtp down")
    assert '{"to":"a@example.com"}' in out
    assert "errors:" in out and "ATTEMPT" in out


@pytest.mark.timeout(30)
def test_events_table(api: FakeApi, capsys: pytest.CaptureFixture[str]) -> None:
    events = [
        {"job_id": JOB_ID, "event": "enqueued", "at": "2025-01-31T09:00:00Z", "node": "n1",
         "attempt": 0, "detail": None},
        {"job_id": JOB_ID, "event": "started", "at": "2025-01-31T09:00:01Z", "node": "n1",
         "attempt": 1, "detail": None},
    ]  # fmt: skip
    api.reply("GET", f"/jobs/{JOB_ID}/events", 200, {"events": events})
    assert run("events", JOB_ID, "--url", api.url) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["AT", "EVENT", "ATTEMPT", "NODE", "DETAIL"]
    assert "enqueued" in lines[1] and "started" in lines[2]


@pytest.mark.timeout(30)
def test_cancel_with_force(api: FakeApi, capsys: pytest.CaptureFixture[str]) -> None:
    api.reply("DELETE", f"/jobs/{JOB_ID}", 200, job(status="cancelled"))
    assert run("cancel", JOB_ID, "--force", "--url", api.url, "--api-key", "k") == 0
    sent = api.last()
    assert sent.query == {"force": "true"}
    assert sent.headers["X-API-Key"] == "k"
    assert capsys.readouterr().out.strip() == f"job {JOB_ID}: cancelled"

    assert run("cancel", JOB_ID, "--url", api.url) == 0
    assert api.last().query == {}


@pytest.mark.timeout(30)
def test_stats(api: FakeApi, capsys: pytest.CaptureFixture[str]) -> None:
    stats = {
        "counts": {"pending": 4, "running": 1, "done": 120, "failed": 2, "cancelled": 0},
        "queues": {"default": {"5": 3, "10": 1}},
        "dead_letters": 2,
        "workers": {"busy": 1, "idle": 3},
    }
    api.reply("GET", "/stats", 200, stats)
    assert run("stats", "--url", api.url) == 0
    out = capsys.readouterr().out
    assert any(line.split() == ["done", "120"] for line in out.splitlines())
    assert any(line.split() == ["default", "4", "10:1", "5:3"] for line in out.splitlines())
    assert "dead letters  2" in out
    assert "busy 1, idle 3" in out


@pytest.mark.timeout(30)
def test_queue_stats(api: FakeApi, capsys: pytest.CaptureFixture[str]) -> None:
    stats = {
        "queue": "mail",
        "counts": {"pending": 3, "running": 0, "done": 7, "failed": 0, "cancelled": 1},
        "depth_by_priority": {"5": 3},
        "paused": True,
    }
    api.reply("GET", "/queues/mail/stats", 200, stats)
    assert run("queue-stats", "mail", "--url", api.url) == 0
    out = capsys.readouterr().out
    assert any(line.split() == ["paused", "yes"] for line in out.splitlines())
    assert any(line.split() == ["done", "7"] for line in out.splitlines())


@pytest.mark.timeout(30)
def test_dlq_list_show_replay_purge(api: FakeApi, capsys: pytest.CaptureFixture[str]) -> None:
    letter = dead_letter()
    api.reply("GET", "/dlq", 200, {"dead_letters": [letter], "total": 1, "limit": 50, "offset": 0})
    api.reply("GET", f"/dlq/{DEAD_ID}", 200, letter)
    api.reply("POST", f"/dlq/{DEAD_ID}/replay", 201, job(id=OTHER_ID))
    api.reply("DELETE", f"/dlq/{DEAD_ID}", 200, {"purged": DEAD_ID})

    assert run("dlq", "list", "--url", api.url, "--limit", "10") == 0
    out = capsys.readouterr().out
    assert DEAD_ID in out and JOB_ID in out and "boom again" in out
    assert api.last().query == {"limit": "10"}

    assert run("dlq", "show", DEAD_ID, "--url", api.url) == 0
    out = capsys.readouterr().out
    head, _, snapshot = out.partition("\njob:\n")
    assert "boom again" in head and "ATTEMPT" in head
    assert snapshot.splitlines()[0].split() == ["id", JOB_ID]
    assert snapshot.startswith("  id ")

    assert run("dlq", "replay", DEAD_ID, "--url", api.url) == 0
    assert capsys.readouterr().out.strip() == f"dead letter {DEAD_ID} replayed as job {OTHER_ID}"

    assert run("dlq", "purge", DEAD_ID, "--url", api.url, "--json") == 0
    assert json.loads(capsys.readouterr().out) == {"purged": DEAD_ID}
    assert [(r.method, r.path) for r in api.requests] == [
        ("GET", "/dlq"),
        ("GET", f"/dlq/{DEAD_ID}"),
        ("POST", f"/dlq/{DEAD_ID}/replay"),
        ("DELETE", f"/dlq/{DEAD_ID}"),
    ]


@pytest.mark.timeout(30)
def test_ids_are_quoted_into_one_path_segment(
    api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run("job", "../stats", "--url", api.url) == 1
    assert api.last().raw_path == "/jobs/..%2Fstats"
    assert "not found" in capsys.readouterr().err


@pytest.mark.timeout(30)
def test_http_error_prints_the_servers_message_and_exits_1(
    api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    api.reply("POST", "/jobs", 409, {"error": "duplicate job", "details": {"existing_id": JOB_ID}})
    argv = ("--dedupe-key", "k", "--dedupe-window", "60")
    assert run("enqueue", "email", "--url", api.url, *argv) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "duplicate job (HTTP 409)" in captured.err
    assert JOB_ID in captured.err
    assert "Traceback" not in captured.err


@pytest.mark.timeout(30)
def test_a_job_the_node_would_refuse_is_not_sent_and_exits_2(
    api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run("enqueue", "email", "--url", api.url, "--priority", "11") == 2
    err = capsys.readouterr().err
    assert "invalid job (not sent)" in err and '"field":"priority"' in err
    assert api.requests == []


@pytest.mark.timeout(30)
def test_unauthorized_without_a_key_hints_at_the_option(
    api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    api.reply("DELETE", f"/jobs/{JOB_ID}", 401, {"error": "missing or wrong X-API-Key"})
    assert run("cancel", JOB_ID, "--url", api.url) == 1
    err = capsys.readouterr().err
    assert "missing or wrong X-API-Key (HTTP 401)" in err
    assert "--api-key" in err


@pytest.mark.timeout(30)
def test_refused_connection_exits_2_with_one_clear_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # A bound socket that never listens: connecting to it is refused, and no other test or
    # process can take the port while we hold it.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        assert run("stats", "--url", f"http://127.0.0.1:{port}") == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1
    assert "connection refused" in lines[0] and str(port) in lines[0]


@pytest.mark.timeout(30)
def test_no_answer_in_time_exits_2(api: FakeApi, capsys: pytest.CaptureFixture[str]) -> None:
    api.reply("GET", "/stats", 200, {}, hang=True)
    started = time.monotonic()
    assert run("stats", "--url", api.url, "--http-timeout", "0.5") == 2
    assert time.monotonic() - started < 10
    assert "no answer" in capsys.readouterr().err


@pytest.mark.timeout(30)
def test_a_malformed_url_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert run("stats", "--url", "127.0.0.1:8080") == 2
    assert "invalid URL" in capsys.readouterr().err


@pytest.mark.timeout(30)
def test_connection_options_work_before_the_command(
    api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    from goqueue.api.cli import main as cli

    api.reply("GET", "/stats", 200, {"counts": {}, "queues": {}, "dead_letters": 0,
                                      "workers": {}})  # fmt: skip
    assert cli.main(["--url", api.url, "--api-key", "before", "stats"]) == 0
    assert api.last().headers["X-API-Key"] == "before"
    # Given after the command too, the later one wins.
    assert cli.main(["--url", "http://127.0.0.1:9", "stats", "--url", api.url]) == 0
    assert cli.main(["--api-key", "before", "stats", "--url", api.url, "--api-key", "after"]) == 0
    assert api.last().headers["X-API-Key"] == "after"


@pytest.mark.timeout(30)
def test_a_key_before_serve_is_refused_not_ignored(capsys: pytest.CaptureFixture[str]) -> None:
    from goqueue.api.cli import main as cli

    assert cli.main(["--api-key", "k", "serve", "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert "--api-key before the command" in err and "after `serve`" in err


@pytest.mark.timeout(30)
def test_a_reader_that_leaves_early_gets_no_broken_pipe(api: FakeApi) -> None:
    jobs = [job(id=str(uuid.uuid4())) for _ in range(300)]  # more than a pipe holds
    api.reply("GET", "/jobs", 200, {"jobs": jobs, "total": 300, "limit": 300, "offset": 0})
    proc = subprocess.Popen(
        [sys.executable, "-m", "goqueue.api.cli.main", "jobs", "--url", api.url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline().split()[0] == b"ID"  # `| head -1`
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=20) == 0
    assert err == "", err
