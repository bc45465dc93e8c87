"""The PostgreSQL channel's payloads: a new-work hint and a cancel, told apart."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from goqueue.supervisor.store.postgres.notify import Listener, Wakeups, cancel_note
from goqueue.supervisor.store.postgres.sql.statements import Statements


def listener(
    notes: list[tuple[str, datetime | None]], cancels: list[tuple[str, str, str]]
) -> Listener:
    return Listener(
        "postgresql://unused",
        Statements("goqueue"),
        {},
        lambda node, due: notes.append((node, due)),
        lambda: None,
        lambda node, token, job_id: cancels.append((node, token, job_id)),
    )


def test_a_cancel_note_reaches_on_cancel_with_its_token_and_job() -> None:
    notes: list[tuple[str, datetime | None]] = []
    cancels: list[tuple[str, str, str]] = []
    listener(notes, cancels)._dispatch(cancel_note("node-a", "tok-1", "job-1"))
    assert cancels == [("node-a", "tok-1", "job-1")]
    assert notes == []


def test_a_work_hint_still_reaches_on_note() -> None:
    notes: list[tuple[str, datetime | None]] = []
    cancels: list[tuple[str, str, str]] = []
    hear = listener(notes, cancels)
    hear._dispatch("node-a ")
    hear._dispatch("node-b 1900000000.5")
    assert notes == [("node-a", None), ("node-b", datetime.fromtimestamp(1900000000.5, UTC))]
    assert cancels == []


def test_a_due_time_past_before_anyone_asked_is_answered_once() -> None:
    wakeups = Wakeups(None, lambda: None, None)  # type: ignore[arg-type]  # neither is used
    past = datetime.now(UTC) - timedelta(seconds=1)
    wakeups.claimed(None, ["a"], [], past, short=True)  # the claim took longer than that
    assert wakeups.next_due_at() == past  # the dispatcher's timer wakes it at once
    assert wakeups.next_due_at() is None  # then not again: no spinning on a time past
