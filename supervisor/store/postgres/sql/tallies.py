"""Migration 22: the dead letters are counted as they come and go, so `/stats` and every
`/metrics` scrape (`goqueue_dead_letters`) cost the same however many dead letters wait:
they stay until replayed or purged, and a count of them read them all.

Two statement-level triggers on `dead_letters` (insert, delete) append each statement's
change to `tally_changes`, the way the jobs' counts are kept (`sql/counts.py`): no
index, no row two writers both update. A tally is `tallies` plus its changes not folded
in yet, read in one snapshot, so it is exact at any moment. `TALLY_FOLD` folds them on
the jobs' counts' fold (`upkeep.TableCare`, one node at a time). The upgrade counts the
dead letters already there, with writers held off. `{s}` stands for the quoted schema.
"""

from __future__ import annotations

from typing import Final

TALLIED: Final = """
CREATE TABLE {s}.tallies (name text PRIMARY KEY, n bigint NOT NULL);
CREATE TABLE {s}.tally_changes (name text NOT NULL, n bigint NOT NULL);
CREATE FUNCTION {s}.count_dead_letters() RETURNS trigger LANGUAGE plpgsql
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO {s}.tally_changes
        SELECT 'dead', count(*) FROM new_rows HAVING count(*) > 0;
    ELSE
        INSERT INTO {s}.tally_changes
        SELECT 'dead', -count(*) FROM old_rows HAVING count(*) > 0;
    END IF;
    RETURN NULL;
END $$;
LOCK TABLE {s}.dead_letters IN SHARE ROW EXCLUSIVE MODE;
CREATE TRIGGER dead_counted_insert AFTER INSERT ON {s}.dead_letters
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION {s}.count_dead_letters();
CREATE TRIGGER dead_counted_delete AFTER DELETE ON {s}.dead_letters
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION {s}.count_dead_letters();
INSERT INTO {s}.tallies SELECT 'dead', count(*) FROM {s}.dead_letters;
"""

# The changes this snapshot sees, folded into the tallies.
TALLY_FOLD: Final = """
    WITH gone AS (DELETE FROM {s}.tally_changes RETURNING name, n)
    INSERT INTO {s}.tallies AS t SELECT name, sum(n)::bigint FROM gone GROUP BY name
    ON CONFLICT (name) DO UPDATE SET n = t.n + excluded.n"""

# The dead letters waiting: the tally and its changes since.
DEAD_TALLY: Final = """(
    SELECT coalesce(sum(n), 0)::bigint FROM (
        SELECT n FROM {s}.tallies WHERE name = 'dead'
        UNION ALL SELECT n FROM {s}.tally_changes WHERE name = 'dead') AS dead)"""
