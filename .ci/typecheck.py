"""Run mypy over the package as it is installed: `supervisor/arbiter.py` is checked as
`goqueue.supervisor.arbiter`.

The repository keeps the design card's top-level folders and setuptools maps them beneath
`goqueue` (`[tool.setuptools.package-dir]` in pyproject.toml). mypy names a module after
its folders, so on its own it would check `supervisor.arbiter` and find no
`goqueue.supervisor`. This script reads the same mapping and hands mypy every file under
the folders of `[tool.mypy] files` with its installed name; every other option (strict,
the overrides) comes from `[tool.mypy]` as usual. Extra arguments go to mypy.
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

from mypy import build
from mypy.errors import CompileError
from mypy.main import process_options
from mypy.modulefinder import BuildSource

ROOT = Path(__file__).resolve().parent.parent


def sources(root: Path = ROOT) -> list[BuildSource]:
    """Every module under `[tool.mypy] files`, named as `import` sees it once installed."""
    pyproject = tomllib.loads((root / "pyproject.toml").read_text())
    mapping: dict[str, str] = pyproject["tool"]["setuptools"]["package-dir"]
    package_of = {folder: package for package, folder in mapping.items()}
    found: list[BuildSource] = []
    for folder in pyproject["tool"]["mypy"]["files"]:
        base = root / folder
        for path in sorted(base.rglob("*.py")):
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            module = ".".join([package_of[folder], *parts])
            found.append(BuildSource(str(path.relative_to(root)), module))
    return found


def main(argv: list[str]) -> int:
    """Check; print mypy's report; exit 1 on any error, as `mypy` does."""
    _, options = process_options(
        ["--config-file", str(ROOT / "pyproject.toml"), *argv], require_targets=False
    )
    targets = sources()
    try:
        result = build.build(targets, options)
    except CompileError as exc:
        print("\n".join(exc.messages), file=sys.stderr)
        return 2
    for line in result.errors:
        print(line)
    errors = [line for line in result.errors if ": error:" in line]
    if errors:
        files = len({line.split(":", 1)[0] for line in errors})
        print(f"Found {len(errors)} errors in {files} files ({len(targets)} checked)")
        return 1
    print(f"Success: no issues found in {len(targets)} source files")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
