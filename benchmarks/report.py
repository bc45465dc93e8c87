"""`goqueue bench`'s table: one row a measure, one column a store."""

from __future__ import annotations

from typing import Any


def print_table(results: dict[str, Any]) -> None:
    m = results["machine"]
    print(
        f"\nmachine: {m['cores']} cores, Python {m['python']}, "
        f"PostgreSQL {m.get('postgresql', 'n/a')} (fsync {m.get('fsync', 'n/a')})"
    )
    rows = [
        ("enqueue p50/p95/p99 @200/s (ms)", lambda r: _lat(r["latency_200"])),
        ("enqueue p50/p95/p99 @2000/s (ms)", lambda r: _lat(r["latency_2000"])),
        ("success @2000/s", lambda r: f"{r['latency_2000']['success']:.1%}"),
        ("max enqueue, single (jobs/s)", lambda r: f"{r['max_single']['jobs_per_s']:,.0f}"),
        ("max enqueue, batch of 1000 (jobs/s)", lambda r: f"{r['max_batch']['jobs_per_s']:,.0f}"),
        ("end to end, 1 producer (jobs/s)", lambda r: _e2e(r["end_to_end"])),
        ("end to end, 16 producers (jobs/s)", lambda r: _e2e(r["end_to_end_16"])),
        ("supervisor CPU/job, 1 producer (µs)", lambda r: _cpu(r["end_to_end"])),
        ("supervisor CPU/job, 16 producers (µs)", lambda r: _cpu(r["end_to_end_16"])),
        ("loop time/job http/workers/dispatch, 16 (µs)", lambda r: _loop(r["end_to_end_16"])),
        ("loop lag p99, 16 producers (ms)", lambda r: _lag(r["end_to_end_16"])),
        ("PostgreSQL per job, 1 producer", lambda r: _pg(r["end_to_end"])),
        ("PostgreSQL per job, 16 producers", lambda r: _pg(r["end_to_end_16"])),
        (
            "hung worker dead after deadline (ms)",
            lambda r: f"{r['hard_timeout']['median_kill_ms']:.0f} (median of 5)",
        ),
        (
            "replacement has run a job after (ms)",
            lambda r: f"{r['hard_timeout']['median_replace_ms']:.0f} (median of 5)",
        ),
        (
            "supervisor memory per pending job",
            lambda r: f"{r['memory']['bytes_per_job']:,.0f} B" if "memory" in r else "-",
        ),
    ]
    stores = list(results["stores"])
    print(f"\n| {'measure':<40} | " + " | ".join(f"{s:<40}" for s in stores) + " |")
    print(f"|{'-' * 42}|" + "|".join("-" * 42 for _ in stores) + "|")
    for label, cell in rows:
        values = []
        for s in stores:
            try:
                values.append(cell(results["stores"][s]))
            except (KeyError, TypeError):
                values.append("-")
        print(f"| {label:<40} | " + " | ".join(f"{v:<40}" for v in values) + " |")


def _lat(r: dict[str, Any]) -> str:
    return f"{r['p50_ms']:.2f} / {r['p95_ms']:.2f} / {r['p99_ms']:.2f}"


def _loop(r: dict[str, Any]) -> str:
    split = r["loop"]["us_per_job"]
    return " / ".join(f"{split.get(work, 0):.0f}" for work in ("http", "workers", "dispatch"))


def _lag(r: dict[str, Any]) -> str:
    return f"{r['loop']['lag_p99_s'] * 1000:g} (bucket bound)"


def _e2e(r: dict[str, Any]) -> str:
    c = r["ceiling"]
    return f"{r['jobs_per_s']:,.0f} ({r['ceiling_ratio']:.2f}x ceiling {c['jobs_per_s']:,.0f})"


def _cpu(r: dict[str, Any]) -> str:
    c = r["ceiling"]["cpu_us_per_request"]
    return f"{r['cpu_us_per_job']:.0f} ({r['cpu_ratio']:.2f}x ceiling {c:.0f})"


def _pg(r: dict[str, Any]) -> str:
    if "pg_per_job" not in r:
        return "-"
    p = r["pg_per_job"]
    commits, inserted, updated = p["xact_commit"], p["tup_inserted"], p["tup_updated"]
    return f"{commits:.2f} commits, {inserted:.2f} ins, {updated:.2f} upd"
