"""Migration 18's claim function: `claim_floored` with `p_start_types`, so a claim for
workers' queues starts the jobs at its head whose type starts soon, whatever other types
it takes.

Before, a claim started its best `p_start` jobs (all, or none), so on a node serving a
type that may run long (or one never seen run) every job it claimed for a queue was
started by a write of its own later. Now the jobs at the head of the claim, in claim
order, whose type is one of `p_start_types` are started too, up to the first job of
another type: no started job waits behind one that may run long. Migration 17's function
(without the parameter) stays, for nodes of older versions. `{s}` stands for the quoted
schema.
"""

from __future__ import annotations

from typing import Final

from goqueue.supervisor.store.postgres.sql.claim_keys import KEY_PROBES, spliced

# The head of the claim whose type starts soon: the first job of another type, in claim
# order, ends it (none such: every job taken is in it).
_LEAD: Final = """        head AS (
            SELECT coalesce(min(n) FILTER (WHERE NOT type = ANY (p_start_types)),
                            p_limit + 1) AS cut
            FROM pick),
"""

_STARTS: Final[tuple[tuple[str, str] | tuple[str, str, int], ...]] = (
    (
        "    p_floor_at timestamptz[], p_floor_seq bigint[])",
        "    p_floor_at timestamptz[], p_floor_seq bigint[], p_start_types text[])",
    ),
    (
        "            SELECT m.id, row_number() OVER (",
        "            SELECT m.id, m.type, row_number() OVER (",
        2,
    ),
    ("        claimed AS (\n", _LEAD + "        claimed AS (\n", 2),
    ("pick.n <= p_start", "(pick.n <= p_start OR pick.n < head.cut)", 6),
    (
        "            FROM pick WHERE j.id = pick.id",
        "            FROM pick, head WHERE j.id = pick.id",
        2,
    ),
)

CLAIM_STARTS: Final = spliced(KEY_PROBES, _STARTS, "claim_floored")
