"""The SQLite claim's keys in turn (`KeysAhead`): read ahead over several claims, each
claim passing the keys up to the cursor, a lap ending at the cursor it began at, and
keys met after the lap began waiting for the next one."""

from __future__ import annotations

import sqlite3

import pytest
from goqueue.supervisor.store.sqlite.keyed import KeysAhead

pytestmark = pytest.mark.timeout(10)


class Jobs:
    """A jobs table with the index the key walk reads, counting its statements."""

    def __init__(self, keys: list[str]) -> None:
        self.conn = sqlite3.connect(":memory:")
        self.conn.execute(
            "CREATE TABLE jobs (seq INTEGER PRIMARY KEY, type TEXT, status TEXT,"
            " concurrency_key TEXT, priority INTEGER, run_at REAL)"
        )
        self.conn.execute(
            "CREATE INDEX jobs_key_due ON jobs (type, concurrency_key, priority DESC, run_at,"
            " seq) WHERE status = 'pending' AND concurrency_key IS NOT NULL"
        )
        self.add(keys)
        self.statements = 0
        self.conn.set_trace_callback(lambda _: self._count())

    def _count(self) -> None:
        self.statements += 1

    def add(self, keys: list[str]) -> None:
        for key in keys:
            self.conn.execute("INSERT INTO jobs VALUES (NULL, 't', 'pending', ?, 5, 0)", (key,))


def claim(ahead: KeysAhead, jobs: Jobs, cursor: str, n: int) -> list[str]:
    """The first `n` keys a claim after `cursor` is offered."""
    keys = ahead.keys(jobs.conn, "t", cursor)
    return [key for _, key in zip(range(n), keys, strict=False)]


def test_claims_take_keys_in_turn_reading_ahead_once() -> None:
    jobs = Jobs(list("abcdefgh"))
    ahead = KeysAhead(step=100)
    assert claim(ahead, jobs, "", 3) == list("abc")
    read = jobs.statements
    assert claim(ahead, jobs, "b", 3) == list("cde")  # the claim took a and b
    assert claim(ahead, jobs, "b", 3) == list("cde")  # it took nothing: the same keys
    assert claim(ahead, jobs, "e", 3) == list("fgh")
    assert jobs.statements == read  # all from the keys read ahead


def test_a_lap_ends_where_it_began_and_a_key_met_meanwhile_waits_for_the_next() -> None:
    jobs = Jobs(list("abcdef"))
    ahead = KeysAhead(step=2)  # a few keys at a time
    assert claim(ahead, jobs, "c", 10) == list("defabc")  # round to where it began
    jobs.add(["bb"])  # a new key between keys this lap has read
    assert claim(ahead, jobs, "f", 3) == list("abc")
    # that lap is over: the claim goes on into the next, which has the new key, and
    # offers each key once
    assert claim(ahead, jobs, "c", 10) == ["d", "e", "f", "a", "b", "bb", "c"]
