"""Which PostgreSQL writes wait for the WAL's flush: an enqueue does; a claim, a start and
a success do not (`docs/guide/stores.md`). Shown on a private cluster told, once the jobs
are in, that every commit waiting for the flush must also wait for a synchronous standby
that never comes (`synchronous_standby_names`): such a commit then hangs until the
store's command timeout, while one that does not wait returns at once."""

from __future__ import annotations

import asyncio

import pytest
from goqueue.supervisor.common.enums import Status
from goqueue.supervisor.common.errors import OutcomeUnknown

from tests.e2e.store.pg_nodes import Nodes, new
from tests.pgcluster import PgCluster

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(120)]

TIMEOUT = 3.0  # the store's command timeout: how long a commit that waits hangs


async def standby_awaited(nodes: Nodes) -> None:
    """Make each commit that waits for the flush wait for a standby named `nobody`, and
    return once the server's processes were told (a new one sees the setting: the
    postmaster reloads before it signals the others)."""
    await nodes.sql("ALTER SYSTEM SET synchronous_standby_names = 'nobody'")
    await nodes.sql("SELECT pg_reload_conf()")
    async with asyncio.timeout(30):
        while (await nodes.sql("SHOW synchronous_standby_names"))[0][0] != "nobody":
            await asyncio.sleep(0.05)


def test_claims_starts_and_successes_commit_without_waiting_for_the_flush(
    pg_cluster: PgCluster,
) -> None:
    async def body(nodes: Nodes) -> None:
        store = await nodes.open("node-a", command_timeout=TIMEOUT)
        for _ in range(2):
            await store.enqueue(new("t"))
        await standby_awaited(nodes)

        async with asyncio.timeout(TIMEOUT / 2):  # none of these waits for the standby
            claimed = await store.claim(2, None, {"t": 2}, start=1)
            assert [lease.job.status for lease in claimed] == [Status.RUNNING, Status.CLAIMED]
            started = await store.start(claimed[1])
            assert started is not None and started.job.status is Status.RUNNING
            for lease in (claimed[0], started):
                outcome = await store.complete(lease, None)
                assert outcome is not None and outcome.job.status is Status.DONE

        # an enqueue's commit does wait: it is committed, but never confirmed
        with pytest.raises(OutcomeUnknown):
            await store.enqueue(new("t"))
        rows = await nodes.sql("SELECT status, count(*) FROM {s}.jobs GROUP BY 1 ORDER BY 1")
        assert rows == [("done", 2), ("pending", 1)]

    Nodes(pg_cluster.dsn, "gq_flush").run(body)
