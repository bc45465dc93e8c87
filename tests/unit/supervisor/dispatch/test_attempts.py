"""One record per attempt (`dispatch/attempts.py`): every allowed move, every refused one,
the order in hand, counts by phase and type, and times."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from goqueue.supervisor.common.enums import KillReason, Status
from goqueue.supervisor.common.jobs import Job, JobSpec, Lease
from goqueue.supervisor.dispatch.attempts import HELD, MOVES, Attempt, Attempts, Phase, WrongPhase

NOW = datetime(2026, 1, 1, tzinfo=UTC)

# how to bring a fresh attempt into each phase, by moves the table allows
PATHS: dict[Phase, list[Phase]] = {
    Phase.IN_HAND: [Phase.IN_HAND],
    Phase.STARTING: [Phase.IN_HAND, Phase.STARTING],
    Phase.QUEUED: [Phase.IN_HAND, Phase.QUEUED],
    Phase.GOING: [Phase.IN_HAND, Phase.QUEUED, Phase.GOING],
    Phase.GRANTED: [Phase.IN_HAND, Phase.QUEUED, Phase.GOING, Phase.GRANTED],
    Phase.MOVING: [Phase.IN_HAND, Phase.QUEUED, Phase.MOVING],
    Phase.WITHDRAWN: [Phase.IN_HAND, Phase.QUEUED, Phase.WITHDRAWN],
    Phase.RUNNING: [Phase.RUNNING],
}


def lease(job_type: str = "a", status: Status = Status.CLAIMED) -> Lease:
    job = Job.from_spec(JobSpec(type=job_type), now=NOW, max_retries=3)
    job.status = status
    return Lease(job=job, token=f"token-{job.id}", owner="node", expires_at=NOW)


def brought_to(table: Attempts, phase: Phase) -> Attempt:
    """A new attempt in `table`, moved along `PATHS[phase]`."""
    first, *rest = PATHS[phase]
    attempt = table.add(lease(), first, 1.0)
    for step in rest:
        table.move(attempt, step)
    assert attempt.phase is phase
    return attempt


@pytest.mark.parametrize("came", list(PATHS))
@pytest.mark.parametrize("to", [p for p in Phase if p is not Phase.NEW])
def test_every_move_the_table_allows_is_made_and_every_other_is_refused(
    came: Phase, to: Phase
) -> None:
    table = Attempts()
    attempt = brought_to(table, came)
    counts = {phase: dict(table.by_type(phase)) for phase in Phase}
    if came in MOVES[to]:
        table.move(attempt, to)
        assert attempt.phase is to
        assert (table.get(attempt.token) is None) == (to is Phase.GONE)
        if to is not Phase.GONE:
            assert table.by_type(to)["a"] == 1
        assert table.by_type(came)["a"] == 0 or came is to
    else:
        with pytest.raises(WrongPhase, match=f"{came} -> {to}"):
            table.move(attempt, to)
        assert attempt.phase is came  # refused before anything changed
        assert {phase: dict(table.by_type(phase)) for phase in Phase} == counts
        assert table.get(attempt.token) is attempt


def test_no_attempt_is_born_anywhere_but_in_hand_or_running() -> None:
    for phase in Phase:
        table = Attempts()
        if Phase.NEW in MOVES.get(phase, frozenset()):
            table.add(lease(), phase, 1.0)
        else:
            with pytest.raises(WrongPhase):
                table.add(lease(), phase, 1.0)
    assert {p for p in Phase if Phase.NEW in MOVES.get(p, frozenset())} == {
        Phase.IN_HAND,
        Phase.RUNNING,
    }


def test_a_withdrawn_attempt_keeps_why_and_is_no_longer_held() -> None:
    table = Attempts()
    attempt = brought_to(table, Phase.GRANTED)
    assert attempt.written  # its start was written before it was taken back
    table.withdraw(attempt, KillReason.CANCEL)
    assert attempt.phase is Phase.WITHDRAWN and attempt.reason is KillReason.CANCEL
    assert Phase.WITHDRAWN not in HELD and Phase.GONE not in HELD


def test_a_worker_takes_the_best_started_attempt_of_its_types_before_a_claimed_one() -> None:
    table = Attempts()
    claimed_a = table.add(lease("a"), Phase.IN_HAND, 1.0)
    other_b = table.add(lease("b"), Phase.IN_HAND, 1.0)
    started_a = table.add(lease("a", Status.RUNNING), Phase.IN_HAND, 1.0)
    assert table.next_for(frozenset({"a"})) is started_a  # charged: it must run first
    assert table.next_for(frozenset({"b"})) is other_b
    assert table.next_for(frozenset({"c"})) is None
    table.move(started_a, Phase.GONE)
    assert table.next_for(frozenset({"a", "b"})) is claimed_a  # else the best
    assert dict(table.by_type(Phase.IN_HAND)) == {"a": 1, "b": 1}
    table.move(claimed_a, Phase.STARTING)
    assert dict(table.by_type(Phase.IN_HAND)) == {"b": 1} and list(table.hand) == [other_b]
    assert dict(table.by_type(Phase.STARTING)) == {"a": 1} and len(table) == 2


def test_an_attempt_put_back_goes_first_and_keeps_its_times() -> None:
    table = Attempts()
    later = table.add(lease(), Phase.IN_HAND, 5.0, window_end=9.0)
    back = table.add(lease(), Phase.IN_HAND, 2.0, window_end=7.5, first=True)
    assert list(table.hand) == [back, later]
    assert (back.renewed, back.taken, back.window_end) == (2.0, 2.0, 7.5)
    moving = brought_to(table, Phase.MOVING)
    table.move(moving, Phase.IN_HAND, first=True)  # dropped by its worker, for an idle one
    assert table.hand[0] is moving and moving.worker is None


def test_only_an_attempt_merely_claimed_keeps_a_rate_window_end() -> None:
    started = Attempts().add(lease("a", Status.RUNNING), Phase.IN_HAND, 1.0, window_end=3.0)
    assert started.window_end is None


def test_renewals_only_move_an_attempt_forward() -> None:
    table = Attempts()
    held = table.add(lease(), Phase.IN_HAND, 4.0)
    gone = lease()
    table.renew([held.lease, gone], 6.0)
    table.renew([held.lease], 5.0)  # an older heartbeat answered late
    assert held.renewed == 6.0 and held.taken == 4.0
    assert table.get(gone.token) is None


def test_attempts_are_listed_in_the_order_they_entered_their_phase() -> None:
    table = Attempts()
    first = table.add(lease(), Phase.IN_HAND, 1.0)
    second = table.add(lease(), Phase.IN_HAND, 1.0)
    table.move(second, Phase.RUNNING)
    table.move(first, Phase.RUNNING)
    assert table.held([]) == [second.lease, first.lease]
