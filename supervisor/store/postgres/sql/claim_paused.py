"""Migration 19's claim function: `claim_floored` that takes from every queue but the
paused ones along its usual walk, each (type, priority) from its floor.

Before, a claim from every queue while some queue was paused listed the queues holding
pending jobs by skipping along `jobs_claim_queue`. The first step of that skip walks the
index entries of every job drained from the first queue since the last VACUUM (their
pending row versions stay in the index until then), so each claim cost more than the
last: a node draining 10,000 jobs beside a paused queue of 100,000 ran at a seventh of
its rate. Now the walk is the one taken when nothing is paused, the paused queues' jobs
stepped over: their rows sit below the floor once a claim has passed them, so a claim
steps over each of them about once between rescans (`floors.py`). `{s}` stands for the
quoted schema.
"""

from __future__ import annotations

from typing import Final

from goqueue.supervisor.store.postgres.sql.claim_keys import spliced
from goqueue.supervisor.store.postgres.sql.claim_starts import CLAIM_STARTS

_PAST_PAUSED: Final[tuple[tuple[str, str] | tuple[str, str, int], ...]] = (
    ("    v_turned text[];\n", "    v_turned text[];\n    v_paused text[];\n"),
    (
        "    IF p_queues IS NULL AND NOT EXISTS (SELECT 1 FROM {s}.paused_queues) THEN\n",
        "    v_paused := ARRAY(SELECT queue FROM {s}.paused_queues);\n"
        "    IF p_queues IS NULL THEN\n",
    ),
    (
        "                      AND j.priority = p.priority AND j.run_at <= now()\n",
        "                      AND j.priority = p.priority AND j.run_at <= now()\n"
        "                      AND NOT j.queue = ANY (v_paused)\n",
    ),
    (
        "                  AND (v_queues IS NULL OR j.queue = ANY (v_queues))\n",
        "                  AND (v_queues IS NULL OR j.queue = ANY (v_queues))\n"
        "                  AND NOT j.queue = ANY (v_paused)\n",
        2,
    ),
    (  # the queues asked for are the only ones walked by queue now
        "        IF p_queues IS NULL THEN\n"
        "            WITH RECURSIVE q AS (\n"
        "                SELECT min(queue) AS queue FROM {s}.jobs WHERE status = 'pending'\n"
        "                UNION ALL\n"
        "                SELECT (SELECT min(j.queue) FROM {s}.jobs j\n"
        "                        WHERE j.status = 'pending' AND j.queue > q.queue)\n"
        "                FROM q WHERE q.queue IS NOT NULL)\n"
        "            SELECT array_agg(q.queue) INTO v_queues FROM q"
        " WHERE q.queue IS NOT NULL;\n"
        "        ELSE\n"
        "            v_queues := p_queues;\n"
        "        END IF;\n",
        "        v_queues := p_queues;\n",
    ),
    (  # the paused queues, read once above
        "EXCEPT SELECT queue FROM {s}.paused_queues);",
        "EXCEPT SELECT unnest(v_paused));",
    ),
)

CLAIM_PAST_PAUSED: Final = spliced(CLAIM_STARTS, _PAST_PAUSED, "claim_floored")
