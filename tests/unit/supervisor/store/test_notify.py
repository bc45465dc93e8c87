"""The PostgreSQL channel's payloads: a new-work hint and a cancel, told apart."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from goqueue.supervisor.store.postgres.notify import Listener, Notifier, Wakeups, cancel_note
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


class Sent:
    """A Notifier's sends, kept; the clock a test moves by hand."""

    def __init__(self) -> None:
        self.notes: list[str] = []
        self.now = 100.0

    async def send(self, payload: str) -> None:
        self.notes.append(payload)

    def clock(self) -> float:
        return self.now


async def settled(notifier: Notifier) -> None:
    """Let the notifier's send task run."""
    for _ in range(3):
        await asyncio.sleep(0)


def test_a_node_alone_announces_no_work_but_announces_itself() -> None:
    async def body() -> None:
        sent = Sent()
        notifier = Notifier("a", sent.send, spacing=0, clock=sent.clock)
        notifier.counted(0, sent.clock())
        assert notifier.alone
        notifier.poke(None)
        await settled(notifier)
        assert sent.notes == []
        notifier.announce()
        await settled(notifier)
        assert sent.notes == ["a "]

    asyncio.run(body())


def test_a_node_that_hears_another_pokes_at_once_for_what_it_kept_quiet() -> None:
    async def body() -> None:
        sent = Sent()
        notifier = Notifier("a", sent.send, spacing=0, clock=sent.clock)
        notifier.counted(0, sent.clock())
        notifier.poke(None)  # committed while alone: nobody told
        notifier.heard()  # a node joined
        await settled(notifier)
        assert not notifier.alone
        assert sent.notes == ["a "]  # the newcomer is woken for it
        notifier.poke(None)
        await settled(notifier)
        assert sent.notes == ["a ", "a "]

    asyncio.run(body())


def test_a_count_of_none_taken_before_a_node_was_heard_is_not_believed() -> None:
    async def body() -> None:
        sent = Sent()
        notifier = Notifier("a", sent.send, spacing=0, clock=sent.clock)
        asked = sent.clock()
        sent.now += 1
        notifier.heard()  # heard after the heartbeat was sent, before its answer came
        notifier.counted(0, asked)
        assert not notifier.alone
        sent.now += 1
        notifier.counted(0, sent.clock())  # the next heartbeat's count stands
        assert notifier.alone
        notifier.counted(1, sent.clock())  # a node joined unheard: it is woken
        await settled(notifier)
        assert not notifier.alone
        assert sent.notes == ["a "]

    asyncio.run(body())
