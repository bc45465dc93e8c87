"""How the `goqueue` client prints the server's answers for people.

Tables with upper-case headers (numbers right-aligned, cells one line and cut short,
times to the second), `key  value` blocks for one object (an attempt's errors as an
indented table), page footers, per-status counts and pending depth by priority. Every
function returns text; `client` prints it (or, with `--json`, the answer unchanged).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

JOB_COLUMNS = ("id", "type", "queue", "status", "priority", "attempts", "created_at")
JOB_FIELD_ORDER = (
    "id",
    "type",
    "queue",
    "status",
    "priority",
    "attempts",
    "max_retries",
    "run_at",
    "timeout_seconds",
    "dedupe_key",
    "unique_key",
    "webhook_url",
    "parent_id",
    "on_success",
    "on_failure",
    "created_at",
    "started_at",
    "finished_at",
    "updated_at",
    "last_error",
    "payload",
    "progress",
    "result",
)
EVENT_COLUMNS = ("at", "event", "attempt", "node", "detail")
DEAD_COLUMNS = ("id", "job_id", "type", "queue", "attempts", "created_at", "last_error")
MAX_CELL = 60


def cell(value: Any) -> str:
    """One value as text: `-` for null, JSON for structures."""
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"))


def _short_time(value: Any) -> Any:
    """An RFC 3339 time to the second (`2025-01-31 09:00:00Z`); anything else unchanged."""
    if not isinstance(value, str):
        return value
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return value
    offset = parsed.utcoffset()
    zone = "Z" if offset is not None and not offset else parsed.strftime("%z")
    return parsed.strftime("%Y-%m-%d %H:%M:%S") + zone


def _table_cell(column: str, value: Any) -> str:
    """A value for a table: one line, short, times to the second."""
    if column == "at" or column.endswith("_at"):
        value = _short_time(value)
    text = " ".join(cell(value).split())
    return text if len(text) <= MAX_CELL else text[: MAX_CELL - 3] + "..."


def table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str], indent: str = "") -> str:
    """Rows as an aligned table under upper-case headers; numbers right-aligned."""
    cells = [[_table_cell(c, row.get(c)) for c in columns] for row in rows]
    widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(columns)]
    numeric = [_is_numeric_column(rows, c) for c in columns]
    lines = []
    for line in [[c.upper() for c in columns], *cells]:
        parts = [
            text.rjust(width) if right else text.ljust(width)
            for text, width, right in zip(line, widths, numeric, strict=True)
        ]
        lines.append((indent + "  ".join(parts)).rstrip())
    return "\n".join(lines)


def _is_numeric_column(rows: Sequence[Mapping[str, Any]], column: str) -> bool:
    """True when every value in the column is a number (booleans are not)."""
    values = [row.get(column) for row in rows]
    return bool(values) and all(
        isinstance(v, int | float) and not isinstance(v, bool) for v in values
    )


def fields(obj: Mapping[str, Any], order: Iterable[str] = (), indent: str = "") -> str:
    """One object as `key  value` lines: `order` first, then the rest; lists of objects
    (an attempt's errors) become an indented table."""
    keys = [k for k in order if k in obj] + [k for k in obj if k not in order]
    width = max((len(k) for k in keys), default=0)
    lines = []
    for key in keys:
        value = obj[key]
        if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            lines.append(f"{indent}{key}:")
            lines.append(table(value, list(value[0]), indent=indent + "  "))
        else:
            # Continuation lines (a traceback in last_error) stay in the value column.
            text = cell(value).replace("\n", "\n" + " " * (len(indent) + width + 2))
            lines.append(f"{indent}{key.ljust(width)}  {text}".rstrip())
    return "\n".join(lines)


def without_tracebacks(obj: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    """`obj` with its attempts' `errors` cut to one line each (no traceback column), and
    the last traceback as an indented block to print after it ("" when none)."""
    errors = obj.get("errors") or []
    if not isinstance(errors, list):
        return dict(obj), ""
    rows = [{k: v for k, v in e.items() if k != "traceback"} for e in errors]
    last = next((e for e in reversed(errors) if e.get("traceback")), None)
    if last is None:
        return {**obj, "errors": rows}, ""
    body = "\n".join("  " + line for line in last["traceback"].rstrip("\n").splitlines())
    return {**obj, "errors": rows}, f"traceback (attempt {last['attempt']}):\n{body}"


def page_footer(noun: str, shown: int, page: Mapping[str, Any]) -> str:
    """`showing 1-50 of 120 jobs`, from a list answer's total and offset."""
    total = page.get("total", shown)
    offset = page.get("offset", 0)
    if not shown:
        return f"no {noun}" if not total else f"no {noun} at offset {offset} (total {total})"
    return f"showing {offset + 1}-{offset + shown} of {total} {noun}"


def counts(title: str, counts: Mapping[str, Any], order: Sequence[str] = ()) -> str:
    """A count per name, `order` first, as a two-column table."""
    names = [n for n in order if n in counts] + [n for n in counts if n not in order]
    return table([{title: n, "count": counts[n]} for n in names], (title, "count"))


def priority_depth(depth: Mapping[str, Any]) -> str:
    """`10:1 5:3`: pending jobs per priority, highest first."""
    ordered = sorted(depth.items(), key=lambda kv: _as_int(kv[0]), reverse=True)
    return " ".join(f"{p}:{n}" for p, n in ordered) or "-"


def _as_int(text: str) -> int:
    """A priority key as a number for sorting (non-numbers last)."""
    try:
        return int(text)
    except ValueError:
        return -1


def dead_row(dead: Mapping[str, Any]) -> dict[str, Any]:
    """A dead letter flattened for the table."""
    job = dead.get("job") or {}
    picked = {k: job.get(k) for k in ("type", "queue", "attempts", "last_error")}
    return {**dead, **picked}
