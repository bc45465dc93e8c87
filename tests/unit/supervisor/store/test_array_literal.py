"""The PostgreSQL store's array parameters, sent as text (`rows.array_literal`): every
value reads back as itself, whatever a queue's name holds."""

from __future__ import annotations

from datetime import UTC, datetime

from goqueue.supervisor.store.postgres.rows import array_literal


def test_strings_are_quoted_so_no_name_is_read_as_null_or_split() -> None:
    names = ["a", "NULL", 'say "hi"', "back\\slash", "comma, {brace}", ""]
    assert array_literal(names) == (
        '{"a","NULL","say \\"hi\\"","back\\\\slash","comma, {brace}",""}'
    )


def test_none_times_and_integers_are_written_as_postgresql_reads_them() -> None:
    at = datetime(2026, 12, 7, 10, 0, 0, 123456, tzinfo=UTC)
    assert array_literal([None, at, 42]) == "{NULL,2026-12-07T10:00:00.123456+00:00,42}"
    assert array_literal([]) == "{}"
