"""A worker's boot: the import path, and one clear line for a module that cannot load."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from goqueue.actors.boot import extend_path, load
from goqueue.actors.protocol import BootFailed


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in list(sys.modules):
        if name.startswith("bootproj"):
            monkeypatch.delitem(sys.modules, name)
    (tmp_path / "bootproj").mkdir()
    (tmp_path / "bootproj" / "__init__.py").write_text("")
    return tmp_path


def failure(modules: list[str]) -> BootFailed:
    loaded = load(modules)
    assert isinstance(loaded, BootFailed), loaded
    assert "\n" not in loaded.error  # one line
    return loaded


def test_a_module_that_loads_gives_its_actors(project: Path) -> None:
    (project / "bootproj" / "good.py").write_text(
        "from goqueue import actor\n\n@actor('one')\ndef one(p, ctx):\n    return 1\n"
    )
    assert sorted(load(["bootproj.good"])) == ["one"]  # type: ignore[arg-type]


def test_an_exception_at_import_names_module_exception_and_line(project: Path) -> None:
    path = project / "bootproj" / "broken.py"
    path.write_text("import os\n\nvalue = undefined_name + 1\n")
    failed = failure(["bootproj.broken"])
    assert failed.error == (
        "cannot import actor module 'bootproj.broken': NameError: name 'undefined_name' is "
        f"not defined (at {path}:3)"
    )
    assert failed.module == "bootproj.broken" and failed.location == f"{path}:3"
    assert "Traceback" in failed.traceback  # kept aside, for the debug log


def test_an_error_in_a_module_it_imports_points_there(project: Path) -> None:
    (project / "bootproj" / "helper.py").write_text("def f():\n    return 1 / 0\n\nf()\n")
    (project / "bootproj" / "uses.py").write_text("import bootproj.helper\n")
    failed = failure(["bootproj.uses"])
    assert "ZeroDivisionError: division by zero" in failed.error
    assert failed.location == f"{project / 'bootproj' / 'helper.py'}:2"


def test_a_syntax_error_names_its_file_and_line(project: Path) -> None:
    path = project / "bootproj" / "syntax.py"
    path.write_text("x = 1\ndef broken(:\n")
    failed = failure(["bootproj.syntax"])
    assert failed.error.startswith("cannot import actor module 'bootproj.syntax': SyntaxError")
    assert failed.location == f"{path}:2"


def test_a_missing_module_says_where_it_was_looked_for(project: Path) -> None:
    failed = failure(["nosuchapp.tasks"])
    assert failed.error.startswith(
        "cannot import actor module 'nosuchapp.tasks': ModuleNotFoundError: "
        "No module named 'nosuchapp'; is it importable from the working directory"
    )
    assert failed.location == ""


def test_a_module_without_actors_is_a_boot_failure(project: Path) -> None:
    (project / "bootproj" / "empty.py").write_text("x = 1\n")
    assert "defines no @actor handlers" in failure(["bootproj.empty"]).error


def test_paths_go_first_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "path", ["/lib", "/b"])
    extend_path(["/a", "/b"])
    assert sys.path == ["/a", "/b", "/lib"]
