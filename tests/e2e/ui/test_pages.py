"""The dashboard's newer pages and pieces in a real browser against live nodes: progress
bars, the Schedules and Job types pages, a job's webhook deliveries and chained job, the
effective timeout, the key prompt, the breadcrumb and the phone layout of the filters.

Each runs at 1280 and 390 px (as test_dashboard.py's pages do) and checks the outcome
through the API or the processes, not only through what the page says.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Node, postgres_dsn, request, wait_for
from tests.e2e.ui.conftest import PHONE, WIDE

try:
    from playwright.sync_api import expect
except ImportError:  # the `browser` fixture skips (or fails under CI) and says why
    expect = None

pytestmark = pytest.mark.timeout(120)

KEY = "s3cret-dashboard-key"
BOTH = pytest.mark.parametrize("viewport", [WIDE, PHONE], ids=["1280", "390"])


def no_sideways_scroll(page: Any, viewport: dict[str, int]) -> None:
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= viewport["width"], f"{page.url} scrolls sideways at {viewport}"


@BOTH
def test_a_running_jobs_progress_shows_as_a_bar_on_its_page_and_in_the_list(
    node: Node, open_tab: Any, tmp_path: Path, viewport: dict[str, int]
) -> None:
    job = node.enqueue(type="reporter", payload={"dir": str(tmp_path), "reports": [0.4]})
    wait_for(lambda: node.get(f"/jobs/{job['id']}").body.get("progress") == 0.4)
    tab = open_tab(node.url, viewport=viewport)
    page = tab.open(f"/jobs/{job['id']}")
    bar = page.locator('.progress-panel [role="progressbar"]')
    expect(bar).to_have_attribute("aria-valuenow", "40")
    expect(page.locator(".progress-panel")).to_contain_text("40%")
    tab.shot("job-progress")
    page = tab.open("/jobs?status=running")
    expect(
        page.locator(f'tr:has([data-job="{job["id"]}"]) [role="progressbar"]')
    ).to_have_attribute("aria-valuenow", "40")
    no_sideways_scroll(page, viewport)
    tab.shot("jobs-progress")
    (tmp_path / "go").touch()
    node.wait_status(job["id"], "done")
    page = tab.open(f"/jobs/{job['id']}")
    expect(page.locator("h1 [data-status]")).to_have_text("done")
    expect(page.locator(".progress-panel")).to_have_count(0)  # only while it runs


def schedule_config(tmp_path: Path) -> Path:
    path = tmp_path / "goqueue.toml"
    path.write_text('[[schedules]]\nname = "beat"\ntype = "beat"\nevery_seconds = 1\n')
    return path


@BOTH
def test_the_schedules_page_shows_next_and_last_fire_and_disables_a_schedule(
    make_node: Any, open_tab: Any, tmp_path: Path, viewport: dict[str, int]
) -> None:
    node = make_node("--actors", "scheduledactors", "--config", str(schedule_config(tmp_path)))
    wait_for(lambda: node.get("/schedules").body["schedules"][0]["last_job_id"])
    tab = open_tab(node.url, viewport=viewport)
    page = tab.open("/schedules")
    expect(page.locator("[data-schedule]")).to_have_count(2)  # the config's and the actor's
    expect(page.locator('[data-state="beat"]')).to_have_text("enabled")
    expect(page.locator('[data-next="beat"] time')).to_have_count(1)
    expect(page.locator('[data-last-job="beat"]')).to_have_count(1)
    last = page.locator('[data-last-job="beat"]').get_attribute("href")  # fires every 1 s
    assert node.get(f"/jobs/{last.removeprefix('#/jobs/')}").body["type"] == "beat"
    no_sideways_scroll(page, viewport)
    tab.shot("schedules")
    page.locator('[data-toggle="beat"]').click()
    expect(page.locator(".toast", has_text="Schedule beat disabled")).to_have_count(1)
    expect(page.locator('[data-state="beat"]')).to_have_text("disabled")
    expect(page.locator('[data-next="beat"]')).to_have_text("—")
    (beat,) = [s for s in node.get("/schedules").body["schedules"] if s["name"] == "beat"]
    assert beat["enabled"] is False and beat["next_fire"] is None
    page.locator('[data-toggle="beat"]').click()
    expect(page.locator('[data-state="beat"]')).to_have_text("enabled")
    (beat,) = [s for s in node.get("/schedules").body["schedules"] if s["name"] == "beat"]
    assert beat["enabled"] is True


@BOTH
def test_the_job_types_page_counts_times_and_rates_failures_per_type(
    node: Node, open_tab: Any, tmp_path: Path, viewport: dict[str, int]
) -> None:
    done = [node.enqueue(type="sleep", payload={"seconds": 0.05 * n}) for n in range(1, 5)]
    failed = node.enqueue(type="fails_until_fixed", payload={"dir": str(tmp_path)})
    later = node.enqueue(type="sleep", payload={"seconds": 0}, delay_seconds=600)
    assert node.delete(f"/jobs/{later['id']}").status == 200
    for job in done:
        node.wait_status(job["id"], "done")
    node.wait_status(failed["id"], "failed")
    tab = open_tab(node.url, viewport=viewport)
    page = tab.open("/types")
    expect(page.locator('[data-count="sleep:done"]')).to_have_text("4")
    expect(page.locator('[data-count="sleep:cancelled"]')).to_be_visible()  # at both widths
    expect(page.locator('[data-rate="sleep"]')).to_have_text("0%")
    expect(page.locator('[data-rate="fails_until_fixed"]')).to_have_text("100%")
    expect(page.locator('[data-p95="sleep"]')).to_contain_text("ms")
    stats = {t["type"]: t for t in node.get("/summary/types").body["types"]}
    assert stats["sleep"]["p95_seconds"] >= stats["sleep"]["p50_seconds"] >= 0.05
    no_sideways_scroll(page, viewport)
    tab.shot("types")
    page.locator('[data-count="sleep:done"]').click()  # a count opens those jobs
    expect(page.locator("[data-job]")).to_have_count(4)


@BOTH
def test_the_job_types_page_shows_each_typed_actors_parameters(
    make_node: Any, open_tab: Any, viewport: dict[str, int]
) -> None:
    node = make_node("--actors", "typedactors,testactors")
    for job in (
        node.enqueue(type="resize", payload={"url": "u"}),
        node.enqueue(type="classic", payload=[1]),
    ):
        node.wait_status(job["id"], "done")
    tab = open_tab(node.url, viewport=viewport)
    page = tab.open("/types")
    resize = page.locator('[data-params="resize"]')
    expect(resize).to_contain_text("url: string")
    expect(resize).to_contain_text("width: integer = 100")
    expect(resize).to_contain_text("size: Size")
    expect(page.locator('[data-params="classic"]')).to_have_text("any JSON")
    no_sideways_scroll(page, viewport)


def test_short_ids_tell_a_burst_apart_with_the_full_id_on_hover(node: Node, open_tab: Any) -> None:
    resp = node.post("/jobs/batch", {"jobs": [{"type": "failnow"} for _ in range(3)]})
    ids = [item["job"]["id"] for item in resp.body["results"]]
    for job_id in ids:
        node.wait_status(job_id, "failed")
    assert len({i[:8] for i in ids}) == 1  # one burst: the same time prefix
    tab = open_tab(node.url, viewport=WIDE)
    page = tab.open("/dlq")
    for job_id in ids:
        shown = page.locator(f'[data-id="{job_id}"]').first
        expect(shown).to_have_text("…" + job_id.replace("-", "")[-8:])
        expect(shown).to_have_attribute("title", job_id)
    texts = [page.locator(f'[data-id="{i}"]').first.inner_text() for i in ids]
    assert len(set(texts)) == 3, texts


def test_the_workers_page_says_one_thing_per_node_and_counts_in_words(
    node: Node, open_tab: Any, tmp_path: Path
) -> None:
    held = node.enqueue(type="hold", payload={"dir": str(tmp_path), "seconds": 60})
    wait_for(lambda: (tmp_path / f"hold-{held['id']}").exists(), what="the job running")
    failed = node.enqueue(type="failnow")
    node.wait_status(failed["id"], "failed")
    me = node.get("/workers").body["node"]
    tab = open_tab(node.url, viewport=WIDE)
    page = tab.open("/workers")
    expect(page.locator(".page-head")).to_contain_text("2 worker processes, 1 busy")
    expect(page.locator(f'[data-node-workers="{me}"]')).to_have_text("1 busy of 2")
    expect(page.locator(f'[data-node-workers-age="{me}"]')).to_have_text(" · now")
    page = tab.open("/")
    expect(page.get_by_text("1 failed attempt last minute")).to_be_visible(timeout=15000)
    assert node.delete(f"/jobs/{held['id']}?force=true").status == 200


class Hooks:
    """A webhook receiver on 127.0.0.1: answers 500 to the first request, then 200."""

    def __init__(self) -> None:
        self.hits: list[bytes] = []
        hits = self.hits

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                hits.append(self.rfile.read(int(self.headers["Content-Length"])))
                self.send_response(500 if len(hits) == 1 else 200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hooks() -> Iterator[Hooks]:
    receiver = Hooks()
    yield receiver
    receiver.close()


@BOTH
def test_a_job_page_shows_its_deliveries_its_chained_job_and_its_timeout(
    make_node: Any, open_tab: Any, hooks: Hooks, viewport: dict[str, int]
) -> None:
    node = make_node("--webhook-allow-hosts", "127.0.0.1", "--default-timeout", "45")
    job = node.enqueue(
        type="noop", webhook_url=hooks.url, on_success={"type": "echo_async", "payload": {"n": 1}}
    )
    node.wait_status(job["id"], "done")
    wait_for(lambda: len(hooks.hits) == 2, timeout=30, what="the retried delivery")
    (chained,) = node.get(f"/summary/jobs?parent_id={job['id']}").body["jobs"]
    tab = open_tab(node.url, viewport=viewport)
    page = tab.open(f"/jobs/{job['id']}")
    delivery = page.locator("[data-delivery]")
    expect(delivery).to_have_count(1)
    expect(delivery).to_contain_text("delivered")
    expect(delivery.locator('[data-attempt-status="500"]')).to_contain_text("HTTP 500")
    expect(delivery.locator('[data-attempt-status="200"]')).to_contain_text("HTTP 200")
    expect(page.locator(f'[data-chained="{chained["id"]}"]')).to_have_count(1)
    expect(page.locator('[data-timeout-source="node"]')).to_contain_text("45 s")
    expect(page.locator('[data-timeout-source="node"]')).to_contain_text("the node's default")
    crumbs = page.locator(".crumbs")
    expect(crumbs).to_have_text("Jobs / queue default")  # no trailing " /"
    no_sideways_scroll(page, viewport)
    tab.shot("job-deliveries")
    page.locator(f'[data-chained="{chained["id"]}"]').click()
    expect(page.locator("[data-job-id]")).to_have_text(chained["id"])
    expect(page.locator("h1")).to_contain_text("echo_async")


def test_a_live_page_says_when_its_node_stops_answering_and_recovers_by_itself(
    make_node: Any, open_tab: Any
) -> None:
    """A node dies under an open page (a deploy, a crash): the page says that the node
    does not answer, and picks up by itself once a node answers there again."""
    node = make_node()
    node.post("/queues/held/pause")
    port = int(node.url.rsplit(":", 1)[1])
    tab = open_tab(node.url)
    page = tab.open("/queues")
    expect(page.locator('button[data-queue="held"]')).to_be_visible()
    notice = page.locator(".banner")
    expect(notice).to_be_empty()
    node.proc.kill()
    node.proc.wait(timeout=10)
    expect(notice).to_contain_text("did not answer")
    expect(page.locator("#live")).to_have_attribute("data-state", "error")
    make_node(port=port)  # a new node on the same address (with a store of its own)
    expect(notice).to_be_empty()
    expect(page.locator("#live")).to_have_attribute("data-state", "live")
    # what the browser logged while nothing listened is the outage itself
    tab.console[:] = [line for line in tab.console if "ERR_CONNECTION_REFUSED" not in line]


@BOTH
def test_a_node_that_needs_a_key_to_read_asks_for_it_at_once(
    make_node: Any, open_tab: Any, viewport: dict[str, int]
) -> None:
    node = make_node("--api-key", KEY)
    request("POST", node.url + "/jobs", {"type": "noop"}, {"X-API-Key": KEY})
    tab = open_tab(node.url, viewport=viewport)
    tab.allow_refusals = True
    page = tab.open("/")
    prompt = page.locator("#key-dialog")
    expect(prompt).to_be_visible()  # no need to find the key button first
    expect(prompt).to_contain_text("needs an API key")
    tab.shot("key-prompt")
    page.fill("#key-input", KEY)
    page.press("#key-input", "Enter")
    expect(page.locator('[data-count="done"]')).to_have_text("1")
    expect(prompt).to_be_hidden()


def test_at_390_px_the_job_filters_fold_so_jobs_show_on_the_first_screen(
    node: Node, open_tab: Any
) -> None:
    for n in range(3):
        node.enqueue(type="noop", payload={"n": n})
    tab = open_tab(node.url, viewport=PHONE)
    page = tab.open("/jobs")
    first = page.locator("[data-job]").first
    expect(first).to_be_visible()
    assert first.bounding_box()["y"] < PHONE["height"] * 0.6
    expect(page.locator("#f-type")).to_be_hidden()
    page.get_by_role("button", name="Filters").click()
    expect(page.locator("#f-type")).to_be_visible()
    page.fill("#f-type", "noop")
    page.press("#f-type", "Enter")
    expect(page.get_by_role("button", name="Filters (1 set)")).to_be_visible()
    tab.shot("jobs-filters")
    tab = open_tab(node.url, viewport=WIDE)
    page = tab.open("/jobs")
    expect(page.locator("#f-type")).to_be_visible()  # a wide screen shows them always
    expect(page.locator(".filter-toggle")).to_be_hidden()


def test_the_sidebar_is_painted_to_the_foot_of_a_long_page(node: Node, open_tab: Any) -> None:
    node.enqueue(type="noop")
    tab = open_tab(node.url, viewport={"width": 1280, "height": 400})
    page = tab.open("/workers")
    page.wait_for_selector(".loading", state="detached")
    height = page.evaluate("document.documentElement.scrollHeight")
    assert height > 400  # a page longer than the screen
    # the shell paints the sidebar's column all the way down, whatever the sidebar's height
    image = page.evaluate("getComputedStyle(document.querySelector('.shell')).backgroundImage")
    assert "linear-gradient" in image
    page.evaluate("window.scrollTo(0, document.documentElement.scrollHeight)")
    corner = "document.elementFromPoint(10, window.innerHeight - 5)"
    foot = page.evaluate(f"{corner}.closest('.sidebar, .shell').className")
    assert foot in ("sidebar", "shell")
    tab.shot("sidebar-long-page")


@pytest.fixture
def pg_nodes(make_node: Any) -> Any:
    """Nodes sharing one fresh schema of the test PostgreSQL."""
    from tests.e2e.supervisor.test_cluster import _nodes_on

    yield from _nodes_on(make_node, postgres_dsn())


@pytest.mark.postgres
@BOTH
def test_on_postgresql_the_workers_page_shows_the_other_nodes_workers_and_the_cluster(
    pg_nodes: Any, open_tab: Any, tmp_path: Path, viewport: dict[str, int]
) -> None:
    fast = ("--lease-seconds", "2")  # a heartbeat, and so a report, every second
    b = pg_nodes(*fast, "--workers", "1")
    job = b.enqueue(type="hold", payload={"dir": str(tmp_path), "seconds": 60})
    pid = int(
        wait_for(
            lambda: (
                (tmp_path / f"hold-{job['id']}").exists()
                and (tmp_path / f"hold-{job['id']}").read_text()
            )
        )
    )
    a = pg_nodes(*fast)  # idle: the page below is served by a
    b_id = b.get("/workers").body["node"]

    def b_reports_the_job() -> bool:
        nodes = {n["node_id"]: n for n in a.get("/workers").body["nodes"]}
        report = nodes.get(b_id, {}).get("report") or {}
        return any(w["job_id"] == job["id"] for w in report.get("workers", []))

    wait_for(b_reports_the_job, what="b's heartbeat to publish its busy worker")
    tab = open_tab(a.url, viewport=viewport)
    page = tab.open("/workers")
    expect(page.locator(f'[data-other-pid="{pid}"]')).to_have_text("busy")
    others = page.locator("section[aria-labelledby=others-title]")
    expect(others).to_contain_text(b_id)
    expect(others.locator(f'a[href="#/jobs/{job["id"]}"]')).to_have_count(1)
    expect(page.locator(f'[data-node-workers="{b_id}"]')).to_have_text("1 busy of 1")
    expect(page.locator("[data-cluster]")).to_contain_text("2 live nodes: 1 of 3 workers busy")
    no_sideways_scroll(page, viewport)
    tab.shot("workers-cluster")
    assert b.delete(f"/jobs/{job['id']}?force=true").status == 200


@BOTH
def test_the_job_types_page_shows_the_keys_at_their_limit(
    make_node: Any, open_tab: Any, tmp_path: Path, viewport: dict[str, int]
) -> None:
    node = make_node("--actors", "keyedactors", "--workers", "3")
    go = str(tmp_path / "go")
    jobs = [{"type": "held", "concurrency_key": "tenant-1", "payload": {"go": go}}] * 3
    jobs.append({"type": "held", "concurrency_key": "tenant-2", "payload": {"go": go}})
    try:
        for job in jobs:
            assert node.post("/jobs", job).status == 201
        wait_for(lambda: node.get("/jobs?type=held&status=pending").body["total"] == 2, timeout=15)
        tab = open_tab(node.url, viewport=viewport)
        page = tab.open("/types")
        expect(page.locator('[data-keys-at-limit="held"]')).to_have_text("2")
        expect(page.locator('[data-key-waiting="held"]')).to_have_text("2")
        expect(page.locator('[data-key-limit="held"]')).to_have_text("1")
        expect(page.locator('[data-held="held"]')).to_contain_text("tenant-1 1 running, 2 waiting")
        no_sideways_scroll(page, viewport)
        tab.shot("job-types-keys", docs=viewport is WIDE)
        page.locator('[data-held="held"] a', has_text="tenant-1").click()
        expect(page.locator("[data-job]")).to_have_count(3)  # the key's jobs
    finally:
        Path(go).touch()
