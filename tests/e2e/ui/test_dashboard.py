"""The dashboard in a real browser against live nodes: real `goqueue serve` processes,
real worker processes, real HTTP on 127.0.0.1, Chromium driven by Playwright.

Each test acts in the page as an operator would, then checks the outcome through the
API (or the processes themselves), not only through what the page says.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Node, postgres_dsn, request, wait_for
from tests.e2e.ui.conftest import PHONE, WIDE

try:
    from playwright.sync_api import expect
except ImportError:  # the `browser` fixture skips (or fails under CI) and says why
    expect = None

pytestmark = pytest.mark.timeout(90)

KEY = "s3cret-dashboard-key"


def badge(page: Any) -> Any:
    """The job page's status badge."""
    return page.locator("h1 [data-status]")


def workers_by_pid(node: Node) -> dict[int, dict[str, Any]]:
    return {w["pid"]: w for w in node.get("/workers").body["workers"]}


# -- the five operator stories -------------------------------------------------------


def test_overview_counts_follow_jobs_enqueued_over_the_api(node: Node, open_tab: Any) -> None:
    assert node.post("/queues/held/pause").status == 200
    tab = open_tab(node.url)
    page = tab.open("/")
    pending = page.locator('[data-count="pending"]')
    expect(pending).to_have_text("0")
    for n in range(3):
        node.enqueue(type="noop", queue="held", payload={"n": n})
    expect(pending).to_have_text("3")
    for n in range(2):
        node.enqueue(type="noop", payload={"n": n})
    expect(page.locator('[data-count="done"]')).to_have_text("2")
    expect(page.locator('[data-workers="idle"]')).to_have_text("2")
    expect(page.locator(".bars li")).to_have_count(1)  # the busiest queue: held, 3
    expect(page.locator(".bars")).to_contain_text("held")
    expect(page.locator(".chart canvas")).to_have_count(1)
    expect(page.locator("#live")).to_have_attribute("data-state", "live")
    tab.shot("overview", docs=True)


def test_force_cancel_from_the_job_page_ends_it_and_replaces_its_worker(
    node: Node, open_tab: Any, tmp_path: Path
) -> None:
    job = node.enqueue(type="spin", payload={"dir": str(tmp_path)})
    marker = wait_for(lambda: next(tmp_path.glob("spin-*"), None))  # spinning in a worker
    pid = int(marker.read_text())
    assert workers_by_pid(node)[pid]["job_id"] == job["id"]
    tab = open_tab(node.url)
    page = tab.open(f"/jobs/{job['id']}")
    expect(badge(page)).to_have_text("running")
    page.get_by_role("button", name="Force-cancel").click()
    dialog = page.locator("dialog#confirm")
    expect(dialog).to_be_visible()
    expect(dialog).to_contain_text(f"Worker process {pid}")  # it says what will be killed
    expect(dialog).to_contain_text("not retried")
    tab.shot("job-force-cancel")
    dialog.get_by_role("button", name="Kill and cancel").click()
    expect(badge(page)).to_have_text("cancelled")
    assert node.get(f"/jobs/{job['id']}").body["status"] == "cancelled"

    def replaced() -> dict[int, dict[str, Any]] | None:
        live = {p: w for p, w in workers_by_pid(node).items() if w["state"] in ("idle", "busy")}
        return live if pid not in live and len(live) == 2 else None

    fresh = set(wait_for(replaced)) - {pid}
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # the spinning process is really gone
    exits = node.get("/workers").body["recent_exits"]
    assert (exits[0]["pid"], exits[0]["reason"], exits[0]["job_id"]) == (pid, "cancel", job["id"])
    page = tab.open("/workers")
    expect(page.locator('[data-reason="cancel"]')).to_have_count(1)
    expect(page.locator(f'[data-pid="{pid}"]')).to_have_count(0)
    for new_pid in fresh:
        expect(page.locator(f'[data-pid="{new_pid}"]')).to_have_count(1)
    tab.shot("workers")


def test_a_dead_letter_replayed_from_the_dlq_page_runs_again(
    node: Node, open_tab: Any, tmp_path: Path
) -> None:
    job = node.enqueue(type="fails_until_fixed", payload={"dir": str(tmp_path)})
    node.wait_status(job["id"], "failed")
    (letter,) = node.get(f"/summary/dlq?job_id={job['id']}").body["dead_letters"]
    (tmp_path / "fixed").touch()  # the operator deploys the fix...
    tab = open_tab(node.url)
    page = tab.open("/dlq")
    row = page.locator("tbody tr", has=page.locator(f'[data-replay="{letter["id"]}"]'))
    expect(row).to_contain_text("the fix is not deployed yet")
    tab.shot("dlq")
    page.locator(f'[data-replay="{letter["id"]}"]').click()  # ...and replays the letter
    expect(page.locator(".toast")).to_contain_text("Replayed")
    runs = tmp_path / "runs.log"
    wait_for(lambda: len(runs.read_text().split()) == 2)  # it ran a second time
    jobs = node.get("/summary/jobs?type=fails_until_fixed").body["jobs"]
    (replay,) = [j for j in jobs if j["id"] != job["id"]]
    assert node.wait_status(replay["id"], "done")["result"] == {"fixed": True}
    assert node.get(f"/dlq/{letter['id']}").status == 404
    expect(page.locator(f'[data-replay="{letter["id"]}"]')).to_have_count(0)


def test_pausing_a_queue_in_the_ui_stops_its_dispatch(
    node: Node, open_tab: Any, tmp_path: Path
) -> None:
    tab = open_tab(node.url)
    page = tab.open("/queues")
    page.fill("#pause-name", "q1")
    page.get_by_role("button", name="Pause", exact=True).click()
    toggle = page.locator('button[data-queue="q1"]')
    expect(toggle).to_have_text("Resume")
    assert node.get("/queues/q1/stats").body["paused"] is True
    payload = {"dir": str(tmp_path)}
    held = node.enqueue(type="counted", queue="q1", payload=payload)
    control = node.enqueue(type="counted", queue="q2", payload=payload)
    node.wait_status(control["id"], "done")  # dispatch ran after `held` came, and passed it by
    assert node.get(f"/jobs/{held['id']}").body["status"] == "pending"
    expect(page.locator('[data-pending="q1"]')).to_have_text("1")
    tab.shot("queues")
    toggle.click()  # Resume
    node.wait_status(held["id"], "done")
    assert held["id"] in (tmp_path / "runs.log").read_text()
    expect(page.locator(".toast", has_text="Queue q1 resumed")).to_have_count(1)
    expect(toggle).to_have_count(0)  # empty and running again: no longer listed


def test_with_an_api_key_actions_are_refused_until_it_is_entered(
    make_node: Any, open_tab: Any
) -> None:
    node = make_node("--api-key", KEY, "--public-reads")
    key = {"X-API-Key": KEY}
    assert node.post("/queues/held/pause", headers=key).status == 200
    job = request("POST", node.url + "/jobs", {"type": "noop", "queue": "held"}, key).body
    tab = open_tab(node.url)
    tab.allow_refusals = True
    page = tab.open(f"/jobs/{job['id']}")  # reads are open: no prompt
    expect(badge(page)).to_have_text("pending")
    prompt = page.locator("#key-dialog")
    expect(prompt).to_be_hidden()

    def try_cancel() -> None:
        page.get_by_role("button", name="Cancel", exact=True).click()
        page.locator("#confirm").get_by_role("button", name="Cancel the job").click()
        expect(prompt).to_be_visible()

    try_cancel()  # refused (401): the prompt asks for the key; dismissed, nothing happens
    prompt.get_by_role("button", name="Cancel").click()
    expect(page.locator(".toast.bad")).to_contain_text("API key")
    assert node.get(f"/jobs/{job['id']}").body["status"] == "pending"

    try_cancel()  # a wrong key is refused too, and the prompt says so
    page.fill("#key-input", "wrong")
    page.press("#key-input", "Enter")
    expect(prompt).to_contain_text("refused that key")
    page.fill("#key-input", KEY)
    page.press("#key-input", "Enter")
    expect(badge(page)).to_have_text("cancelled")
    assert node.get(f"/jobs/{job['id']}").body["status"] == "cancelled"

    page = tab.open("/queues")  # the key is kept for the tab: no prompt this time
    page.locator('button[data-queue="held"]').click()
    expect(page.locator(".toast", has_text="Queue held resumed")).to_have_count(1)
    assert node.get("/queues/held/stats").body["paused"] is False
    expect(prompt).to_be_hidden()


def test_with_read_protection_the_dashboard_shows_nothing_until_the_key_is_given(
    make_node: Any, open_tab: Any
) -> None:
    node = make_node("--api-key", KEY)  # with a key, reads need it too (no --public-reads)
    request("POST", node.url + "/jobs", {"type": "noop", "queue": "q"}, {"X-API-Key": KEY})
    tab = open_tab(node.url)
    tab.allow_refusals = True
    page = tab.open("/")  # the page itself needs no key...
    prompt = page.locator("#key-dialog")
    expect(prompt).to_be_visible()  # ...its data does: the prompt comes at once
    prompt.get_by_role("button", name="Cancel").click()  # dismissed, the button stays
    key_button = page.locator("#key-button")
    expect(page.locator("#live")).to_have_attribute("data-state", "key")  # ...its data does
    expect(key_button).to_have_text("Enter API key")
    expect(page.locator('[data-count="done"]')).to_have_text("—")
    key_button.click()
    page.fill("#key-input", KEY)
    page.press("#key-input", "Enter")
    expect(page.locator('[data-count="done"]')).to_have_text("1")
    expect(key_button).to_have_text("Forget API key")


def test_jobs_filter_page_and_find_by_id(node: Node, open_tab: Any) -> None:
    assert node.post("/queues/held/pause").status == 200
    held = [node.enqueue(type="noop", queue="held", payload={"n": n}) for n in range(30)]
    done = node.enqueue(type="noop", payload={"blob": "x" * 5000})
    node.wait_status(done["id"], "done")
    tab = open_tab(node.url)
    page = tab.open("/jobs")
    rows = page.locator("[data-job]")
    expect(rows).to_have_count(25)  # a page
    expect(page.locator(".pager")).to_contain_text("1\u201325 of 31")
    page.get_by_role("button", name="Next").click()
    expect(rows).to_have_count(6)
    expect(page.locator(".pager")).to_contain_text("26\u201331 of 31")
    page.locator('[data-filter-status="done"]').click()
    expect(rows).to_have_count(1)
    cell = page.locator("td.preview .mono").first
    expect(cell).to_contain_text('{"blob": "xxx')
    assert len(cell.inner_text()) < 300  # the 5 kB payload is cut in the list
    page.locator('[data-filter-status="all"]').click()
    page.fill("#f-queue", "held")
    page.press("#f-queue", "Enter")  # Enter applies the typed filters
    expect(page.locator(".pager")).to_contain_text("of 30")
    page.fill("#f-id", held[7]["id"].upper())
    page.press("#f-id", "Enter")
    expect(page.locator("[data-job-id]")).to_have_text(held[7]["id"])
    expect(badge(page)).to_have_text("pending")
    page.go_back()
    expect(page.locator("h1")).to_have_text("Jobs")


@pytest.fixture
def pg_nodes(make_node: Any) -> Any:
    """Nodes sharing one fresh schema of the test PostgreSQL."""
    from tests.e2e.supervisor.test_cluster import _nodes_on

    yield from _nodes_on(make_node, postgres_dsn())


@pytest.mark.postgres
def test_on_postgresql_one_node_shows_the_whole_cluster(
    pg_nodes: Any, open_tab: Any, tmp_path: Path
) -> None:
    a, b = pg_nodes(), pg_nodes()
    assert b.post("/queues/held/pause").status == 200
    for n in range(3):
        b.enqueue(type="noop", queue="held", payload={"n": n})
    failed = b.enqueue(type="fails_until_fixed", payload={"dir": str(tmp_path)})
    b.wait_status(failed["id"], "failed")
    tab = open_tab(a.url)  # every page below is served by node a
    page = tab.open("/")
    expect(page.locator('[data-count="pending"]')).to_have_text("3")  # the store's counts
    expect(page.locator('[data-count="dead_letters"]')).to_have_text("1")
    page = tab.open("/queues")
    expect(page.locator('[data-pending="held"]')).to_have_text("3")
    expect(page.locator('button[data-queue="held"]')).to_have_text("Resume")
    page = tab.open("/jobs?queue=held")
    expect(page.locator("[data-job]")).to_have_count(3)
    page = tab.open("/dlq")
    expect(page.locator("tbody")).to_contain_text("the fix is not deployed yet")
    page = tab.open("/workers")
    nodes = page.locator("section[aria-labelledby=nodes-title] tbody tr")
    expect(nodes).to_have_count(2)
    expect(nodes.locator('[data-status="live"]')).to_have_count(2)
    for node in (a, b):
        expect(page.locator("section[aria-labelledby=nodes-title] tbody")).to_contain_text(
            node.get("/workers").body["node"]
        )
    tab.shot("workers-postgres")


# -- how it reads, and what it costs -------------------------------------------------


def seed(node: Node, tmp_path: Path) -> dict[str, str]:
    """Jobs in every state, for pages worth looking at."""
    assert node.post("/queues/reports/pause").status == 200
    done = [
        node.enqueue(
            type="echo_async",
            queue=queue,
            priority=priority,
            payload={"to": f"user{n}@example.com", "template": "welcome", "vars": {"n": n}},
        )
        for n, (queue, priority) in enumerate([("emails", 5), ("billing", 10), ("default", 0)] * 4)
    ]
    for n in range(5):
        node.enqueue(type="noop", queue="reports", priority=n * 2, payload={"report": n})
    flaky = node.enqueue(type="flaky", payload={"failures": 1})
    dead = node.enqueue(type="fails_until_fixed", queue="billing", payload={"dir": str(tmp_path)})
    running = node.enqueue(type="sleep", payload={"seconds": 60, "dir": str(tmp_path)})
    for job in [*done, flaky]:
        node.wait_status(job["id"], "done")
    node.wait_status(dead["id"], "failed")
    node.wait_status(running["id"], "running")
    letter = node.get(f"/summary/dlq?job_id={dead['id']}").body["dead_letters"][0]["id"]
    return {"running": running["id"], "flaky": flaky["id"], "dead": dead["id"], "letter": letter}


def test_every_page_reads_well_at_both_widths(
    make_node: Any, open_tab: Any, tmp_path: Path
) -> None:
    node = make_node("--shutdown-grace", "1")  # a job is still running at the end
    ids = seed(node, tmp_path)
    pages = [
        ("overview", "/"),
        ("queues", "/queues"),
        ("jobs", "/jobs"),
        ("job-running", f"/jobs/{ids['running']}"),
        ("job-retried", f"/jobs/{ids['flaky']}"),
        ("job-failed", f"/jobs/{ids['dead']}"),
        ("dlq", "/dlq"),
        ("dead-letter", f"/dlq/{ids['letter']}"),
        ("workers", "/workers"),
        ("types", "/types"),
        ("schedules", "/schedules"),
    ]
    looks = [(WIDE, "light", pages), (PHONE, "light", pages)]
    looks += [(WIDE, "dark", pages[:4]), (PHONE, "dark", pages[:1])]
    for viewport, scheme, shown in looks:
        tab = open_tab(node.url, viewport=viewport, scheme=scheme)
        for name, route in shown:
            page = tab.open(route)
            page.wait_for_selector(".loading", state="detached")
            if name == "overview":
                expect(page.locator('[data-count="done"]')).not_to_have_text("—")
            tab.shot(f"{name}-{scheme}")
            background = page.evaluate("getComputedStyle(document.body).backgroundColor")
            dark = sum(int(c) for c in background[4:-1].split(",")[:3]) < 3 * 60
            assert dark == (scheme == "dark"), (name, scheme, background)
            width = page.evaluate("document.documentElement.scrollWidth")
            assert width <= viewport["width"], f"{name} scrolls sideways at {viewport}"
            assert page.locator("h1").count() == 1


def test_destructive_actions_work_from_the_keyboard_and_escape_is_safe(
    node: Node, open_tab: Any, tmp_path: Path
) -> None:
    job = node.enqueue(type="fails_until_fixed", payload={"dir": str(tmp_path)})
    node.wait_status(job["id"], "failed")
    (letter,) = node.get("/summary/dlq").body["dead_letters"]
    tab = open_tab(node.url)
    page = tab.open("/dlq")
    purge = page.locator(f'[data-purge="{letter["id"]}"]')
    expect(purge).to_be_visible()
    for _ in range(60):  # Tab through the page to the Purge button
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.dataset.purge") == letter["id"]:
            break
    else:
        raise AssertionError("Tab never reached the Purge button")
    outline = page.evaluate("getComputedStyle(document.activeElement).outlineStyle")
    assert outline == "solid", "the focused button shows no focus ring"
    dialog = page.locator("dialog#confirm")

    page.keyboard.press("Enter")
    expect(dialog).to_be_visible()
    expect(dialog).to_contain_text("deleted for good")
    page.keyboard.press("Escape")  # Escape keeps it
    expect(dialog).to_be_hidden()
    page.keyboard.press("Enter")  # focus went back to Purge
    expect(dialog).to_be_visible()
    page.keyboard.press("Enter")  # the safe button has the focus: Enter keeps it
    expect(dialog).to_be_hidden()
    assert node.get(f"/dlq/{letter['id']}").status == 200

    page.keyboard.press("Enter")
    expect(dialog).to_be_visible()
    page.keyboard.press("Tab")
    page.keyboard.press("Enter")  # "Purge for good"
    expect(purge).to_have_count(0)
    assert node.get(f"/dlq/{letter['id']}").status == 404


def test_a_question_asked_right_after_another_gets_its_own_answer(
    node: Node, open_tab: Any
) -> None:
    """The previous question's close arrives a task later: it must answer neither it
    wrongly nor the next one (Keep, then at once Purge again and confirm)."""
    page = open_tab(node.url).open("/dlq")
    answers = page.evaluate(
        """async () => {
            const { confirmAction } = await import("./js/ui.js");
            const ask = () => confirmAction({ title: "Sure?", what: [], confirm: "Go" });
            const button = (value) => document.querySelector(`#confirm button[value=${value}]`);
            const first = ask();
            button("keep").click();
            const second = ask();
            button("go").click();
            return [await first, await second];
        }"""
    )
    assert answers == [False, True]


def test_a_key_prompt_opened_again_at_once_still_keeps_the_key(
    make_node: Any, open_tab: Any
) -> None:
    """Cancel the prompt and open it again in the same task: the first prompt's late
    close must not answer the second, whose key is then kept."""
    node = make_node("--api-key", KEY, "--public-reads")
    tab = open_tab(node.url)
    page = tab.open("/queues")
    page.evaluate(
        """() => {
            const button = document.getElementById("key-button");
            button.click();
            document.querySelector("#key-dialog button[value=cancel]").click();
            button.click();
        }"""
    )
    prompt = page.locator("#key-dialog")
    expect(prompt).to_be_visible()
    page.fill("#key-input", KEY)
    page.press("#key-input", "Enter")
    expect(prompt).to_be_hidden()
    expect(page.locator("#key-button")).to_have_text("Forget API key")


def api_requests(node: Node) -> float:
    """API requests the node has answered (its own metric), leaving out scrapes and the
    dashboard's static files."""
    total = 0.0
    for line in request("GET", node.url + "/metrics").body.splitlines():
        if line.startswith("goqueue_http_requests_total{"):
            if 'route="/metrics"' in line or 'route="/ui' in line:
                continue
            total += float(line.rsplit(" ", 1)[1])
    return total


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of one process (the supervisor, not its workers)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_ten_open_dashboards_cost_the_node_little(node: Node, open_tab: Any) -> None:
    for n in range(20):
        node.enqueue(type="noop", payload={"n": n})
    tab = open_tab(node.url)
    routes = ["/"] * 5 + ["/queues", "/queues", "/workers", "/workers", "/jobs"]
    pages = [tab.page] + [tab.page.context.new_page() for _ in routes[1:]]
    for page, route in zip(pages, routes, strict=True):
        page.goto(f"{node.url}/ui/#{route}")
        expect(page.locator("#live")).to_have_attribute("data-state", "live")
    requests_before, cpu_before = api_requests(node), cpu_seconds(node.proc.pid)
    started = time.monotonic()
    pages[0].wait_for_timeout(10_000)  # a measurement window, not a wait for a condition
    seconds = time.monotonic() - started
    per_page = (api_requests(node) - requests_before - 1) / seconds / len(pages)
    cpu_share = (cpu_seconds(node.proc.pid) - cpu_before) / seconds
    assert per_page <= 1.0, f"{per_page:.2f} requests per second per open page"
    assert cpu_share < 0.10, f"ten dashboards used {cpu_share:.0%} of a core on the node"
    print(f"\nten dashboards: {per_page:.2f} requests/s per page, node CPU {cpu_share:.1%}")


def test_every_matching_dead_letter_is_replayed_or_purged_after_a_counted_confirmation(
    node: Node, open_tab: Any, tmp_path: Path
) -> None:
    broken = [
        node.enqueue(type="fails_until_fixed", payload={"dir": str(tmp_path)})["id"]
        for _ in range(3)
    ]
    other = node.enqueue(type="failnow")["id"]
    for job_id in [*broken, other]:
        node.wait_status(job_id, "failed")
    wait_for(lambda: node.get("/dlq").body["total"] == 4)
    (tmp_path / "fixed").touch()
    tab = open_tab(node.url)
    page = tab.open("/dlq?type=fails_until_fixed")
    expect(page.locator("tbody tr")).to_have_count(3)
    page.locator('[data-bulk="replay"]').click()
    dialog = page.locator("dialog#confirm")
    expect(dialog).to_contain_text("Replay 3 dead letters?")  # the count, before anything
    expect(dialog).to_contain_text("of type fails_until_fixed")
    tab.shot("dlq-bulk-replay")
    assert node.get("/dlq").body["total"] == 4  # nothing happens until it is confirmed
    dialog.get_by_role("button", name="Replay 3 dead letters").click()
    expect(page.locator(".toast")).to_contain_text("Replayed 3 dead letters.")
    expect(page.locator("tbody tr")).to_have_count(0)
    done = lambda: node.get("/jobs?type=fails_until_fixed&status=done").body["total"] == 3  # noqa: E731
    wait_for(done, 20)
    [left] = node.get("/dlq").body["dead_letters"]
    assert left["job_id"] == other

    page = tab.open("/dlq")
    page.locator('[data-bulk="purge"]').click()
    expect(dialog).to_contain_text("Purge 1 dead letter?")
    expect(dialog).to_contain_text("every dead letter (no filter)")
    dialog.get_by_role("button", name="Keep it").click()  # the safe choice changes nothing
    assert node.get("/dlq").body["total"] == 1
    page.locator('[data-bulk="purge"]').click()
    dialog.get_by_role("button", name="Purge 1 dead letter").click()
    expect(page.locator(".toast").last).to_contain_text("Purged 1 dead letter.")
    assert node.get("/dlq").body["total"] == 0


@pytest.mark.parametrize("viewport", [WIDE, PHONE], ids=["wide", "phone"])
def test_a_failed_jobs_traceback_shows_collapsed_with_copy_on_its_pages(
    node: Node, open_tab: Any, viewport: dict[str, int]
) -> None:
    job = node.enqueue(type="nested_raise", payload={"limit": "x", "depth": 1})
    errors = node.wait_status(job["id"], "failed")["errors"]
    (letter,) = wait_for(lambda: node.get(f"/summary/dlq?job_id={job['id']}").body["dead_letters"])
    tab = open_tab(node.url, viewport=viewport)
    page = tab.open(f"/jobs/{job['id']}")
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    blocks = page.locator("details.traceback")
    expect(blocks).to_have_count(3)  # the last attempt's, under the notice, and each attempt's
    latest = blocks.first
    expect(latest.locator("pre")).to_be_hidden()  # collapsed
    latest.locator("summary").click()
    expect(latest.locator("pre")).to_be_visible()
    expect(latest.locator("pre")).to_contain_text("return left <= right")
    tab.shot("job-traceback")
    latest.get_by_role("button", name="Copy traceback").click()
    expect(page.locator(".toast")).to_contain_text("Copied the traceback")
    assert page.evaluate("navigator.clipboard.readText()") == errors[-1]["traceback"]
    page = tab.open(f"/dlq/{letter['id']}")
    blocks = page.locator("details.traceback")
    expect(blocks).to_have_count(3)
    blocks.nth(1).locator("summary").click()
    expect(blocks.nth(1).locator("pre")).to_be_visible()  # opened, not only in the page
    expect(blocks.nth(1).locator("pre")).to_contain_text("in _compare")
    tab.shot("dead-traceback")


@pytest.mark.parametrize("viewport", [WIDE, PHONE], ids=["wide", "phone"])
def test_clearing_a_queue_cancels_its_pending_jobs_after_a_counted_confirmation(
    node: Node, open_tab: Any, tmp_path: Path, viewport: dict[str, int]
) -> None:
    waiting = [node.enqueue(type="noop", queue="mail", delay_seconds=3600)["id"] for _ in range(3)]
    spinning = node.enqueue(type="spin", queue="mail", payload={"dir": str(tmp_path)})["id"]
    wait_for(lambda: next(tmp_path.glob("spin-*"), None), what="the job spinning")
    other = node.enqueue(type="noop", queue="other", delay_seconds=3600)["id"]
    try:
        tab = open_tab(node.url, viewport=viewport)
        page = tab.open("/queues")
        page.locator('[data-clear="mail"]').click()
        dialog = page.locator("dialog#confirm")
        expect(dialog).to_contain_text("Cancel 3 pending jobs in mail?")
        expect(dialog).to_contain_text("Its 1 running job is left alone.")
        tab.shot("queue-clear")
        dialog.get_by_role("button", name="Keep it").click()  # the safe choice: nothing
        assert [node.get(f"/jobs/{i}").body["status"] for i in waiting] == ["pending"] * 3
        page.locator('[data-clear="mail"]').click()
        dialog.get_by_role("button", name="Cancel 3 jobs").click()
        expect(page.locator(".toast").last).to_contain_text(
            "Cancelled 3 jobs in mail. 1 running job left alone."
        )
        assert [node.get(f"/jobs/{i}").body["status"] for i in waiting] == ["cancelled"] * 3
        assert node.get(f"/jobs/{spinning}").body["status"] == "running"
        assert node.get(f"/jobs/{other}").body["status"] == "pending"
        expect(page.locator('[data-clear="mail"]')).to_have_count(0)  # nothing pending left
    finally:
        node.delete(f"/jobs/{spinning}?force=true")


@pytest.mark.parametrize("viewport", [WIDE, PHONE], ids=["wide", "phone"])
def test_a_running_jobs_progress_shows_as_a_bar_on_its_page_and_in_the_list(
    node: Node, open_tab: Any, tmp_path: Path, viewport: dict[str, int]
) -> None:
    fraction = node.enqueue(type="reporter", payload={"reports": [0.4], "dir": str(tmp_path)})
    counted = node.enqueue(
        type="reporter", payload={"reports": [{"done": 3, "of": 4}], "dir": str(tmp_path)}
    )
    try:
        for job in (fraction, counted):
            wait_for(lambda j=job: node.get(f"/jobs/{j['id']}").body.get("progress"))
        rows = node.get("/summary/jobs?type=reporter").body["jobs"]
        assert sorted(str(r["progress"]) for r in rows) == ["0.4", "{'done': 3, 'of': 4}"]
        tab = open_tab(node.url, viewport=viewport)
        page = tab.open(f"/jobs/{fraction['id']}")
        bar = page.locator(".progress-panel [data-progress]")
        expect(bar).to_have_attribute("data-progress", "40")
        expect(bar).to_contain_text("40%")
        tab.shot("job-progress")
        page = tab.open("/jobs?type=reporter")
        expect(
            page.locator(f'tr:has([data-job="{counted["id"]}"]) [data-progress]')
        ).to_contain_text("3 of 4")
        expect(
            page.locator(f'tr:has([data-job="{fraction["id"]}"]) [data-progress="40"]')
        ).to_have_count(1)
        tab.shot("jobs-progress")
    finally:
        (tmp_path / "go").write_text("")  # the handlers' cue to finish
    for job in (fraction, counted):
        node.wait_status(job["id"], "done")
