"""What the workflows' counts (each `/metrics` scrape) and a page of workflows by status
(`GET /workflows?status=failed`) cost as finished workflows pile up, at the store.

For each size, a fresh store holds that many finished 3-step workflows (about 2 % failed)
and one running; each read is timed 7 times and the median printed. Flat from size to
size is the point: the history is kept, and reads must not pay for it.

    python -m benchmarks.flows --sizes 5000 50000
    python -m benchmarks.flows --database-url postgresql://postgres@127.0.0.1:5432/test

On SQLite the history is made through the store (created, claimed, completed); on
PostgreSQL it is inserted in one statement, then settled by a fold, as a node would.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from goqueue.supervisor.common.enums import WorkflowStatus
from goqueue.supervisor.common.jobs import JobSpec, new_id
from goqueue.supervisor.store.base import NewJob, Store
from goqueue.supervisor.store.new_workflow import NewStep, NewWorkflow

RUNS = 7
CHAIN = (("a", []), ("b", ["a"]), ("c", ["b"]))


def chain() -> NewWorkflow:
    """A 3-step chain of `t` jobs."""
    spec = JobSpec(type="t")
    steps = [NewStep(key=k, after=a, new=NewJob(spec=spec, max_retries=0)) for k, a in CHAIN]
    return NewWorkflow(id=new_id(), name="history", steps=steps)


async def median_ms(read: Callable[[], Awaitable[Any]]) -> float:
    """The median time of `RUNS` calls of `read`, in ms."""
    took = []
    for _ in range(RUNS):
        started = time.perf_counter()
        await read()
        took.append(time.perf_counter() - started)
    return statistics.median(took) * 1e3


async def sqlite_history(store: Store, size: int) -> None:
    """`size` chains run through the store, about one in fifty failing at its last step."""
    for start in range(0, size, 100):
        await asyncio.gather(
            *(store.create_workflow(chain()) for _ in range(min(100, size - start)))
        )
    done = 0
    while leases := await store.claim(500, None, {"t": 500}, start=500):
        for lease in leases:
            done += 1
            if lease.job.step_key == "c" and done % 50 == 0:
                await store.fail(lease, "boom", None)
            else:
                await store.complete(lease, None)


async def postgres_history(dsn: str, schema: str, size: int) -> None:
    """`size` finished chains inserted at once (about 2 % failed at their last step)."""
    import psycopg

    s = f'"{schema}"'
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(
            f"""WITH w AS (INSERT INTO {s}.workflows (id, name, created_at)
                SELECT gen_random_uuid(), 'history', now() FROM generate_series(1, {size})
                RETURNING id)
            INSERT INTO {s}.jobs (id, type, queue, payload, priority, status, attempts,
                max_retries, run_at, created_at, started_at, finished_at, updated_at,
                workflow_id, step_key)
            SELECT gen_random_uuid(), 't', 'default', '{{}}', 5,
                CASE WHEN k = 3 AND random() < 0.02 THEN 'failed' ELSE 'done' END, 1, 0,
                now(), now(), now(), now(), now(), w.id, 's' || k
            FROM w, generate_series(1, 3) AS k"""
        )
        await conn.execute(f"VACUUM ANALYZE {s}.jobs, {s}.workflows")


async def measure(database_url: str | None, size: int) -> dict[str, Any]:
    """One fresh store with `size` finished workflows: the reads' medians."""
    if database_url is None:
        from goqueue.supervisor.store.sqlite.store import SqliteStore

        folder = tempfile.mkdtemp(prefix="goqueue-flows-")
        store: Store = SqliteStore(os.path.join(folder, "jobs.db"), "bench")
        await store.open()
        await sqlite_history(store, size)
    else:
        from goqueue.supervisor.store.postgres.store import PostgresStore
        from goqueue.supervisor.store.postgres.upkeep import TableCare

        schema = f"goqueue_flows_{uuid.uuid4().hex[:8]}"
        pg = PostgresStore(database_url, "bench", schema=schema)
        store = pg
        await pg.open()
        await postgres_history(database_url, schema, size)
        await TableCare(pg._db, schema).fold()
    try:
        await store.create_workflow(chain())
        counts = await store.workflow_counts()
        return {
            "store": "sqlite" if database_url is None else "postgres",
            "workflows": size + 1,
            "by_status": counts.by_status,
            "counts_ms": round(await median_ms(store.workflow_counts), 2),
            "failed_page_ms": round(
                await median_ms(lambda: store.list_workflows(WorkflowStatus.FAILED, 20, 0)), 2
            ),
        }
    finally:
        await store.close()
        if database_url is not None:
            import psycopg

            async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as c:
                await c.execute(f'DROP SCHEMA "{schema}" CASCADE')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[5000, 50000])
    parser.add_argument("--database-url", help="postgresql://… (default: a SQLite file)")
    args = parser.parse_args()
    for size in args.sizes:
        print(asyncio.run(measure(args.database_url, size)))


if __name__ == "__main__":
    main()
