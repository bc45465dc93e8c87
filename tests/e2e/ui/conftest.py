"""A real browser for the dashboard tests: Debian's Chromium driven by Playwright.

Playwright never downloads a browser here: it launches `/usr/bin/chromium` (installed by
`.ci/run` when missing), headless, with a fresh temporary profile per launch. One browser
serves the whole session; each test gets its own context (its own session storage).
Without Chromium or Playwright the tests skip loudly, except under CI, where they fail.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
WIDE = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}
SCREENSHOTS = ROOT / "build" / "screenshots"  # build/ is ignored by git
DOCS_SCREENSHOTS = ROOT / "docs" / "screenshots"  # shown by README and the site
# A refused call shows in the console as a failed resource load; tests that expect one
# say so (`allow_refusals`). Anything else in the console is a bug.
REFUSED = "Failed to load resource: the server responded with a status of"


def _unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"browser tests must run under CI: {reason}")
    pytest.skip(f"SKIPPING BROWSER TESTS: {reason}")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless Chromium for a module: Playwright's sync API runs an event loop in
    this thread while it is open, so it closes before other modules' tests (under xdist,
    more may follow on this process) call `asyncio.run`."""
    if not Path(CHROMIUM).exists():
        _unavailable(f"{CHROMIUM} is missing (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("playwright is not installed (pip install -e '.[test]')")
    with sync_playwright() as driver:
        chromium = driver.chromium.launch(
            executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True
        )
        yield chromium
        chromium.close()


@dataclass
class Tab:
    """A browser page on a node's dashboard, recording what its console says."""

    page: Any
    base: str
    console: list[str] = field(default_factory=list)
    allow_refusals: bool = False

    def open(self, route: str = "/") -> Any:
        """Go to `#<route>` of the dashboard and wait for its first answer."""
        self.page.goto(f"{self.base}/ui/#{route}")
        self.page.wait_for_selector("main h1")
        return self.page

    def shot(self, name: str, *, docs: bool = False) -> Path:
        """Save a screenshot of the page as it is (for people to look at). With `docs`,
        also as the docs' own `docs/screenshots/<name>.png`: the pictures README and the
        site show are made here, from the dashboard as it is, so they cannot go stale."""
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        width = self.page.viewport_size["width"]
        path = SCREENSHOTS / f"{name}-{width}.png"
        self.page.screenshot(path=str(path))
        if docs:
            DOCS_SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            self.page.screenshot(path=str(DOCS_SCREENSHOTS / f"{name}.png"))
        return path

    def problems(self) -> list[str]:
        """Console errors and page errors the test did not expect."""
        return [line for line in self.console if not (self.allow_refusals and REFUSED in line)]


@pytest.fixture
def open_tab(browser: Any) -> Iterator[Any]:
    """A factory of tabs, each in a fresh context (its own session storage); after the
    test, no tab may have logged an error (a CSP violation, a script error...)."""
    contexts: list[Any] = []
    tabs: list[Tab] = []

    def make(base: str, *, viewport: dict[str, int] = WIDE, scheme: str = "light") -> Tab:
        context = browser.new_context(viewport=viewport, color_scheme=scheme)
        context.set_default_timeout(10_000)
        contexts.append(context)
        tab = Tab(context.new_page(), base)
        tab.page.on(
            "console",
            lambda msg: (
                tab.console.append(f"{msg.type}: {msg.text}")
                if msg.type in ("error", "warning")
                else None
            ),
        )
        tab.page.on("pageerror", lambda exc: tab.console.append(f"pageerror: {exc}"))
        tabs.append(tab)
        return tab

    yield make
    problems = [line for tab in tabs for line in tab.problems()]
    for context in contexts:
        context.close()
    assert not problems, f"the dashboard logged errors: {problems}"
