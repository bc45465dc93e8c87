"""The PostgreSQL store's schema and statements, checked without a database: released
migrations pinned, the one schema-name rule (store and config), the statement table,
and row decoding in the generated column order."""

from __future__ import annotations

import hashlib
import re
from datetime import UTC, datetime
from itertools import product

import msgspec
import pytest
from goqueue.supervisor.common.errors import ConfigError
from goqueue.supervisor.common.jobs import AttemptError, Job, JobSpec
from goqueue.supervisor.common.reads import JobFilter
from goqueue.supervisor.settings import config, stores
from goqueue.supervisor.store.postgres import rows as pg_rows
from goqueue.supervisor.store.postgres.sql import schema as pg_schema
from goqueue.supervisor.store.postgres.sql.statements import (
    FILTER_COLUMNS,
    JOB_FIELDS,
    TEMPLATES,
    Sql,
    Statements,
)
from goqueue.supervisor.store.postgres.store import PostgresStore

pytestmark = pytest.mark.timeout(10)

# sha256 of each released migration's SQL, shared fragments substituted ({s} left for the
# schema), taken from the code before the store was split. A released step never
# changes: a new schema change is a new migration, whose hash is added here once released.
RELEASED = {
    1: "409ae8a062dc616edba7215488d944af5965a90819e5fa935c967a25d9262ffb",
    2: "e72e3632becb5eada56f75888acfe234cf1a68f7990a6eb8ef29f7196cf261a8",
    3: "8e49c4bd489f0063f3f584c8ae136744eef1851cdb1636c121f9b5b4d9cbd76c",
    4: "9e7fcf82ac0bc0b8f366b2f496655382caab3ac5175f65638c11c6c5c8cef2ca",
    5: "d8ebe6cb93e47fc0436b33c753331aa3a521c6103ee920641ce6f9b5c032d09a",
    6: "827c562afba3a0f3aa692bb2a82db54c82903ecaaf755bf033a52fc49b9b542c",
    7: "5ca85dd5888103dd93ac578d073df77b292cce8064667cc9eb87e56c381bd167",
    8: "1013138a1603d1645a10f3c7476aec6a329b954a8c35b8fcc8cd8100608f3410",
    9: "df6c3e9cb141f03d02e94fd78dfb877a0ad9626ca22ffa5b78bd3484c63dc4f5",
    10: "587715874c2ed65913a366e41ad152899e7ba0de75e08e1a29f2e05478fb83fb",
    11: "f9421be75b75b2c59f8d9b89213116fd46a769659ff71c489847f7ed67dfe2bd",
    12: "5760d3db61bdfa67b85f27e7629822ee1b2a1bc7b06dc0c1abab52aaa397c3a6",  # trace context
    13: "d31f12c466ac9e1ff64ef75fa123c09972a476f249c61de89fc7b5995a6fc5ad",  # workflows
    14: "1f3fab9be2a6342cea83dfd04bc72eb7c41e45abef327ba97f0eed9c8b7212ab",  # claim_leases
    15: "821ed28bdf912720ba82df7bbf3137bc16e4dcfe479b66709fa7aedb761fbf75",  # claim_floored
    16: "10a7d0099e9737017443456f4acba481d38cf7505f185a3495ac4668710b6ec2",  # flow keys
    17: "b17c4cde229cd2aab040e69d22f68683c96c51c187e6b83975aca734f47043e5",  # key probes
    18: "002be6bf7030073847a547ff4de1407b47d6020406c913468ba89908234c8a03",  # claim starts
    19: "0f1a1675590b82f5b0e25e918849d298880a88fac0e644bbfff6821cce57f632",  # past paused
    20: "8cd23c3319e47211d67502e35eb65df3878fb8def387497f5a67ae1361975b69",  # counts kept
    21: "e41492b094297f78724067d763162ae81f2edea7478a343870310513fe07faac",  # workflows kept
    22: "2608c4bf5be486e088f9c214bd38d92dc04c42bc83bc27736b618bbc82d4d1fc",  # dead tallied
    23: "290f6f59d92ca8bb71df096f4e494168cc5ed4b25f632ed4727f3b206c8760cd",  # events keyed
    24: "2aae9ebb33ec24367e925fe5f0ea5eefa479316f8dab429bed1a96c449026f1e",  # dead grouped
}


def test_released_migrations_never_change() -> None:
    steps = {step.version: step for step in pg_schema.MIGRATIONS}
    versions = [step.version for step in pg_schema.MIGRATIONS]
    assert versions == list(range(1, len(versions) + 1))
    assert set(RELEASED) == set(versions), "pin each new migration's hash once released"
    for version, digest in RELEASED.items():
        assert hashlib.sha256(steps[version].sql.encode()).hexdigest() == digest, version


# -- the schema name -------------------------------------------------------------------


def test_the_longest_schema_name_keeps_its_channel_within_postgresql_names() -> None:
    longest = "s" * stores.MAX_SCHEMA_NAME
    assert pg_schema.check_schema_name(longest) == longest
    assert len(stores.channel(longest).encode()) == 63  # NAMEDATALEN - 1
    with pytest.raises(ValueError, match="at most 55 characters"):
        pg_schema.check_schema_name(longest + "s")
    with pytest.raises(ValueError, match="at most 55"):
        PostgresStore("postgresql://127.0.0.1/x", "n", schema=longest + "s")


@pytest.mark.parametrize("name", ["", "1abc", "Upper", "a-b", "a b", "a\n", 'x"; DROP TABLE y'])
def test_a_schema_name_must_be_a_plain_lower_case_identifier(name: str) -> None:
    assert stores.schema_name_problem(name) is not None
    with pytest.raises(ValueError, match="invalid schema name"):
        pg_schema.check_schema_name(name)


def test_config_refuses_a_schema_name_one_over_the_limit_naming_the_option() -> None:
    longest = "g" * stores.MAX_SCHEMA_NAME
    assert config.load(None, {"GOQUEUE_DATABASE_SCHEMA": longest}).database_schema == longest
    with pytest.raises(ConfigError) as info:
        config.load(None, {"GOQUEUE_DATABASE_SCHEMA": longest + "g"})
    message = str(info.value)
    assert message.startswith("database_schema: must be at most 55 characters")
    assert "\n" not in message and "got 56" in message


# -- the statements --------------------------------------------------------------------


def test_every_statement_is_in_the_table_with_every_fragment_filled_in() -> None:
    assert set(TEMPLATES) == set(Sql)
    statements = Statements("gq_x")
    for name in Sql:
        text = statements[name]
        # outside SQL string literals: a webhook body's JSON has braces in its literals
        code = re.sub(r"'(?:[^']|'')*'", "''", text)
        assert "{" not in code and "}" not in code, name
        assert "gq_x" not in text.replace('"gq_x".', "").replace('"goqueue_gq_x"', ""), name


def test_the_job_columns_are_the_struct_fields_in_order() -> None:
    assert tuple(f.name for f in msgspec.structs.fields(Job)) == JOB_FIELDS
    columns = ", ".join(JOB_FIELDS)
    statements = Statements("gq_x")
    for name in (Sql.GET, Sql.LIST_JOBS, Sql.RETRY, Sql.BURY, Sql.RELEASE, Sql.CANCEL):
        assert f"SELECT {columns} FROM" in statements[name], name
    claimed = ", ".join(f"(c.o_job).{field}" for field in JOB_FIELDS)
    assert f"SELECT {claimed}, (c.o_job).lease_token" in statements[Sql.CLAIM]


def test_every_state_change_writes_its_events_in_the_same_statement() -> None:
    statements = Statements("gq_x")
    for name in (
        Sql.INSERT_JOB,
        Sql.ADD_JOB,
        Sql.ADD_JOBS,
        Sql.CLAIM,
        Sql.COMPLETE,
        Sql.COMPLETE_UNHOOKED,
        Sql.COMPLETE_MANY,
        Sql.COMPLETE_MANY_UNHOOKED,
        Sql.RETRY,
        Sql.BURY,
        Sql.RELEASE,
        Sql.CANCEL,
    ):
        assert 'INSERT INTO "gq_x".events' in statements[name], name


@pytest.mark.parametrize("used", list(product((False, True), repeat=len(FILTER_COLUMNS))))
def test_job_listings_bind_every_filter_they_use(used: tuple[bool, ...]) -> None:
    value = "x' OR true; --"  # never part of the statement: filters are bound
    chosen = dict(zip(FILTER_COLUMNS, used, strict=True))
    filters = JobFilter(**{column: value for column, on in chosen.items() if on})
    for text in Statements("gq_x").list_jobs(filters):
        assert value not in text
        bound = set(re.findall(r"(\w+) = %\((\w+)\)s", text))
        assert bound == {(column, column) for column, on in chosen.items() if on}
        assert ("WHERE" in text) == any(used)


# -- rows ------------------------------------------------------------------------------


def test_a_row_in_the_generated_column_order_decodes_to_the_job() -> None:
    at = datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC)
    template = JobSpec(type="next", payload=msgspec.Raw(b"[1]"))
    job = Job(
        id="00000000-0000-4000-8000-000000000001",
        type="t",
        queue="q",
        payload=msgspec.Raw(b'{"a": 1}'),
        priority=7,
        status="failed",
        attempts=2,
        max_retries=1,
        run_at=at,
        timeout_seconds=2.5,
        dedupe_key="d",
        webhook_url="http://127.0.0.1/hook",
        on_success=template,
        on_failure=None,
        parent_id="00000000-0000-4000-8000-000000000002",
        result=msgspec.Raw(b"null"),
        last_error="boom",
        errors=(AttemptError(attempt=2, error="boom", at=at),),
        created_at=at,
        started_at=at,
        finished_at=at,
        updated_at=at,
        seq=42,
    )
    stored = {  # what the database hands back: JSON columns undecoded
        "on_success": pg_rows.raw(template),
        "errors": pg_rows.raw(job.errors),
    }
    row = tuple(stored.get(name, getattr(job, name)) for name in JOB_FIELDS)
    assert pg_rows.job((*row, "token", "owner")) == job
