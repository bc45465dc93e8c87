"""One turn's transaction: what its calls changed in memory follows the file."""

from __future__ import annotations

import asyncio

import pytest
from goqueue.supervisor.common.errors import StoreUnavailable
from goqueue.supervisor.store.sqlite.batch import Batch

pytestmark = pytest.mark.timeout(10)


def test_a_failed_transaction_undoes_its_calls_latest_first() -> None:
    loop = asyncio.new_event_loop()
    try:
        batch = Batch(loop)
        state = {"tat": 0}
        moves = []
        for tat in (1, 2, 3):  # three calls of one turn move the same key on
            was = state["tat"]
            state["tat"] = tat
            moves.append(was)
            batch.undo.append(lambda was=was: state.update(tat=was))
        waiter = batch.commit_waiter()
        batch.fail(StoreUnavailable("full"))
        assert state == {"tat": 0}  # as before the turn, whatever the order they ran in
        assert isinstance(waiter.exception(), StoreUnavailable)
    finally:
        loop.close()


def test_a_call_rolled_back_alone_undoes_only_itself() -> None:
    loop = asyncio.new_event_loop()
    try:
        batch = Batch(loop)
        undone: list[str] = []
        batch.undo.append(lambda: undone.append("first"))
        mark = len(batch.undo)
        batch.undo.append(lambda: undone.append("second"))
        batch.undo_since(mark)  # the second call's savepoint was rolled back
        assert undone == ["second"]
        batch.commit_done()  # the first call's change is in the file: nothing to undo
        batch.fail(StoreUnavailable("late"))
        assert undone == ["second"]
    finally:
        loop.close()
