"""A worker's boot: the import path, the actor modules, and one clear line when a module
cannot be imported (which module, what it raised, and at which file:line)."""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from collections.abc import Sequence

from goqueue.actors.protocol import BootFailed
from goqueue.actors.registry import Registry, load_actors

# Frames of the import machinery and of this package say nothing about the user's code.
_MACHINERY = ("<frozen importlib", os.path.dirname(importlib.__file__), os.path.dirname(__file__))


def extend_path(paths: Sequence[str]) -> None:
    """Put `paths` first on `sys.path`, in order (as `celery -A` and `dramatiq --path`
    make a project's folder importable)."""
    for path in reversed(paths):
        if path in sys.path:
            sys.path.remove(path)
        sys.path.insert(0, path)


def load(modules: Sequence[str]) -> Registry | BootFailed:
    """Import `modules` and collect their actors; a BootFailed describing the first
    failure instead of raising."""
    for module in modules:
        try:
            importlib.import_module(module)
        except BaseException as exc:  # anything a module raises at import is a boot failure
            return describe(module, exc)
    try:
        return load_actors(modules)
    except Exception as exc:  # ActorDefinitionError names the module itself
        return BootFailed(str(exc), traceback.format_exc(), location=where(exc))


def describe(module: str, exc: BaseException) -> BootFailed:
    """One line about a module that failed to import, with the traceback kept aside."""
    location = where(exc)
    text = str(exc)
    error = f"cannot import actor module {module!r}: {type(exc).__name__}"
    error += f": {text}" if text else ""
    if location:
        error += f" (at {location})"
    elif isinstance(exc, ModuleNotFoundError) and exc.name and module.startswith(exc.name):
        error += (
            f"; is it importable from the working directory ({os.getcwd()}), a --path "
            "directory or PYTHONPATH?"
        )
    tb = "".join(traceback.format_exception(exc))
    return BootFailed(error, tb, module=module, location=location)


def where(exc: BaseException) -> str:
    """`file:line` of the user's code that raised `exc` (a SyntaxError's own position),
    or "" when only the import machinery was involved."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f"{exc.filename}:{exc.lineno}"
    frames = [
        frame
        for frame in traceback.extract_tb(exc.__traceback__)
        if not frame.filename.startswith(_MACHINERY)
    ]
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else ""
