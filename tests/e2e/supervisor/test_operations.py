"""Operating a real node: metrics after known work, signed webhooks, queues, recycling,
JSON logs and the CLI client against the live API."""

from __future__ import annotations

import hashlib
import hmac
import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from goqueue.supervisor.common.enums import RestartReason
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import ROOT, Node, request, wait_for

pytestmark = pytest.mark.timeout(60)


def metric_samples(node: Node) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = request("GET", node.url + "/metrics").body
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def test_metrics_count_known_work(make_node) -> None:
    node = make_node("--retry-base", "0.05")
    ok = [node.enqueue(type="noop", payload=i) for i in range(5)]
    bad = node.enqueue(type="failnow")
    flaky = node.enqueue(type="flaky", payload={"failures": 1})
    for job in ok:
        node.wait_status(job["id"], "done")
    node.wait_status(bad["id"], "failed")
    node.wait_status(flaky["id"], "done")
    s = metric_samples(node)
    assert s[("goqueue_jobs_total", (("status", "done"), ("type", "noop")))] == 5
    assert s[("goqueue_jobs_total", (("status", "failed"), ("type", "failnow")))] == 1
    assert s[("goqueue_job_retries_total", (("type", "flaky"),))] == 1
    assert s[("goqueue_attempt_duration_seconds_count", (("type", "noop"),))] == 5
    inf = s[("goqueue_attempt_duration_seconds_bucket", (("le", "+Inf"), ("type", "noop")))]
    assert inf == 5
    route = (("method", "POST"), ("route", "/jobs"), ("status", "201"))
    assert s[("goqueue_http_requests_total", route)] == 7
    # every restart reason is exported from boot, lease_lost included (it once was not)
    for reason in RestartReason:
        assert s[("goqueue_worker_restarts_total", (("reason", reason.value),))] == 0


class Receiver:
    """A local webhook receiver: fails the first `failures` deliveries, records all."""

    def __init__(self, failures: int = 0) -> None:
        self.failures = failures
        self.deliveries: list[tuple[int, dict[str, str], bytes]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                fail = len(receiver.deliveries) < receiver.failures
                status = 500 if fail else 200
                receiver.deliveries.append((status, dict(self.headers), body))
                self.send_response(status)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()


def test_webhook_is_signed_and_retried_until_delivered(make_node) -> None:
    receiver = Receiver(failures=2)
    try:
        node = make_node("--webhook-secret", "s3cret", "--webhook-allow-hosts", "127.0.0.1")
        job = node.enqueue(type="noop", payload="hi", webhook_url=receiver.url)
        node.wait_status(job["id"], "done")
        wait_for(lambda: len(receiver.deliveries) == 3, timeout=30)
        status, headers, body = receiver.deliveries[-1]
        assert status == 200
        expected = hmac.new(b"s3cret", body, hashlib.sha256).hexdigest()
        assert headers["X-GoQueue-Signature"] == f"sha256={expected}"
        sent = json.loads(body)
        assert sent["id"] == job["id"] and sent["status"] == "done"
        s = metric_samples(node)
        assert s[("goqueue_webhook_deliveries_total", (("outcome", "delivered"),))] == 1
        assert s[("goqueue_webhook_deliveries_total", (("outcome", "retried"),))] == 2
    finally:
        receiver.close()


def test_node_serves_only_its_queues(make_node) -> None:
    node = make_node("--queues", "fast")
    mine = node.enqueue(type="noop", queue="fast")
    other = node.enqueue(type="noop", queue="slow")
    node.wait_status(mine["id"], "done")
    assert node.get(f"/jobs/{other['id']}").body["status"] == "pending"
    stats = node.get("/queues/slow/stats").body
    assert stats["counts"]["pending"] == 1


def test_paused_queue_holds_its_jobs_until_resumed(node: Node) -> None:
    assert node.post("/queues/bulk/pause").status == 200
    job = node.enqueue(type="noop", queue="bulk")
    other = node.enqueue(type="noop")
    node.wait_status(other["id"], "done")
    assert node.get(f"/jobs/{job['id']}").body["status"] == "pending"
    depth = (("priority", "5"), ("queue", "bulk"))
    assert metric_samples(node)[("goqueue_queue_depth", depth)] == 1
    assert node.post("/queues/bulk/resume").status == 200
    node.wait_status(job["id"], "done")
    assert metric_samples(node).get(("goqueue_queue_depth", depth), 0) == 0


def test_worker_over_the_rss_limit_is_recycled(make_node, tmp_path: Path) -> None:
    node = make_node("--workers", "1", "--max-worker-rss-mb", "1")
    jobs = [node.enqueue(type="counted", payload={"dir": str(tmp_path)}) for _ in range(3)]
    for job in jobs:
        node.wait_status(job["id"], "done")
    pids = {line.split()[1] for line in (tmp_path / "runs.log").read_text().splitlines()}
    assert len(pids) == 3
    s = metric_samples(node)
    assert s[("goqueue_worker_restarts_total", (("reason", "recycle"),))] >= 3


def test_logs_are_json_lines_with_job_fields(make_node) -> None:
    node = make_node("--log-level", "debug")
    job = node.enqueue(type="failnow")
    node.wait_status(job["id"], "failed")

    def records_of_job() -> list[dict[str, object]]:
        lines = node.logs().splitlines()
        records = [json.loads(line) for line in lines if line.startswith("{")]
        return [r for r in records if r.get("job_id") == job["id"]]

    # The after-outcome hooks log once the failure is stored, so the status can be read
    # before the dead-letter line is written: wait for that line, then check every record.
    wait_for(lambda: any(r["msg"] == "job dead-lettered" for r in records_of_job()))
    mine = records_of_job()
    assert mine and all(r["type"] == "failnow" and "attempt" in r for r in mine)
    assert any(r["msg"] == "job dead-lettered" for r in mine)


def test_cli_client_against_a_live_node(node: Node) -> None:
    def goqueue(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "goqueue.api.cli.main", *args, "--url", node.url],
            capture_output=True,
            text=True,
            timeout=30,
            cwd=ROOT,
        )

    out = goqueue("enqueue", "noop", "--payload", '{"n": 5}', "--json")
    assert out.returncode == 0, out.stderr
    job = json.loads(out.stdout)
    node.wait_status(job["id"], "done")
    listing = goqueue("jobs", "--status", "done")
    assert listing.returncode == 0 and job["id"] in listing.stdout
    shown = goqueue("job", job["id"], "--json")
    assert json.loads(shown.stdout)["result"] == {"n": 5}
    stats = goqueue("stats", "--json")
    assert json.loads(stats.stdout)["counts"]["done"] >= 1
    missing = goqueue("job", "00000000-0000-0000-0000-000000000000")
    assert missing.returncode == 1 and "not found" in missing.stderr.lower()
