"""What `pip install .` puts on a user's machine: one `goqueue` package, nothing else."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(120)
def test_the_wheel_installs_only_goqueue_import_names(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "-q",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("goqueue-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert tops == {"goqueue"}
    for module in (
        "actors/child.py",
        "supervisor/workers/pool.py",
        "api/cli/main.py",
        "actors/examples/email.py",
    ):
        assert f"goqueue/{module}" in names
    # the dashboard ships inside the package: every file of api/http/ui_static, nothing built
    shipped = sorted(
        path.relative_to(ROOT).as_posix()
        for path in (ROOT / "api" / "http" / "ui_static").rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    )
    assert len(shipped) > 10 and "api/http/ui_static/index.html" in shipped
    for path in shipped:
        assert f"goqueue/{path}" in names, f"{path} is missing from the wheel"
    assert not any("bench" in name for name in names), "the benchmark is not part of the package"


@pytest.mark.parametrize("name", ["api", "actors", "supervisor"])
def test_the_card_folders_are_not_top_level_imports(name: str, tmp_path: Path) -> None:
    probe = subprocess.run(
        [sys.executable, "-c", f"import {name}"], cwd=tmp_path, capture_output=True, text=True
    )
    assert probe.returncode != 0 and "No module named" in probe.stderr


def test_the_documented_import_works_and_loads_no_server_code(tmp_path: Path) -> None:
    code = (
        "import sys; from goqueue import actor, Retry, Fail; "
        "heavy = {'aiohttp', 'psycopg', 'prometheus_client', 'goqueue.supervisor'}; "
        "print(sorted(heavy & set(sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"
