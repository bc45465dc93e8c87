"""The dashboard's workflow pages in Chromium: the list with status and progress, and a
workflow's graph, each step coloured by status and linking to its job, at both widths."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Node, wait_for
from tests.e2e.ui.conftest import PHONE, WIDE

try:
    from playwright.sync_api import expect
except ImportError:  # the browser fixture skips (or fails under CI) without Playwright
    expect = None

pytestmark = pytest.mark.timeout(120)


def test_workflow_pages_show_the_graph_by_status(
    make_node: Any, open_tab: Any, tmp_path: Path
) -> None:
    node: Node = make_node("--actors", "testactors,faultactors,flowactors")
    directory = str(tmp_path)

    def step(key: str, after: list[str], **extra: Any) -> dict[str, Any]:
        payload = {"key": key, "dir": directory, **extra}
        return {"key": key, "type": "flow.step", "payload": payload, "after": after}

    body = {
        "name": "thumbnails",
        "jobs": [
            step("fetch", []),
            step("small", ["fetch"]),
            step("large", ["fetch"], fail=True),
            step("notify", ["small", "large"]),
        ],
    }
    made = node.post("/workflows", body).body
    wait_for(lambda: node.get(f"/workflows/{made['id']}").body["status"] == "failed", 30)
    job_ids = {s["key"]: s["id"] for s in made["jobs"]}
    for viewport in (WIDE, PHONE):
        tab = open_tab(node.url, viewport=viewport)
        page = tab.open("/workflows")
        link = page.locator(f'[data-workflow="{made["id"]}"]')
        expect(link).to_have_text("thumbnails")
        expect(page.locator(f'[data-progress="{made["id"]}"]')).to_have_text("2 / 4")
        link.click()
        expect(page.locator('[data-step="large"]')).to_have_attribute("data-status", "failed")
        expect(page.locator('[data-step="notify"]')).to_have_attribute("data-status", "cancelled")
        expect(page.locator('[data-step="small"]')).to_have_attribute("data-status", "done")
        expect(page.locator('[data-layer="2"] [data-step="notify"]')).to_have_count(1)
        tab.shot("workflow", docs=viewport is WIDE)
        width = page.evaluate("document.documentElement.scrollWidth")
        assert width <= viewport["width"], f"the workflow page scrolls sideways at {viewport}"
        page.locator('[data-step="large"]').click()
        page.wait_for_url(f"**/ui/#/jobs/{job_ids['large']}")
        expect(page.locator("main h1")).to_contain_text("flow.step")
        # the step's page links back to its workflow and to the step it waited for
        expect(page.locator(f'[data-step-parent="{job_ids["fetch"]}"]')).to_have_count(1)
        page.locator(f'main [data-workflow="{made["id"]}"]').click()
        page.wait_for_url(f"**/ui/#/workflows/{made['id']}")
        expect(page.locator('[data-step="large"]')).to_have_attribute("data-status", "failed")
        if viewport is PHONE:  # the top bar as tall as its content on a short page
            height = page.evaluate("document.querySelector('.sidebar').offsetHeight")
            assert height < 150, f"the phone's top bar is {height} px tall"
            page = tab.open("/workers")  # the last tab: the nav scrolls it into sight
            box = page.locator('nav.main a[aria-current="page"]').bounding_box()
            assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 391, box
