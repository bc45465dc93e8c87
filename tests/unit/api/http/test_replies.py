"""The API's deadline on store calls (`within`) and its mapping of store errors to
statuses: a read that hangs is a 503 (nothing happened), a write that hangs a 504 (it
may have been stored), so a client is never told a stored job was not."""

from __future__ import annotations

import asyncio
import json

import pytest
from goqueue.api.http.replies import OUTCOME_UNKNOWN, from_domain, within
from goqueue.supervisor.common.errors import OutcomeUnknown, StoreUnavailable

pytestmark = pytest.mark.timeout(10)


async def never_answers() -> int:
    await asyncio.Event().wait()  # set by no one: a store that hangs
    return 0


async def answers_after_a_wait() -> int:
    await asyncio.sleep(0)
    return 7


async def test_a_write_that_outlasts_the_deadline_has_an_unknown_outcome() -> None:
    with pytest.raises(OutcomeUnknown, match=r"did not answer within 0\.05 s"):
        await within(never_answers(), 0.05, writes=True)


async def test_a_read_that_outlasts_the_deadline_is_store_unavailable() -> None:
    with pytest.raises(StoreUnavailable, match=r"did not answer within 0\.05 s"):
        await within(never_answers(), 0.05)


async def test_a_call_answering_in_time_is_answered_whether_it_writes_or_not() -> None:
    assert await within(answers_after_a_wait(), 1.0, writes=True) == 7
    assert await within(answers_after_a_wait(), 1.0) == 7


async def test_a_store_error_passes_through_a_write_unchanged() -> None:
    async def refused() -> int:
        await asyncio.sleep(0)
        raise StoreUnavailable("down")

    with pytest.raises(StoreUnavailable, match="down"):
        await within(refused(), 1.0, writes=True)


def test_an_unknown_outcome_answers_504_telling_to_retry_with_the_idempotency_key() -> None:
    error = from_domain(OutcomeUnknown("the store did not answer within 10 s"))
    assert error is not None
    response = error.response()
    assert response.status == 504
    assert response.headers.get("Retry-After") is None  # a blind retry is what it warns of
    assert response.body is not None and isinstance(response.body, bytes)
    body = json.loads(response.body)
    assert body == {"error": OUTCOME_UNKNOWN, "details": {"header": "Idempotency-Key"}}
    assert "outcome is unknown" in body["error"]
    assert "retry with the same Idempotency-Key" in body["error"]
    assert "10 s" not in body["error"]  # the cause goes to the log, not to a client


def test_store_unavailable_still_answers_503_nothing_stored() -> None:
    error = from_domain(StoreUnavailable("PostgreSQL unavailable: connection refused"))
    assert error is not None and error.status == 503
    assert error.message == "the store is unavailable; retry later"
