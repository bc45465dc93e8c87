"""README's "Using GoQueue from Python", run as written: its actor module served by a
real node on PostgreSQL, each example a script run in the project folder, and every
`print(...)  # expected` line checked against what the script printed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import Node
from tests.doctext import README, Block, blocks
from tests.e2e.client.conftest import Database

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(120)]

SECTION = "## Using GoQueue from Python"
DOCUMENTED_URL = "http://127.0.0.1:8080"  # the examples' node; the test's own stands in
_EXPECTED = re.compile(r"^\s*print\(.*\)\s+# (?P<out>.+)$")


def section_examples() -> list[Block]:
    """The Python blocks of the section, each starting with its file name."""
    text = README.read_text(encoding="utf-8")
    start = text.index(SECTION)
    end = text.index("\n## ", start + len(SECTION))
    first, last = text.count("\n", 0, start) + 1, text.count("\n", 0, end) + 1
    return [b for b in blocks(README, "python") if first <= b.line <= last]


def expected_output(code: str) -> list[str]:
    return [m["out"] for line in code.splitlines() if (m := _EXPECTED.match(line))]


def test_the_section_has_the_promised_examples() -> None:
    names = [b.text.splitlines()[0] for b in section_examples()]
    assert names == ["# enqueue.py", "# send.py", "# signup.py"]
    for block in section_examples():
        prints = [line for line in block.text.splitlines() if "print(" in line]
        assert len(prints) == len(expected_output(block.text)), block.where  # each says


def test_every_example_runs_as_documented(
    pg_node: Callable[..., Node], database: Database, tmp_path: Path
) -> None:
    (actors,) = [b for b in blocks(README, "python") if b.text.startswith("# myapp/tasks.py")]
    module = tmp_path / "myapp" / "tasks.py"
    module.parent.mkdir()
    module.write_text(actors.text)
    # Until the node puts its working directory on the import path by itself:
    node = pg_node("--actors", "myapp.tasks", env={"PYTHONPATH": str(tmp_path)})
    env = {
        "PATH": os.environ["PATH"],
        "GOQUEUE_URL": node.url,
        "DATABASE_URL": database.dsn,
        "GOQUEUE_DATABASE_SCHEMA": database.schema,
    }
    for block in section_examples():
        name = block.text.splitlines()[0].removeprefix("# ")
        script = tmp_path / name
        script.write_text(block.text.replace(DOCUMENTED_URL, node.url))
        ran = subprocess.run(
            [sys.executable, str(script)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert ran.returncode == 0, f"{block.where}: {name} failed:\n{ran.stderr}"
        assert ran.stdout.splitlines() == expected_output(block.text), block.where
