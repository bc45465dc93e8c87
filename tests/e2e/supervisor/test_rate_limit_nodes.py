"""Rate limits on real nodes: at most N + 1 starts of a type in any sliding period, held back jobs
holding no worker while other types flow, on one node in memory and across two nodes
sharing PostgreSQL."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path

import pytest

from tests.conftest import Node, nodes_started_with, schema_args, wait_for

pytestmark = pytest.mark.timeout(120)

ACTORS = ("--actors", "ratedactors")


def starts(node: Node, job_type: str, count: int, timeout: float) -> list[float]:
    """When each of the `count` jobs of `job_type` started, as the job records it
    (`started_at`: its claim), once all are done. Their workers' own clocks (the
    results) must agree within a few seconds."""

    def done() -> list[dict] | None:
        jobs = node.get(f"/jobs?type={job_type}&status=done&limit=1000").body["jobs"]
        return jobs if len(jobs) >= count else None

    jobs = wait_for(done, timeout=timeout)
    for job in jobs:
        claimed = datetime.fromisoformat(job["started_at"]).timestamp()
        assert 0 <= job["result"]["started"] - claimed < 5, job
    return sorted(datetime.fromisoformat(job["started_at"]).timestamp() for job in jobs)


def busiest(times: list[float], period: float = 1.0) -> int:
    """The most starts in any window of `period` seconds, sliding (not clock seconds)."""
    times, most, first = sorted(times), 0, 0
    for last, at in enumerate(times):
        while at - times[first] > period:
            first += 1
        most = max(most, last - first + 1)
    return most


def enqueue(node: Node, job_type: str, count: int) -> None:
    reply = node.post("/jobs/batch", {"jobs": [{"type": job_type}] * count})
    assert reply.status == 200 and all(r["status"] == 201 for r in reply.body["results"])


def waits(node: Node, job_type: str) -> float:
    prefix = f'goqueue_rate_limit_waits_total{{type="{job_type}"}} '
    lines = [x for x in node.get("/metrics").body.splitlines() if x.startswith(prefix)]
    return float(lines[0].removeprefix(prefix)) if lines else 0.0


def test_a_rate_limited_type_waits_without_holding_back_the_others(
    make_node: Callable[..., Node],
) -> None:
    node = make_node(*ACTORS)
    enqueue(node, "paced", 20)  # @actor(rate_limit="5/s"): four windows at least
    enqueue(node, "free", 10)
    paced = starts(node, "paced", 20, timeout=30)
    free = starts(node, "free", 10, timeout=5)
    assert busiest(paced) <= 5 + 1, paced
    assert paced[-1] - paced[0] > 2.0, paced  # 5 at once at most, then one every 0.2 s
    # the free jobs did not queue behind the throttled ones (two workers, both free)
    assert free[-1] < paced[0] + 1.0, (free, paced)
    assert waits(node, "paced") > 0 and waits(node, "free") == 0


def test_the_config_wins_over_the_actor(make_node: Callable[..., Node], tmp_path: Path) -> None:
    path = tmp_path / "goqueue.toml"
    path.write_text('[rate_limits]\npaced = "2/s"\nfree = "100/m"\n')
    node = make_node(*ACTORS, "--config", str(path))
    enqueue(node, "paced", 6)
    paced = starts(node, "paced", 6, timeout=20)
    assert busiest(paced) <= 2 + 1, paced
    assert paced[-1] - paced[0] > 1.0, paced


@pytest.fixture
def pg_nodes(make_node: Callable[..., Node], tmp_path: Path) -> Iterator[Callable[[], Node]]:
    """Nodes sharing one fresh schema, with `stamp` limited to 20/s by the config."""
    path = tmp_path / "goqueue.toml"
    path.write_text('[rate_limits]\nstamp = "20/s"\n')
    yield from nodes_started_with(
        make_node, *ACTORS, *schema_args("gq_rate"), "--config", str(path)
    )


@pytest.mark.postgres
def test_a_limit_holds_across_two_nodes(pg_nodes: Callable[[], Node]) -> None:
    a, b = pg_nodes(), pg_nodes()
    began = time.time()
    enqueue(a, "stamp", 100)
    enqueue(b, "stamp", 100)
    times = starts(a, "stamp", 200, timeout=60)
    took, most = times[-1] - times[0], busiest(times)
    print(f"200 jobs at 20/s on two nodes: first to last start {took:.1f} s, enqueue to last")
    print(f"start {times[-1] - began:.1f} s; the busiest sliding second had {most} starts")
    assert most <= 20 + 1, times
    assert took > 8.0, took  # 20 at once at most, then one every 50 ms
    assert waits(a, "stamp") + waits(b, "stamp") > 0
