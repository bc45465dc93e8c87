"""docs/guide/python-client.md, run as written against a real node: its example closes
its `AsyncClient`, so it runs with ResourceWarning made an error and prints what its
`# expected` comment says; the same code without `async with` does warn."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import ROOT, Node
from tests.doctext import blocks

pytestmark = pytest.mark.timeout(60)

GUIDE = ROOT / "docs" / "guide" / "python-client.md"
DOCUMENTED_URL = "http://127.0.0.1:8080"
ACTORS = """
from goqueue.actors import actor


@actor("email")
def email(payload, ctx):
    return {"sent": payload["to"]}
"""


def run(script: Path, warnings: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-W", warnings, str(script)],
        capture_output=True,
        text=True,
        timeout=40,
        cwd=script.parent,
        env={"PATH": os.environ["PATH"]},
    )


def test_the_async_example_closes_its_client(make_node: Callable[..., Node], tmp_path) -> None:
    (tmp_path / "guide_actors.py").write_text(ACTORS)
    node = make_node("--actors", "guide_actors")
    (example,) = [b for b in blocks(GUIDE, "python") if b.text.startswith("# async_enqueue.py")]
    script = tmp_path / "async_enqueue.py"
    script.write_text(example.text.replace(DOCUMENTED_URL, node.url))
    ran = run(script, "error::ResourceWarning")
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == "done\n" and "ResourceWarning" not in ran.stderr
    unclosed = example.text.replace(DOCUMENTED_URL, node.url).replace(
        'async with goqueue.AsyncClient("' + node.url + '") as client:',
        'if client := goqueue.AsyncClient("' + node.url + '"):',
    )
    assert unclosed != example.text.replace(DOCUMENTED_URL, node.url)
    script.write_text(unclosed)
    warned = run(script, "default::ResourceWarning")
    assert warned.returncode == 0 and warned.stdout == "done\n"
    assert "ResourceWarning: Unclosed" in warned.stderr  # a session or connector, as it says


UNCLOSED_SYNC = """
import goqueue

client = goqueue.Client("{url}")
client.enqueue("email", {{"to": "a@example.com"}})
client.get(client.enqueue("email", {{"to": "b@example.com"}}).id)
print("done")
"""


def test_an_unclosed_client_does_not_warn(make_node: Callable[..., Node], tmp_path) -> None:
    (tmp_path / "guide_actors.py").write_text(ACTORS)
    node = make_node("--actors", "guide_actors")
    assert "an unclosed one does not warn" not in GUIDE.read_text()
    assert "so it does not warn, even under `python -W default`" in GUIDE.read_text()
    script = tmp_path / "unclosed.py"
    script.write_text(UNCLOSED_SYNC.format(url=node.url))
    ran = run(script, "default")
    assert ran.returncode == 0 and ran.stdout == "done\n", ran.stderr
    assert "ResourceWarning" not in ran.stderr, ran.stderr
