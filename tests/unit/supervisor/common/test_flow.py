"""The flow-control rules every store's claim applies: keys' turns, limits and pace."""

from __future__ import annotations

from goqueue.supervisor.common.flow import KeyPace, KeyTurns
from goqueue.supervisor.common.rates import Rate


def test_turns_count_what_a_key_holds_and_refuse_a_key_at_its_limit() -> None:
    turns = KeyTurns({"a": 2}, {("a", "k"): 1})
    assert turns.turn("a", "k") == 1 and turns.turn("a", "m") == 0
    turns.take("a", "k")
    assert turns.turn("a", "k") is None  # 1 running + 1 taken: at its limit
    assert turns.turn("a", None) == 0  # no key: a key of its own
    turns.take("b", "k")  # no rule: the key has no limit, and takes turns all the same
    assert turns.turn("b", "k") == 1 and turns.room_of("b", "k") > 1000


def test_a_paced_key_starts_its_burst_then_one_per_interval() -> None:
    pace = KeyPace()
    rate = Rate(5, 1.0)
    turns = KeyTurns({}, {}, {"a": rate}, pace, now=100.0)
    for _ in range(5):
        assert turns.turn("a", "k") is not None
        turns.take("a", "k")
    assert turns.turn("a", "k") is None
    turns.settle()
    assert pace.due(100.0) == 101.0  # the next start, looked out for
    later = KeyTurns({}, {}, {"a": rate}, pace, now=101.0)
    assert later.room_of("a", "k") == 1


def test_the_next_start_is_looked_out_for_after_one_due_before_has_passed() -> None:
    pace = KeyPace()
    rate = Rate(5, 1.0)
    pace.took(("a", "k"), rate, 1, 100.0)  # due again at 100.2
    assert pace.starts(("a", "m"), rate, 100.0) == 5
    pace.took(("a", "k"), rate, 1, 100.3)  # the look-out of 100.2 has passed
    assert pace.due(100.3) == 100.5


def test_a_look_out_that_passed_before_anyone_asked_is_answered_once() -> None:
    pace = KeyPace()
    rate = Rate(5, 1.0)
    assert pace.starts(("a", "k"), rate, 100.0) == 5
    pace.took(("a", "k"), rate, 1, 100.0)  # may start again at 100.2
    # asked only at 100.25 (the claim took longer): still answered, so the dispatcher
    # wakes and claims; then forgotten, so it does not spin on a time past
    assert pace.due(100.25) == 100.2
    assert pace.due(100.26) is None


def test_a_keys_pace_is_forgotten_only_once_a_whole_period_has_passed() -> None:
    pace = KeyPace()
    rate = Rate(5, 1.0)
    pace.took(("a", "k"), rate, 5, 100.0)  # the burst: the next start at 101.0
    for n in range(1100):  # past the size that makes it forget what it may
        pace.took(("a", f"other-{n}"), rate, 1, 101.1)
    assert pace.starts(("a", "k"), rate, 101.1) == 1  # remembered: one start, not five
    pace.took(("a", "late"), rate, 1, 102.5)  # (forgets the spent ones)
    assert pace.starts(("a", "k"), rate, 102.5) == 5


def test_a_claim_undone_gives_its_keys_their_pace_and_cursors_back() -> None:
    pace = KeyPace()
    rate = Rate(2, 1.0)  # a start every 0.5 s, a burst of 2 once idle for a second
    cursors = {"a": "j"}
    first = KeyTurns({}, {}, {"a": rate}, pace, now=100.0, cursors=cursors)
    first.take("a", "k")
    first.settle()  # k's next start is at 100.5
    second = KeyTurns({}, {}, {"a": rate}, pace, now=101.0, cursors=cursors)
    second.places.update({("a", "k"): 1, ("a", "m"): 2})
    assert second.room_of("a", "k") == 2 and second.room_of("a", "m") == 2
    for key in ("k", "m", "m"):
        second.take("a", key)
    second.settle()
    assert cursors == {"a": "m"}
    assert KeyTurns({}, {}, {"a": rate}, pace, now=101.0).room_of("a", "k") == 0
    second.undo()  # its transaction failed: as after the first claim
    assert cursors == {"a": "j"}
    again = KeyTurns({}, {}, {"a": rate}, pace, now=101.0)
    assert again.room_of("a", "k") == 2 and again.room_of("a", "m") == 2
