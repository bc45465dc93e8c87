"""Claim floors: raised by claims (keyed ones by what they say of unkeyed jobs), lowered
by work made pending, forgotten on a rescan, and kept apart for claims from different
queues."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import msgspec
from goqueue.supervisor.common.enums import Status
from goqueue.supervisor.common.jobs import Job, Lease
from goqueue.supervisor.store.postgres.floors import PRIORITIES, ClaimFloors

T0 = datetime(2026, 1, 1, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def job(
    seq: int, *, type_: str = "t", priority: int = 5, at: float = 0.0, key: str | None = None
) -> Job:
    return Job(
        id=f"j{seq}",
        type=type_,
        queue="default",
        payload=msgspec.Raw(b"null"),
        priority=priority,
        status=Status.PENDING,
        attempts=0,
        max_retries=0,
        run_at=T0 + timedelta(seconds=at),
        timeout_seconds=None,
        dedupe_key=None,
        webhook_url=None,
        on_success=None,
        on_failure=None,
        parent_id=None,
        result=None,
        last_error=None,
        errors=(),
        created_at=T0,
        started_at=None,
        finished_at=None,
        updated_at=T0,
        seq=seq,
        concurrency_key=key,
    )


def lease(j: Job) -> Lease:
    return Lease(job=j, token="tok", owner="a", expires_at=T0)


def floor_of(
    floors: ClaimFloors, type_: str, priority: int, queues: frozenset[str] | None = None
) -> tuple[datetime | None, int | None]:
    at, seq = floors.arrays(queues, [type_])
    return at[priority], seq[priority]


def test_no_floor_until_a_claim_takes_something() -> None:
    floors = ClaimFloors()
    at, seq = floors.arrays(None, ["t", "u"])
    assert at == [None] * 2 * PRIORITIES and seq == [None] * 2 * PRIORITIES


def test_a_claim_raises_the_floor_to_the_last_job_it_took() -> None:
    floors = ClaimFloors()
    floors.claimed(None, [lease(job(3, at=1)), lease(job(9, at=2)), lease(job(4, at=1))], [], None)
    assert floor_of(floors, "t", 5) == (T0 + timedelta(seconds=2), 9)
    assert floor_of(floors, "t", 6) == (None, None)  # other priorities untouched
    floors.claimed(None, [lease(job(1, at=0))], [], None)  # never lowered by a claim
    assert floor_of(floors, "t", 5) == (T0 + timedelta(seconds=2), 9)


def test_an_exhausted_type_rises_to_the_database_clock_less_the_slack() -> None:
    floors = ClaimFloors(slack=timedelta(seconds=1))
    now = T0 + timedelta(seconds=60)
    floors.claimed(None, [], ["t"], now)
    assert all(floor_of(floors, "t", p) == (now - timedelta(seconds=1), 0) for p in range(11))
    assert floor_of(floors, "u", 5) == (None, None)


def test_work_made_pending_lowers_every_floor_above_it() -> None:
    floors = ClaimFloors()
    floors.claimed(None, [lease(job(9, at=9))], [], None)
    floors.claimed(frozenset({"q"}), [lease(job(8, at=8))], [], None)
    floors.lower([job(2, at=1)])
    assert floor_of(floors, "t", 5) == (T0 + timedelta(seconds=1), 2)
    assert floor_of(floors, "t", 5, frozenset({"q"})) == (T0 + timedelta(seconds=1), 2)
    floors.lower([job(20, at=30)])  # above the floor: nothing to do
    assert floor_of(floors, "t", 5) == (T0 + timedelta(seconds=1), 2)


def test_floors_hold_only_for_claims_from_the_same_queues() -> None:
    floors = ClaimFloors()
    floors.claimed(frozenset({"x"}), [lease(job(9, at=9))], [], None)
    assert floor_of(floors, "t", 5, frozenset({"x"}))[1] == 9
    assert floor_of(floors, "t", 5, None) == (None, None)
    assert floor_of(floors, "t", 5, frozenset({"x", "y"})) == (None, None)


def test_every_floor_goes_on_a_rescan_and_on_a_reset() -> None:
    clock = Clock()
    floors = ClaimFloors(rescan=5.0, clock=clock)
    floors.claimed(None, [lease(job(9))], [], None)
    clock.now = 4.9
    assert floor_of(floors, "t", 5)[1] == 9
    clock.now = 5.0
    assert floor_of(floors, "t", 5) == (None, None)
    floors.claimed(None, [lease(job(9))], [], None)
    floors.reset()
    assert floor_of(floors, "t", 5) == (None, None)


def test_a_job_taken_by_key_raises_its_priority_and_those_above_to_the_clock() -> None:
    floors = ClaimFloors(slack=timedelta(seconds=1))
    now = T0 + timedelta(seconds=60)
    # unkeyed jobs of 4 and above come first in a key-ruled type's claim: none was left
    floors.claimed(None, [lease(job(7, priority=4, key="k"))], [], now)
    assert all(floor_of(floors, "t", p) == (now - timedelta(seconds=1), 0) for p in range(4, 11))
    assert all(floor_of(floors, "t", p) == (None, None) for p in range(4))


def test_a_type_limited_by_key_alone_is_one_a_short_claim_may_exhaust() -> None:
    floors = ClaimFloors()
    floors.declare(["t", "u"], ["u"])
    assert floors.key_only == {"t"}  # "u" is limited as a whole too: its claim may be cut


def test_the_floors_at_one_priority_are_the_claims_at_that_priority() -> None:
    floors = ClaimFloors()
    floors.claimed(None, [lease(job(3, at=1)), lease(job(9, at=2))], [], None)
    at, seq = floors.arrays(None, ["t", "u"])
    for priority in range(PRIORITIES):
        assert floors.at(None, ["t", "u"], priority) == (
            at[priority::PRIORITIES],
            seq[priority::PRIORITIES],
        )
    assert floors.at(None, ["t"], 5) == ([T0 + timedelta(seconds=2)], [9])
