"""The type check (`.ci/typecheck.py`) sees every module under its installed name."""

from __future__ import annotations

import importlib.util
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
