"""The type check (`.ci/typecheck.py`) sees every module under its installed name."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.timeout(30)


def typecheck() -> ModuleType:
    spec = importlib.util.spec_from_file_location("typecheck", ROOT / ".ci" / "typecheck.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_package_file_is_checked_as_goqueue_dot_something() -> None:
    named = {source.path: source.module for source in typecheck().sources()}
    assert named["goqueue/__init__.py"] == "goqueue"
    assert named["supervisor/arbiter.py"] == "goqueue.supervisor.arbiter"
    assert named["supervisor/store/memory/store.py"] == "goqueue.supervisor.store.memory.store"
    assert named["actors/examples/__init__.py"] == "goqueue.actors.examples"
    assert named["api/cli/serve.py"] == "goqueue.api.cli.serve"
    files = {
        str(path.relative_to(ROOT))
        for folder in ("goqueue", "actors", "supervisor", "api")
        for path in (ROOT / folder).rglob("*.py")
    }
    assert set(named) == files
    assert all(module.startswith("goqueue") for module in named.values())


SENDS = """
from goqueue import Context, actor


@actor("resize")
def resize(url: str, width: int = 100) -> None: ...


@actor("resize_ctx")
def resize_ctx(ctx: Context, url: str, width: int = 100) -> None: ...


@actor("classic")
def classic(payload: dict[str, object], ctx: Context) -> None: ...


resize.send("u", width=3)
resize_ctx.send("u", width=3)
classic.send({"a": 1}, priority=3)
resize.send_with_options(args=("u",), kwargs={"width": 3}, priority=3)
resize.send("u", width="wide")  # refused
resize_ctx.send(3)  # refused
classic.send({"a": 1}, priority="high")  # refused
"""


@pytest.mark.timeout(120)
def test_type_checkers_see_a_typed_actors_send_parameters(tmp_path: Path) -> None:
    from mypy import build
    from mypy.main import process_options
    from mypy.modulefinder import BuildSource

    checker = typecheck()
    (tmp_path / "sends.py").write_text(SENDS)
    _, options = process_options(
        ["--config-file", str(ROOT / "pyproject.toml"), "--cache-dir", str(tmp_path / "cache")],
        require_targets=False,
    )
    targets = [*checker.sources(), BuildSource(str(tmp_path / "sends.py"), "sends")]
    result = build.build(targets, options)
    errors = [
        line for line in result.errors if line.startswith(str(tmp_path)) and ": error:" in line
    ]
    lines = sorted(int(line.split(":")[1]) for line in errors)
    refused = [n for n, line in enumerate(SENDS.splitlines(), 1) if line.endswith("# refused")]
    assert lines == refused, "\n".join(errors)
