"""Migration 20: the jobs are counted as they change, so a count costs the same however
many finished jobs the retention keeps.

Before, `/stats`, a queue's stats and the Types page counted by scanning every job kept:
about 70 ms per million rows for `/stats` and most of a second for the Types page's run
times, every time the dashboard refreshed, growing with `--retention-seconds`.

Now three statement-level triggers on `jobs` (insert, update, delete; one function) append
each statement's net change per (queue, type, priority, status) to `job_count_changes`:
one row per group a statement moves, no index, no row two writers both update, so nodes
never wait on each other for it. A count is `job_counts` plus the changes not yet folded
in, read in one snapshot, so it is exact at any moment. The function runs as the
schema's owner, so a role that may write jobs (`goqueue.pg.enqueue` in an application's
own transaction) needs no grant on the counts. `FOLD` moves the changes into
`job_counts` now and then (`upkeep.TableCare`, one node at a time), which keeps the
changes few. The backfill counts the jobs already there, with writers held off (a lock
until the migration commits) so that no change is counted twice or missed. `{s}` stands
for the quoted schema.
"""

from __future__ import annotations

from typing import Final

COUNTED: Final = """
CREATE TABLE {s}.job_counts (
    queue    text NOT NULL,
    type     text NOT NULL,
    priority smallint NOT NULL,
    status   text NOT NULL,
    n        bigint NOT NULL,
    PRIMARY KEY (queue, type, priority, status)
);
CREATE TABLE {s}.job_count_changes (
    queue    text NOT NULL,
    type     text NOT NULL,
    priority smallint NOT NULL,
    status   text NOT NULL,
    n        bigint NOT NULL
);
CREATE FUNCTION {s}.count_job_changes() RETURNS trigger LANGUAGE plpgsql
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO {s}.job_count_changes
        SELECT queue, type, priority, status, count(*) FROM new_rows GROUP BY 1, 2, 3, 4;
    ELSIF TG_OP = 'DELETE' THEN
        INSERT INTO {s}.job_count_changes
        SELECT queue, type, priority, status, -count(*) FROM old_rows GROUP BY 1, 2, 3, 4;
    ELSE
        INSERT INTO {s}.job_count_changes
        SELECT queue, type, priority, status, sum(n) FROM (
            SELECT queue, type, priority, status, -1 AS n FROM old_rows
            UNION ALL
            SELECT queue, type, priority, status, 1 FROM new_rows) AS moved
        GROUP BY 1, 2, 3, 4 HAVING sum(n) <> 0;
    END IF;
    RETURN NULL;
END $$;
LOCK TABLE {s}.jobs IN SHARE ROW EXCLUSIVE MODE;
CREATE TRIGGER jobs_counted_insert AFTER INSERT ON {s}.jobs
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION {s}.count_job_changes();
CREATE TRIGGER jobs_counted_update AFTER UPDATE ON {s}.jobs
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION {s}.count_job_changes();
CREATE TRIGGER jobs_counted_delete AFTER DELETE ON {s}.jobs
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION {s}.count_job_changes();
INSERT INTO {s}.job_counts
SELECT queue, type, priority, status, count(*) FROM {s}.jobs GROUP BY 1, 2, 3, 4;
"""

# The changes folded into the counts: those this transaction's snapshot sees (a change
# committed meanwhile waits for the next fold), then the groups left at zero.
FOLD: Final = """
    WITH gone AS (
        DELETE FROM {s}.job_count_changes RETURNING queue, type, priority, status, n),
    summed AS (
        SELECT queue, type, priority, status, sum(n)::bigint AS n FROM gone
        GROUP BY 1, 2, 3, 4)
    INSERT INTO {s}.job_counts AS c SELECT * FROM summed
    ON CONFLICT (queue, type, priority, status) DO UPDATE SET n = c.n + excluded.n"""
DROP_ZEROS: Final = "DELETE FROM {s}.job_counts WHERE n = 0"

# Every count as (queue, type, priority, status, n): the folded ones and the changes since.
COUNTED_ROWS: Final = """(
            SELECT queue, type, priority, status, n FROM {s}.job_counts
            UNION ALL
            SELECT queue, type, priority, status, n FROM {s}.job_count_changes) AS counted"""
