"""Migration 22: the dead letters are counted as they come and go, so `/stats` and every
`/metrics` scrape (`goqueue_dead_letters`) cost the same however many dead letters wait:
they stay until replayed or purged, and a count of them read them all.

Two statement-level triggers on `dead_letters` (insert, delete) append each statement's
change to `tally_changes`, the way the jobs' counts are kept (`sql/counts.py`): no
index, no row two writers both update. A tally is `tallies` plus its changes not folded
in yet, read in one snapshot, so it is exact at any moment. `TALLY_FOLD` folds them on
the jobs' counts' fold (`upkeep.TableCare`, one node at a time). The upgrade counts the
dead letters already there, with writers held off. `{s}` stands for the quoted schema.

Migration 24 (`DEAD_GROUPS`) gives each letter its job's queue and type as columns
(filled by a trigger, so a node of an older version writes them too), tallies the
letters by both under the name `dead <queue> <type>` (a space is in neither name), and
indexes each, newest first: a dead-letter page filtered by queue or type counts its
total from the tallies (`DEAD_GROUP_TALLY`), not by reading every letter, and finds its
letters without walking the others.
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

# A dead letter's group: its tally's name.
_GROUP = "'dead ' || r.queue || ' ' || r.type"

DEAD_GROUPS: Final = rf"""
ALTER TABLE {{s}}.dead_letters ADD COLUMN queue text, ADD COLUMN type text;
-- A field of a letter's job, read safely: `->>` refuses a document holding the escape
-- \u0000 anywhere (in a payload, say), so such a letter's field is read from the text
-- (the job's own fields come before its payload in what the nodes write).
CREATE FUNCTION {{s}}.job_field(doc json, field text) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN strpos(doc::text, '\u0000') = 0 THEN doc ->> field
        ELSE substring(doc::text FROM '"' || field || '":"([^"\\]*)"') END $$;
-- Every letter's queue and type, whoever writes it (a node of an older version too).
CREATE FUNCTION {{s}}.group_dead_letter() RETURNS trigger LANGUAGE plpgsql
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    NEW.queue := coalesce(NEW.queue, {{s}}.job_field(NEW.job, 'queue'), '');
    NEW.type := coalesce(NEW.type, {{s}}.job_field(NEW.job, 'type'), '');
    RETURN NEW;
END $$;
CREATE TRIGGER dead_grouped BEFORE INSERT ON {{s}}.dead_letters
    FOR EACH ROW EXECUTE FUNCTION {{s}}.group_dead_letter();
UPDATE {{s}}.dead_letters SET queue = coalesce({{s}}.job_field(job, 'queue'), ''),
    type = coalesce({{s}}.job_field(job, 'type'), '');
ALTER TABLE {{s}}.dead_letters ALTER COLUMN queue SET NOT NULL,
    ALTER COLUMN type SET NOT NULL;
CREATE OR REPLACE FUNCTION {{s}}.count_dead_letters() RETURNS trigger LANGUAGE plpgsql
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO {{s}}.tally_changes
        SELECT g.name, count(*) FROM new_rows r
        CROSS JOIN LATERAL (VALUES ('dead'), ({_GROUP})) AS g(name) GROUP BY g.name;
    ELSE
        INSERT INTO {{s}}.tally_changes
        SELECT g.name, -count(*) FROM old_rows r
        CROSS JOIN LATERAL (VALUES ('dead'), ({_GROUP})) AS g(name) GROUP BY g.name;
    END IF;
    RETURN NULL;
END $$;
INSERT INTO {{s}}.tally_changes SELECT {_GROUP}, count(*) FROM {{s}}.dead_letters r GROUP BY 1;
CREATE INDEX dead_letters_queue ON {{s}}.dead_letters (queue, created_at DESC, seq DESC);
CREATE INDEX dead_letters_type ON {{s}}.dead_letters (type, created_at DESC, seq DESC);
"""

# The dead letters of a queue, of a type, or of both (`%(queue)s`, `%(type)s`, either
# NULL): their groups' tallies and changes since, one row per group and change.
DEAD_GROUP_TALLY: Final = """(
    SELECT coalesce(sum(n), 0)::bigint FROM (
        SELECT name, n FROM {s}.tallies WHERE name LIKE 'dead %%'
        UNION ALL SELECT name, n FROM {s}.tally_changes WHERE name LIKE 'dead %%') AS g
    WHERE (%(queue)s::text IS NULL OR split_part(g.name, ' ', 2) = %(queue)s::text)
      AND (%(type)s::text IS NULL OR split_part(g.name, ' ', 3) = %(type)s::text))"""
