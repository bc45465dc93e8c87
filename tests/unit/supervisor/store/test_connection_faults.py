"""Which database faults at start are the node's settings (stop: a restart of the
database would not cure them) and which are an outage (retry)."""

from __future__ import annotations

import psycopg
import pytest
from goqueue.supervisor.store.postgres.connection import misconfigured

REFUSED = 'connection failed: connection to server at "127.0.0.1", port 5432 failed: '


@pytest.mark.parametrize(
    ("error", "line"),
    [
        (f'{REFUSED}FATAL:  database "gq_x" does not exist', 'database "gq_x" does not exist'),
        (f'{REFUSED}FATAL:  role "bob" does not exist', 'role "bob" does not exist'),
        (
            f'{REFUSED}FATAL:  password authentication failed for user "bob"',
            'password authentication failed for user "bob"',
        ),
        (f'{REFUSED}FATAL:  no pg_hba.conf entry for host "1.2.3.4"', "no pg_hba.conf entry"),
        (f'{REFUSED}FATAL:  permission denied for database "test"', "permission denied"),
    ],
)
def test_a_refused_connection_naming_the_settings_is_misconfigured(error: str, line: str) -> None:
    said = misconfigured(psycopg.OperationalError(error))
    assert said is not None and said.startswith(line)


@pytest.mark.parametrize(
    "error",
    [
        "connection failed: Connection refused\n\tIs the server running on that host?",
        f"{REFUSED}FATAL:  the database system is starting up",
        f"{REFUSED}FATAL:  the database system is shutting down",
        f"{REFUSED}FATAL:  sorry, too many clients already",
        "connection timeout expired",
    ],
)
def test_an_outage_is_not_misconfigured(error: str) -> None:
    assert misconfigured(psycopg.OperationalError(error)) is None


def test_an_answer_with_a_sqlstate_is_judged_by_it() -> None:
    denied = psycopg.errors.InsufficientPrivilege("permission denied for schema gq")
    assert misconfigured(denied) == "permission denied for schema gq"
    assert misconfigured(psycopg.errors.InvalidPassword("bad password")) == "bad password"
    assert misconfigured(psycopg.errors.AdminShutdown("terminating connection")) is None
    assert misconfigured(psycopg.errors.TooManyConnections("too many")) is None
