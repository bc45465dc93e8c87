"""Which of a claim's jobs start at once: the best `start`, and those leading the claim
with a type that may start (`ClaimStarts`, the rule the stores share)."""

from __future__ import annotations

from goqueue.supervisor.store.base import ClaimStarts


def asked(starts: ClaimStarts, types: str) -> list[bool]:
    return [starts(t) for t in types]


def test_the_best_start_jobs_start_whatever_their_type() -> None:
    assert asked(ClaimStarts(2, frozenset()), "abc") == [True, True, False]
    assert asked(ClaimStarts(None, frozenset()), "abc") == [True, True, True]


def test_jobs_leading_the_claim_with_a_type_that_may_start_start_until_another_type() -> None:
    assert asked(ClaimStarts(0, frozenset("a")), "aaba") == [True, True, False, False]
    assert asked(ClaimStarts(1, frozenset("a")), "baa") == [True, False, False]
    assert asked(ClaimStarts(0, frozenset("ab")), "abab") == [True] * 4
