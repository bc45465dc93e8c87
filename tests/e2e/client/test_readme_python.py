"""The docs' Python examples, run as written: the guide's "Using GoQueue from Python" and
README's tour, against the docs' actor module served by a real node on PostgreSQL, each
example a script run in the project folder, and every `print(...)  # expected` line
checked against what the script printed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import Node
from tests.doctext import README, SITE, USER_DOCS, Block, blocks
from tests.e2e.client.conftest import Database

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(120)]

PYTHON_GUIDE = SITE / "guide" / "python.md"
ACTOR_MODULE = "# myapp/tasks.py"
DOCUMENTED_URL = "http://127.0.0.1:8080"  # the examples' node; the test's own stands in
_EXPECTED = re.compile(r"^\s*print\(.*\)\s+# (?P<out>.+)$")


def scripts(doc: Path) -> list[Block]:
    """The page's Python blocks that are scripts: each starts with its file name
    (`# enqueue.py`); the actor module and snippets inside prose are not."""
    return [
        b for b in blocks(doc, "python") if re.fullmatch(r"# [\w-]+\.py", b.text.splitlines()[0])
    ]


def section_examples() -> list[Block]:
    """The scripts of the Python guide, then README's."""
    return [*scripts(PYTHON_GUIDE), *scripts(README)]


def expected_output(code: str) -> list[str]:
    return [m["out"] for line in code.splitlines() if (m := _EXPECTED.match(line))]


def test_the_section_has_the_promised_examples() -> None:
    names = [b.text.splitlines()[0] for b in scripts(PYTHON_GUIDE)]
    assert names == ["# enqueue.py", "# send.py", "# signup.py"]
    assert [b.text.splitlines()[0] for b in scripts(README)] == ["# tour.py"]
    for block in section_examples():
        prints = [line for line in block.text.splitlines() if "print(" in line]
        assert len(prints) == len(expected_output(block.text)), block.where  # each says


def test_every_example_runs_as_documented(
    pg_node: Callable[..., Node], database: Database, tmp_path: Path
) -> None:
    # tests/e2e/test_docs.py checks that every page showing the module shows the same one
    actors = next(
        b for doc in USER_DOCS for b in blocks(doc, "python") if b.text.startswith(ACTOR_MODULE)
    )
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
