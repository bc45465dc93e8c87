"""`goqueue migrate`, run as a user runs it: the options load as for `serve`, and every
failure is one line on stderr with a non-zero exit, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from goqueue.supervisor.store.sqlite import schema as sqlite_schema
from psycopg.conninfo import make_conninfo

from tests.conftest import free_port, postgres_dsn

pytestmark = pytest.mark.timeout(60)

Run = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def migrate(tmp_path: Path) -> Run:
    """Run `goqueue migrate ARGS` with only the given GoQueue variables set."""

    def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        environ = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("GOQUEUE_") and k not in ("DATABASE_URL", "API_KEY")
        }
        return subprocess.run(
            [sys.executable, "-m", "goqueue.api.cli.main", "migrate", *args],
            env={**environ, **(env or {})},
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=45,
        )

    return run


@pytest.fixture
def dsn() -> str:
    return postgres_dsn()


@pytest.fixture
def schemas(dsn: str) -> Iterator[Callable[[], str]]:
    """Fresh schema names, dropped afterwards."""
    made: list[str] = []

    def fresh() -> str:
        made.append(f"gq_migrate_{uuid.uuid4().hex[:12]}")
        return made[-1]

    yield fresh
    with psycopg.connect(dsn, autocommit=True) as conn:
        for schema in made:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def schema_exists(dsn: str, schema: str) -> bool:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT count(*) FROM information_schema.schemata WHERE schema_name = %s", (schema,)
        ).fetchone()
    return bool(row and row[0])


def assert_one_clean_line(result: subprocess.CompletedProcess[str], *fragments: str) -> str:
    assert result.returncode != 0, result
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("goqueue migrate: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


@pytest.mark.postgres
def test_a_database_that_does_not_exist_is_one_line(migrate: Run, dsn: str) -> None:
    missing = make_conninfo(dsn, dbname=f"gq_nosuchdb_{uuid.uuid4().hex[:8]}")
    result = migrate("--database-url", missing)
    assert result.returncode == 1
    assert_one_clean_line(result, "does not exist")


def test_an_unreachable_port_is_one_line(migrate: Run) -> None:
    result = migrate("--database-url", f"postgresql://postgres@127.0.0.1:{free_port()}/x")
    assert result.returncode == 1
    assert_one_clean_line(result, "127.0.0.1", "refused")


def test_no_database_url_names_every_way_to_give_one(migrate: Run) -> None:
    result = migrate()
    assert result.returncode == 2
    assert_one_clean_line(result, "--database-url", "DATABASE_URL", "--config")


def test_bad_values_name_the_option_and_their_source(migrate: Run, tmp_path: Path) -> None:
    result = migrate("--database-url", "not a dsn")
    assert_one_clean_line(result, "database_url", "not a valid PostgreSQL DSN")
    result = migrate(
        env={"DATABASE_URL": "postgresql://u@127.0.0.1/db", "GOQUEUE_DATABASE_SCHEMA": "Bad-Name"}
    )
    assert_one_clean_line(result, "database_schema")
    result = migrate("--config", str(tmp_path / "missing.toml"))
    assert_one_clean_line(result, "config: cannot read")


@pytest.mark.postgres
def test_a_schema_name_the_store_refuses_is_one_line(migrate: Run, dsn: str) -> None:
    result = migrate("--database-url", dsn, "--database-schema", "s" * 60)
    assert_one_clean_line(result, "database_schema")


@pytest.mark.postgres
def test_migrates_the_schema_once_then_finds_it_up_to_date(
    migrate: Run, dsn: str, schemas: Callable[[], str]
) -> None:
    schema = schemas()
    first = migrate("--database-url", dsn, "--database-schema", schema)
    assert first.returncode == 0, first.stderr
    assert f"schema {schema!r}: applied migrations 1" in first.stdout
    assert schema_exists(dsn, schema)
    again = migrate("--database-url", dsn, "--database-schema", schema)
    assert again.returncode == 0 and f"schema {schema!r} is up to date" in again.stdout


@pytest.mark.postgres
def test_reads_flags_over_environment_over_config_file(
    migrate: Run, dsn: str, schemas: Callable[[], str], tmp_path: Path
) -> None:
    from_file, from_env, from_flag = schemas(), schemas(), schemas()
    path = tmp_path / "goqueue.toml"
    path.write_text(f'database_url = "{dsn}"\ndatabase_schema = "{from_file}"\nworkers = 2\n')
    assert migrate("--config", str(path)).returncode == 0
    assert (
        migrate(env={"GOQUEUE_CONFIG": str(path), "GOQUEUE_DATABASE_SCHEMA": from_env}).returncode
        == 0
    )
    result = migrate(
        "--config",
        str(path),
        "--database-schema",
        from_flag,
        env={"GOQUEUE_DATABASE_SCHEMA": from_env},
    )
    assert result.returncode == 0, result.stderr
    assert all(schema_exists(dsn, s) for s in (from_file, from_env, from_flag))


@pytest.mark.postgres
def test_plain_database_url_works_and_loses_to_the_goqueue_spelling(
    migrate: Run, dsn: str, schemas: Callable[[], str]
) -> None:
    schema = schemas()
    bad = f"postgresql://postgres@127.0.0.1:{free_port()}/x"
    result = migrate(
        env={"DATABASE_URL": bad, "GOQUEUE_DATABASE_URL": dsn, "GOQUEUE_DATABASE_SCHEMA": schema}
    )
    assert result.returncode == 0, result.stderr
    result = migrate(env={"DATABASE_URL": dsn, "GOQUEUE_DATABASE_SCHEMA": schema})
    assert result.returncode == 0 and "up to date" in result.stdout


# -- SQLite -------------------------------------------------------------------------------


def test_migrate_creates_then_finds_up_to_date_a_sqlite_file(migrate: Run, tmp_path: Path) -> None:
    first = migrate("--database-url", "sqlite:///jobs.db")
    every = ", ".join(str(v) for v in range(1, sqlite_schema.VERSION + 1))
    assert (first.returncode, first.stdout) == (
        0,
        f"SQLite file jobs.db: applied migrations {every}\n",
    )
    assert (tmp_path / "jobs.db").exists()
    again = migrate("--database-url", "sqlite:///jobs.db")
    assert (again.returncode, again.stdout) == (0, "SQLite file jobs.db is up to date\n")


def test_migrate_refuses_a_missing_folder_and_memory_in_one_line(migrate: Run) -> None:
    missing = migrate("--database-url", "sqlite:///nowhere/jobs.db")
    assert missing.returncode == 1
    assert missing.stderr == (
        "goqueue migrate: SQLite file nowhere/jobs.db: the folder nowhere does not exist\n"
    )
    memory = migrate("--database-url", "memory://")
    assert memory.returncode == 2 and memory.stderr.count("\n") == 1
