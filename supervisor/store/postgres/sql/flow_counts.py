"""Migration 21: a workflow's status is kept with it, so the workflows' counts and a
listing by status cost the same however many workflows the retention keeps.

Before, every `/metrics` scrape (`goqueue_workflows`) and every listing of workflows
derived the status of every workflow kept from all its steps: about 20 ms per 5,000
workflows, growing with the history.

Now row triggers on `jobs` append to `workflow_touches` the workflow of each step a
statement inserts, deletes, finishes, brings back from finished or makes a step (a
replay's fresh job); their `WHEN` leaves every other row alone without a call, so jobs
outside workflows pay nothing, and a move between unfinished statuses moves no
workflow's status. Cancelling a workflow touches it too. No index, no row two writers
both update: nodes never wait on each other for it. `workflows.status` is the status as
of the last fold (NULL for a workflow not folded yet, always touched), and
`workflow_counts` plus `workflow_count_changes` count those. A read is exact at any
moment, in one snapshot: the statuses kept, with the touched workflows' statuses
derived again from their steps in place of their kept ones (the touched are few: those
moved since the last fold). `FLOW_FOLD` settles the touched workflows now and then, on
the jobs' counts' fold (`upkeep.TableCare`, one node at a time); pruning a workflow
counts its kept status out. The upgrade derives every workflow's status with writers
held off. `{s}` stands for the quoted schema.
"""

from __future__ import annotations

from typing import Final

# The current job of each key of the workflows `IDS` stands for (its latest: a replay
# adds a fresh one), with `first`, the creation order of the key.
CURRENT: Final = """(
    SELECT t.workflow_id, t.step_key, t.id, t.status, t.first FROM (
        SELECT workflow_id, step_key, id, status, seq,
            min(seq) OVER (PARTITION BY workflow_id, step_key) AS first,
            row_number() OVER (PARTITION BY workflow_id, step_key ORDER BY seq DESC) AS r
        FROM {s}.jobs WHERE workflow_id = ANY (IDS)) t
    WHERE t.r = 1)"""

# The workflows `IDS` stands for: each with its order, its status kept (`kept`) and its
# status now (`status`, mirroring `workflows.workflow_status`: with no step kept, done).
_DERIVED: Final = f"""(
    SELECT f.id, f.seq, f.status AS kept,
        CASE WHEN f.cancelled_at IS NOT NULL THEN 'cancelled'
            WHEN bool_or(c.status NOT IN ('done', 'failed', 'cancelled')) THEN 'running'
            WHEN bool_or(c.status IN ('failed', 'cancelled')) THEN 'failed'
            ELSE 'done' END AS status
    FROM {{s}}.workflows f LEFT JOIN {CURRENT} c ON c.workflow_id = f.id
    WHERE f.id = ANY (IDS)
    GROUP BY f.id, f.seq, f.status)"""


def derived(ids: str) -> str:
    """`_DERIVED` for the workflows whose ids `ids` (an array expression) holds."""
    return _DERIVED.replace("IDS", ids)


# The workflows touched since the last fold, as `derived` gives them.
TOUCHED: Final = derived("ARRAY(SELECT DISTINCT workflow_id FROM {s}.workflow_touches)")

FLOW_STATUS: Final = f"""
ALTER TABLE {{s}}.workflows ADD COLUMN status text;
CREATE INDEX workflows_status ON {{s}}.workflows (status, seq DESC);
CREATE TABLE {{s}}.workflow_touches (workflow_id uuid NOT NULL);
CREATE TABLE {{s}}.workflow_counts (status text PRIMARY KEY, n bigint NOT NULL);
CREATE TABLE {{s}}.workflow_count_changes (status text NOT NULL, n bigint NOT NULL);
CREATE FUNCTION {{s}}.touch_workflow() RETURNS trigger LANGUAGE plpgsql
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    INSERT INTO {{s}}.workflow_touches VALUES
        (CASE WHEN TG_OP = 'DELETE' THEN OLD.workflow_id ELSE NEW.workflow_id END);
    RETURN NULL;
END $$;
LOCK TABLE {{s}}.jobs IN SHARE ROW EXCLUSIVE MODE;
CREATE TRIGGER jobs_touch_insert AFTER INSERT ON {{s}}.jobs FOR EACH ROW
    WHEN (NEW.workflow_id IS NOT NULL) EXECUTE FUNCTION {{s}}.touch_workflow();
CREATE TRIGGER jobs_touch_delete AFTER DELETE ON {{s}}.jobs FOR EACH ROW
    WHEN (OLD.workflow_id IS NOT NULL) EXECUTE FUNCTION {{s}}.touch_workflow();
CREATE TRIGGER jobs_touch_update AFTER UPDATE OF status, workflow_id ON {{s}}.jobs
    FOR EACH ROW WHEN (NEW.workflow_id IS NOT NULL
        AND (NEW.workflow_id IS DISTINCT FROM OLD.workflow_id
             OR NEW.status <> OLD.status
                AND (NEW.status IN ('done', 'failed', 'cancelled')
                     OR OLD.status IN ('done', 'failed', 'cancelled'))))
    EXECUTE FUNCTION {{s}}.touch_workflow();
LOCK TABLE {{s}}.workflows IN SHARE ROW EXCLUSIVE MODE;
UPDATE {{s}}.workflows f SET status = d.status
FROM {derived("ARRAY(SELECT id FROM {s}.workflows)")} d WHERE d.id = f.id;
INSERT INTO {{s}}.workflow_counts SELECT status, count(*) FROM {{s}}.workflows GROUP BY 1;
"""

# The touched workflows (those this snapshot sees) settled: each one's status kept anew,
# and the moves and the changes since counted into `workflow_counts`. One statement.
FLOW_FOLD: Final = f"""
    WITH gone AS (DELETE FROM {{s}}.workflow_touches RETURNING workflow_id),
    derived AS {derived("ARRAY(SELECT DISTINCT workflow_id FROM gone)")},
    moved AS (
        UPDATE {{s}}.workflows f SET status = d.status FROM derived d
        WHERE f.id = d.id AND f.status IS DISTINCT FROM d.status
        RETURNING d.kept, d.status),
    dropped AS (DELETE FROM {{s}}.workflow_count_changes RETURNING status, n),
    summed AS (
        SELECT status, sum(n)::bigint AS n FROM (
            SELECT kept AS status, -1 AS n FROM moved WHERE kept IS NOT NULL
            UNION ALL SELECT status, 1 FROM moved
            UNION ALL SELECT status, n FROM dropped) AS moves
        GROUP BY status)
    INSERT INTO {{s}}.workflow_counts AS c SELECT * FROM summed
    ON CONFLICT (status) DO UPDATE SET n = c.n + excluded.n"""
