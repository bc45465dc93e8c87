"""The summary routes the dashboard polls, and the dashboard's static files, over real
HTTP against a real engine (in-memory store, no workers), and the history of a live node
that runs jobs."""

from __future__ import annotations

import gzip
import re
from typing import Any

import pytest
from goqueue.api.http.ui import load_assets

from tests.conftest import Node, wait_for
from tests.e2e.api.conftest import ApiServer
from tests.e2e.api.test_routes import UNKNOWN_ID, email, enqueue, make_dead_letter

pytestmark = pytest.mark.timeout(30)


# -- GET /stats/history ----------------------------------------------------------------


def test_history_answers_the_ring_and_shared_store_counts(api_server: ApiServer) -> None:
    for _ in range(3):
        enqueue(api_server)
    first = api_server.get("/stats/history")
    assert first.status == 200, first.body
    body = first.json
    assert body["bucket_seconds"] == 5 and body["node"]
    series = body["series"]
    assert set(series) == {"start", "done", "failed", "depth"}
    assert len({len(column) for column in series.values()}) == 1 and series["start"]
    assert all(b - a == 5 for a, b in zip(series["start"], series["start"][1:], strict=False))
    assert series["depth"][-1] == 3  # the read noted the depth in the newest bucket
    latest = body["latest"]
    assert latest["counts"]["pending"] == 3 and latest["dead_letters"] == 0
    assert latest["busiest"] == [{"name": "default", "pending": 3}]
    assert body["workers"] == {"busy": 0, "idle": 0, "booting": 0, "stopping": 0}
    assert "store_error" not in body
    # a second caller within 2 s gets the same store read, not a new one
    enqueue(api_server)
    again = api_server.get("/stats/history").json
    assert again["latest"] == latest
    # and `since` answers only the newer buckets
    newest = series["start"][-1]
    assert api_server.get(f"/stats/history?since={newest}").json["series"]["start"] == [newest]
    assert api_server.get(f"/stats/history?since={newest + 3600}").json["series"]["start"] == []


def test_a_live_nodes_history_counts_the_jobs_it_ran_and_the_attempts_that_failed(
    node: Node,
) -> None:
    for _ in range(3):
        node.enqueue(type="noop")
    node.enqueue(type="failnow")  # dead-lettered at its first attempt
    node.enqueue(type="later", payload={"delay": 0.05})  # retried once, then done

    def counted() -> tuple[int, int] | None:
        series = node.get("/stats/history").body["series"]
        totals = sum(series["done"]), sum(series["failed"])
        return totals if totals == (4, 2) else None

    wait_for(counted, timeout=15)


@pytest.mark.parametrize(
    "query", ["since=-1", "since=abc", "since=1e9", "sinse=1", "since=1&since=2"]
)
def test_history_refuses_bad_parameters(api_server: ApiServer, query: str) -> None:
    resp = api_server.get(f"/stats/history?{query}")
    assert resp.status == 400, resp.body
    assert "parameter" in resp.json["details"]


# -- GET /queues -----------------------------------------------------------------------


def test_queues_lists_work_and_pauses_at_once(api_server: ApiServer) -> None:
    enqueue(api_server, queue="mail", priority=9)
    enqueue(api_server, queue="mail", priority=1)
    enqueue(api_server, queue="later", delay_seconds=600)
    queues = api_server.get("/queues")
    assert queues.status == 200
    by_name = {q["name"]: q for q in queues.json["queues"]}
    assert list(by_name) == ["later", "mail"]
    mail = by_name["mail"]
    assert mail["pending"] == 2 and mail["scheduled"] == 0 and mail["running"] == 0
    assert mail["depth_by_priority"] == {"9": 1, "1": 1}
    assert mail["waiting_seconds"] >= 0 and mail["oldest_due_at"] and not mail["paused"]
    assert by_name["later"]["scheduled"] == 1 and by_name["later"]["waiting_seconds"] is None
    # pausing is seen by the very next read (the shared answer is forgotten)
    assert api_server.post("/queues/mail/pause").status == 200
    assert api_server.post("/queues/empty/pause").status == 200
    after = {q["name"]: q for q in api_server.get("/queues").json["queues"]}
    assert after["mail"]["paused"] and after["empty"]["paused"]
    assert after["empty"]["pending"] == 0
    assert api_server.post("/queues/mail/resume").status == 200
    assert not {q["name"]: q for q in api_server.get("/queues").json["queues"]}["mail"]["paused"]


# -- GET /workers ----------------------------------------------------------------------


def test_workers_names_the_node_its_exits_and_the_nodes(api_server: ApiServer) -> None:
    resp = api_server.get("/workers")
    assert resp.status == 200
    body = resp.json
    assert body["workers"] == []  # this test engine runs no worker process
    assert set(body["exits_by_reason"]) == {
        "crash", "timeout", "cancel", "lease_lost", "recycle", "retired", "shutdown", "boot",
        "memory",
    }  # fmt: skip
    assert body["recent_exits"] == []
    (node,) = body["nodes"]
    assert node["node_id"] == body["node"] and node["live"] is True
    assert node["types"] == ["email", "report"]


# -- GET /summary/jobs and /summary/dlq ------------------------------------------------


def test_job_rows_carry_previews_not_whole_payloads(api_server: ApiServer) -> None:
    long = enqueue(api_server, payload={"blob": "x" * 5000})
    short = enqueue(api_server, queue="mail", payload=[1])
    resp = api_server.get("/summary/jobs?preview=40")
    assert resp.status == 200
    body = resp.json
    assert (body["total"], body["limit"], body["offset"]) == (2, 50, 0)
    rows = {row["id"]: row for row in body["jobs"]}
    assert list(rows) == [short["id"], long["id"]]  # newest first
    cut = rows[long["id"]]["payload"]
    # stored as sent (json.dumps puts a space after the colon), cut to 40 characters
    assert cut["truncated"] and cut["text"] == '{"blob": "' + "x" * 30 and cut["size"] > 5000
    assert len(resp.body) < 2000  # the 5 kB payload did not travel
    assert rows[short["id"]]["payload"] == {"text": "[1]", "size": 3, "truncated": False}
    assert rows[short["id"]]["result"] is None and rows[short["id"]]["last_error"] is None
    default = api_server.get("/summary/jobs").json["jobs"][1]["payload"]
    assert len(default["text"]) == 200
    only = api_server.get("/summary/jobs?queue=mail&status=pending&type=email").json
    assert [row["id"] for row in only["jobs"]] == [short["id"]]
    assert api_server.get("/summary/jobs?limit=1&offset=1").json["jobs"][0]["id"] == long["id"]


@pytest.mark.parametrize(
    ("query", "parameter"),
    [
        ("preview=0", "preview"),
        ("preview=10001", "preview"),
        ("status=finished", "status"),
        ("limit=0", "limit"),
        ("payload=1", "payload"),
    ],
)
def test_job_rows_refuse_bad_parameters(api_server: ApiServer, query: str, parameter: str) -> None:
    resp = api_server.get(f"/summary/jobs?{query}")
    assert resp.status == 400, resp.body
    assert resp.json["details"] == {"parameter": parameter}


def test_dead_letter_rows_filter_and_find_a_jobs_letter(api_server: ApiServer) -> None:
    letter = make_dead_letter(api_server)
    other = make_dead_letter(api_server)
    dead = api_server.get(f"/dlq/{letter}").json
    resp = api_server.get(f"/summary/dlq?job_id={dead['job_id'].upper()}")
    assert resp.status == 200
    (row,) = resp.json["dead_letters"]
    assert row["id"] == letter and row["job_id"] == dead["job_id"] and row["type"] == "email"
    assert row["last_error"] == {"text": "boom", "size": 4, "truncated": False}
    assert row["attempts"] == 1 and row["queue"] == dead["job"]["queue"]
    everything = api_server.get("/summary/dlq").json
    assert everything["total"] == 2
    assert [d["id"] for d in everything["dead_letters"]] == [other, letter]
    assert api_server.get("/summary/dlq?error=BOO").json["total"] == 2
    assert api_server.get("/summary/dlq?error=nope").json["total"] == 0
    assert api_server.get(f"/summary/dlq?queue={dead['job']['queue']}").json["total"] == 1
    assert api_server.get("/summary/dlq?type=report").json["total"] == 0


@pytest.mark.parametrize(
    ("query", "parameter"),
    [
        ("job_id=not-a-uuid", "job_id"),
        (f"job_id={UNKNOWN_ID}0", "job_id"),
        ("error=" + "e" * 201, "error"),
        ("error=", "error"),
        ("type=bad%20name", "type"),
        ("status=failed", "status"),
    ],
)
def test_dead_letter_rows_refuse_bad_parameters(
    api_server: ApiServer, query: str, parameter: str
) -> None:
    resp = api_server.get(f"/summary/dlq?{query}")
    assert resp.status == 400, resp.body
    assert resp.json["details"] == {"parameter": parameter}


def test_summary_answers_match_the_openapi_schemas(api_server: ApiServer) -> None:
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema checks answers vs docs")
    doc = api_server.get("/openapi.json").json
    enqueue(api_server, queue="mail", payload={"a": "b" * 300})
    make_dead_letter(api_server)
    api_server.post("/queues/held/pause")

    def check(route: str, path: str) -> Any:
        resp = api_server.get(path)
        documented = doc["paths"][route]["get"]["responses"]
        answer = documented.get(str(resp.status), documented["default"])
        schema = answer["content"]["application/json"]["schema"]
        root = {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}
        root["components"] = doc["components"]
        jsonschema.Draft202012Validator(root).validate(resp.json)
        return resp.json

    check("/stats/history", "/stats/history")
    check("/stats/history", "/stats/history?since=x")
    assert check("/queues", "/queues")["queues"]
    check("/workers", "/workers")
    assert check("/summary/jobs", "/summary/jobs?preview=5")["jobs"]
    assert check("/summary/dlq", "/summary/dlq")["dead_letters"]
    check("/summary/dlq", "/summary/dlq?job_id=x")
    assert check("/summary/types", "/summary/types")["types"]
    paths = ("/stats/history", "/queues", "/workers", "/summary/jobs", "/summary/dlq")
    for path in (*paths, "/summary/types"):
        assert doc["paths"][path]["get"]["summary"], path


def test_job_rows_filter_by_parent_and_refuse_a_parent_that_is_no_uuid(
    api_server: ApiServer,
) -> None:
    enqueue(api_server)
    assert api_server.get(f"/summary/jobs?parent_id={UNKNOWN_ID}").json["total"] == 0
    assert api_server.get("/summary/jobs").json["total"] == 1
    resp = api_server.get("/summary/jobs?parent_id=nope")
    assert resp.status == 400 and "parent_id" in resp.json["error"]


# -- GET /summary/types -----------------------------------------------------------------


def test_type_stats_count_each_status_and_the_failures(api_server: ApiServer) -> None:
    for _ in range(2):
        enqueue(api_server)
    make_dead_letter(api_server)
    resp = api_server.get("/summary/types")
    assert resp.status == 200, resp.body
    (stats,) = resp.json["types"]
    assert stats["type"] == "email"
    assert stats["counts"]["pending"] == 2 and stats["counts"]["failed"] == 1
    assert stats["failure_rate"] == 1.0  # the only finished job failed
    assert stats["p50_seconds"] is not None and stats["p50_seconds"] >= 0


# -- the dashboard's files -------------------------------------------------------------


def test_ui_redirects_to_the_slash_and_serves_the_page(api_server: ApiServer) -> None:
    moved = api_server.get("/ui")
    assert moved.status == 308 and moved.headers["location"] == "ui/"
    page = api_server.get("/ui/")
    assert page.status == 200
    assert page.headers["content-type"] == "text/html; charset=utf-8"
    assert b'<script type="module" src="js/app.js">' in page.body
    csp = page.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp
    assert page.headers["x-content-type-options"] == "nosniff"
    assert api_server.get("/ui/index.html").body == page.body


def test_ui_files_are_gzipped_and_revalidated_by_etag(api_server: ApiServer) -> None:
    plain = api_server.get("/ui/vendor/uplot/uPlot.esm.js")
    assert plain.status == 200 and plain.headers["content-type"].startswith("text/javascript")
    assert "content-encoding" not in plain.headers
    packed = api_server.get("/ui/vendor/uplot/uPlot.esm.js", headers={"Accept-Encoding": "gzip"})
    assert packed.headers["content-encoding"] == "gzip"
    assert gzip.decompress(packed.body) == plain.body and len(packed.body) < len(plain.body) / 2
    etag = plain.headers["etag"]
    again = api_server.get("/ui/vendor/uplot/uPlot.esm.js", headers={"If-None-Match": etag})
    assert again.status == 304 and again.body == b""
    css = api_server.get("/ui/app.css")
    assert css.headers["content-type"] == "text/css; charset=utf-8" and css.headers["etag"] != etag


@pytest.mark.parametrize("path", ["/ui/nope.js", "/ui/js/", "/ui/../openapi.json", "/ui/%2e%2e/x"])
def test_unknown_ui_files_are_json_404s(api_server: ApiServer, path: str) -> None:
    resp = api_server.get(path)
    assert resp.status == 404, (path, resp.status)
    assert "error" in resp.json


def test_ui_files_need_no_key_even_where_reads_do(make_api_server: Any) -> None:
    server = make_api_server(api_key="s3cret")  # with a key, reads need it by default
    assert server.get("/ui/").status == 200
    assert server.get("/ui/js/api.js").status == 200
    assert server.get("/stats/history").status == 401
    assert server.get("/summary/jobs").status == 401
    assert server.get("/queues", headers={"X-API-Key": "s3cret"}).status == 200
    assert server.post("/queues/x/pause").status == 401
    paths = server.get("/openapi.json", headers={"X-API-Key": "s3cret"}).json["paths"]
    assert "security" not in paths["/ui/{path}"]["get"]
    assert paths["/queues"]["get"]["security"] == [{"ApiKey": []}]


def test_every_module_and_file_the_page_names_is_shipped() -> None:
    """Imports between the ES modules and the files index.html links resolve to shipped
    files: a typo here would only show as a blank page in a browser."""
    assets = load_assets()
    names = set(assets)
    index = assets["index.html"].body.decode()
    linked = re.findall(r'(?:src|href)="([^"#][^"]*)"', index)
    assert {"js/app.js", "app.css", "vendor/uplot/uPlot.min.css", "favicon.svg"} <= set(linked)
    assert set(linked) <= names
    for name in names:
        if not name.endswith(".js") or name.startswith("vendor/"):
            continue
        folder = name.rsplit("/", 1)[0]
        source = assets[name].body.decode()
        for target in re.findall(r'^import .* from "(\.[^"]+)";$', source, re.M):
            parts = [*folder.split("/"), *target.split("/")]
            resolved: list[str] = []
            for part in parts:
                if part == "..":
                    resolved.pop()
                elif part != ".":
                    resolved.append(part)
            assert "/".join(resolved) in names, (name, target)
    assert "vendor/uplot/LICENSE" in names and "README.md" in names


def test_a_body_is_never_needed(api_server: ApiServer) -> None:
    """The summary routes are reads: a stray body or method is refused like elsewhere."""
    assert api_server.post("/queues", email()).status == 405
    assert api_server.request("DELETE", "/workers").status == 405
