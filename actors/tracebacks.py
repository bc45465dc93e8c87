"""A failed attempt's traceback, cut to a size worth storing with each attempt: the
last frames and the exception, since the frames nearest the raise explain it."""

from __future__ import annotations

import traceback
from collections.abc import Collection

DEFAULT_MAX_TRACEBACK_BYTES = 8192
_HEADER = "Traceback (most recent call last):\n"


def bounded(exc: BaseException, limit: int, hide: Collection[str] = ()) -> str:
    """`exc`'s traceback in at most `limit` bytes of UTF-8 (0: none), without the frames
    of the files in `hide` (the worker's own loop, which every traceback would start
    with): the oldest frames go first, replaced by a line saying how many; a last part
    too big on its own keeps its end."""
    if limit <= 0:
        return ""
    described = traceback.TracebackException.from_exception(exc)
    if hide:
        frames = [frame for frame in described.stack if frame.filename not in hide]
        described.stack = traceback.StackSummary.from_list(frames)
    parts = list(described.format())
    text = "".join(parts)
    if len(text.encode()) <= limit:
        return text
    kept: list[str] = []
    size = len(_HEADER.encode()) + len(_omitted(len(parts)).encode())
    for part in reversed(parts):
        grown = size + len(part.encode())
        if grown > limit:
            break
        kept.append(part)
        size = grown
    if not kept:
        return _tail(text, limit)
    omitted = len(parts) - len(kept)
    return _HEADER + _omitted(omitted) + "".join(reversed(kept))


def _omitted(count: int) -> str:
    return f"  ... {count} earlier parts omitted ...\n"


def _tail(text: str, limit: int) -> str:
    """The last `limit` bytes of `text`, whole characters only."""
    return text.encode()[-limit:].decode(errors="ignore")
