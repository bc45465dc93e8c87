"""Leases in hand (`dispatch/in_hand.py`): order, what a worker takes, and their times."""

from __future__ import annotations

from datetime import UTC, datetime

from goqueue.supervisor.common.enums import Status
from goqueue.supervisor.common.jobs import Job, JobSpec, Lease
from goqueue.supervisor.dispatch.in_hand import Hand

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def lease(job_type: str, status: Status = Status.CLAIMED) -> Lease:
    job = Job.from_spec(JobSpec(type=job_type), now=NOW, max_retries=3)
    job.status = status
    return Lease(job=job, token=f"token-{job.id}", owner="node", expires_at=NOW)


def test_a_worker_takes_the_best_started_lease_of_its_types_before_a_claimed_one() -> None:
    hand = Hand()
    claimed_a, other_b, started_a = lease("a"), lease("b"), lease("a", Status.RUNNING)
    for held in (claimed_a, other_b, started_a):
        hand.add(held, 1.0)
    assert hand.next_for(frozenset({"a"})) is started_a  # charged: it must run first
    assert hand.next_for(frozenset({"b"})) is other_b
    assert hand.next_for(frozenset({"c"})) is None
    hand.remove(started_a)
    assert hand.next_for(frozenset({"a", "b"})) is claimed_a  # else the best
    assert dict(hand.by_type) == {"a": 1, "b": 1}
    hand.remove(claimed_a)
    assert dict(hand.by_type) == {"b": 1} and list(hand) == [other_b] and len(hand) == 1


def test_a_lease_put_back_goes_first_and_keeps_its_times() -> None:
    hand = Hand()
    later, back = lease("a"), lease("a")
    hand.add(later, 5.0, 9.0)
    hand.add(back, 2.0, 7.5, first=True)
    assert list(hand) == [back, later]
    assert (hand.renewed_at(back), hand.taken_at(back), hand.window_end(back)) == (2.0, 2.0, 7.5)


def test_only_a_lease_merely_claimed_keeps_a_rate_window_end() -> None:
    hand = Hand()
    started = lease("a", Status.RUNNING)
    hand.add(started, 1.0, 3.0)
    assert hand.window_end(started) is None


def test_renewals_only_move_a_lease_in_hand_forward() -> None:
    hand = Hand()
    held, gone = lease("a"), lease("a")
    hand.add(held, 4.0)
    hand.renew([held, gone], 6.0)
    hand.renew([held], 5.0)  # an older heartbeat answered late
    assert hand.renewed_at(held) == 6.0 and hand.taken_at(held) == 4.0
    assert hand.renewed_at(gone) == float("-inf") and hand.find(gone.token) is None
    assert hand.find(held.token) is held
