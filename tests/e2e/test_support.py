"""The judge of the fault tests, checked on its own: which repeated runs a fault excuses,
and how the run log is read. (A judge that excuses too much would let every double run
through; one that excuses too little would fail a correct fix.)"""

from __future__ import annotations

from pathlib import Path

from tests.e2e.support import (
    Fault,
    FaultKind,
    Run,
    avoidable_double_completions,
    excused,
    read_runs,
)

NODE, OTHER = 100, 200


def run(start: float, end: float | None, pgid: int = NODE, attempt: int = 1) -> Run:
    return Run("job", attempt, 1000 + int(start * 10), pgid, start, end)


def kill(at: float, pgid: int = NODE) -> Fault:
    return Fault(FaultKind.KILL_GROUP, pgid, at, at)


def test_a_run_in_progress_at_its_nodes_death_is_excused() -> None:
    assert excused(run(9.0, 10.5), [kill(10.0)], slack=1.0)


def test_a_run_whose_outcome_was_in_flight_at_the_death_is_excused() -> None:
    assert excused(run(9.0, 9.5), [kill(10.0)], slack=1.0)
    assert not excused(run(7.0, 8.5), [kill(10.0)], slack=1.0)


def test_a_fault_on_another_node_excuses_nothing() -> None:
    assert not excused(run(9.0, 10.5), [kill(10.0, OTHER)], slack=1.0)


def test_a_run_started_after_a_pause_is_not_excused_by_it() -> None:
    pause = Fault(FaultKind.STOP, NODE, 10.0, 16.0)
    assert excused(run(9.9, 16.01), [pause], slack=1.0)  # frozen mid-run
    assert not excused(run(16.02, 16.03), [pause], slack=1.0)  # a stale lease handed out


def test_an_outcome_held_by_an_outage_is_excused_only_if_its_node_died_meanwhile() -> None:
    outage = Fault(FaultKind.DATABASE, None, 10.0, 16.0)
    held = run(9.9, 10.2)
    assert not excused(held, [outage], slack=1.0)  # the node lived: it had to write it
    assert excused(held, [outage, kill(15.0)], slack=1.0)
    assert not excused(held, [outage, kill(30.0)], slack=1.0)  # it had time to write it


def test_one_unexcused_completion_per_job_is_the_normal_case() -> None:
    runs = {"job": [run(9.0, 10.5), run(13.0, 13.1, OTHER, attempt=2)]}
    assert not avoidable_double_completions(runs, [kill(10.0)])
    assert avoidable_double_completions(runs, [])


def test_the_run_log_pairs_starts_and_ends(tmp_path: Path) -> None:
    (tmp_path / "runs.log").write_text(
        "start a 1 10 100 1.0\nstart b 1 11 100 1.1\nend a 1 10 100 1.5\nstart a 2 12 200 3.0\n"
    )
    runs = read_runs(tmp_path)
    assert [(r.attempt, r.end) for r in runs["a"]] == [(1, 1.5), (2, None)]
    assert [r.completed for r in runs["b"]] == [False]


def test_an_outcome_held_through_two_outages_close_together_is_held_through_both() -> None:
    first = Fault(FaultKind.DATABASE, None, 10.0, 16.6)
    second = Fault(FaultKind.DATABASE, None, 16.9, 21.2)  # 0.3 s apart: a retry pause spans it
    held = run(9.9, 10.0)
    assert excused(held, [first, second, kill(21.4)], slack=1.0)
    assert not excused(held, [first, second, kill(30.0)], slack=1.0)
    far = Fault(FaultKind.DATABASE, None, 30.0, 35.0)  # 13 s later: it could have written it
    assert not excused(held, [first, far, kill(35.5)], slack=1.0)
