"""Settings: precedence across flags, environment, file and defaults; validation messages."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest
from goqueue.supervisor.common.errors import ConfigError
from goqueue.supervisor.settings import config
from goqueue.supervisor.settings import reference as config_docs
from goqueue.supervisor.settings.config import Settings

pytestmark = pytest.mark.timeout(30)

Flags = Callable[..., argparse.Namespace]


@pytest.fixture
def flags() -> Flags:
    """Parse a command line with the real `add_arguments` parser."""
    parser = argparse.ArgumentParser(exit_on_error=False)
    config.add_arguments(parser)

    def parse(*argv: str) -> argparse.Namespace:
        return parser.parse_args(list(argv))

    return parse


@pytest.fixture
def toml_file(tmp_path: Path) -> Callable[[str], str]:
    """Write a TOML file and return its path."""

    def write(text: str) -> str:
        path = tmp_path / "goqueue.toml"
        path.write_text(text)
        return str(path)

    return write


def test_defaults_without_any_source() -> None:
    settings = config.load(None, {})
    assert settings.port == 8080
    assert settings.host == "127.0.0.1"  # loopback unless told otherwise
    assert settings.workers >= 1
    assert settings.actors == ("goqueue.actors.examples",)
    assert settings.queues is None
    assert settings.database_url is None
    assert settings.kill_grace == 0.05
    assert settings.limits == {}
    assert settings.public_reads is False
    assert settings.max_queues == 10_000
    assert (settings.header_timeout, settings.keepalive_timeout) == (15.0, 75.0)
    assert settings.node_id and "-" in settings.node_id


def test_every_flag_defaults_to_none(flags: Flags) -> None:
    namespace = flags()
    assert all(value is None for value in vars(namespace).values())
    assert config.load(namespace, {}) == config.load(None, {})


def test_flag_beats_env_beats_file_beats_default(flags: Flags, toml_file) -> None:
    path = toml_file("workers = 3\nshutdown_grace = 7\nretry_base = 2.5\nmax_pending = 10\n")
    environ = {"GOQUEUE_CONFIG": path, "GOQUEUE_WORKERS": "5", "GOQUEUE_SHUTDOWN_GRACE": "9"}
    settings = config.load(flags("--workers", "8"), environ)
    assert settings.workers == 8  # flag over env and file
    assert settings.shutdown_grace == 9.0  # env over file
    assert settings.retry_base == 2.5  # file over default
    assert settings.max_pending == 10
    assert settings.retry_cap == 3600.0  # default
    assert settings.config == path


def test_config_flag_beats_config_env(flags: Flags, tmp_path: Path) -> None:
    chosen = tmp_path / "chosen.toml"
    chosen.write_text("port = 9001\n")
    ignored = tmp_path / "ignored.toml"
    ignored.write_text("port = 9002\n")
    settings = config.load(flags("--config", str(chosen)), {"GOQUEUE_CONFIG": str(ignored)})
    assert settings.port == 9001


def test_goqueue_spelling_beats_legacy_names() -> None:
    environ = {
        "DATABASE_URL": "postgresql://legacy/db",
        "GOQUEUE_DATABASE_URL": "postgresql://new/db",
        "API_KEY": "old",
        "GOQUEUE_API_KEY": "new",
    }
    settings = config.load(None, environ)
    assert settings.database_url == "postgresql://new/db"
    assert settings.api_key == "new"


def test_legacy_names_work_alone() -> None:
    settings = config.load(None, {"DATABASE_URL": "postgresql://x/y", "API_KEY": "k"})
    assert settings.database_url == "postgresql://x/y"
    assert settings.api_key == "k"


def test_empty_environment_value_counts_as_unset() -> None:
    assert config.load(None, {"GOQUEUE_PORT": "", "GOQUEUE_API_KEY": " "}).port == 8080


@pytest.mark.parametrize(
    ("environ", "fragments"),
    [
        ({"GOQUEUE_WORKERS": "abc"}, ["workers", "expected an integer", "'abc'"]),
        ({"GOQUEUE_WORKERS": "0"}, ["workers", "at least 1"]),
        ({"GOQUEUE_PORT": "70000"}, ["port", "at most 65535", "GOQUEUE_PORT"]),
        ({"GOQUEUE_PORT": "-1"}, ["port", "at least 0"]),
        ({"GOQUEUE_DEFAULT_TIMEOUT": "0"}, ["default_timeout", "greater than 0"]),
        ({"GOQUEUE_DEFAULT_TIMEOUT": "nan"}, ["default_timeout", "expected a number"]),
        ({"GOQUEUE_SHUTDOWN_GRACE": "-1"}, ["shutdown_grace", "at least 0"]),
        ({"GOQUEUE_LEASE_SECONDS": "0.5"}, ["lease_seconds", "at least 1"]),
        ({"GOQUEUE_LOG_LEVEL": "loud"}, ["log_level", "debug, info, warning, error"]),
        ({"GOQUEUE_PUBLIC_READS": "maybe"}, ["public_reads", "boolean"]),
        ({"GOQUEUE_MAX_QUEUES": "0"}, ["max_queues", "at least 1"]),
        ({"GOQUEUE_HEADER_TIMEOUT": "0"}, ["header_timeout", "greater than 0"]),
        ({"GOQUEUE_MAX_JOBS_PER_WORKER": "0"}, ["max_jobs_per_worker", "at least 1"]),
        ({"GOQUEUE_RETRY_BASE": "10", "GOQUEUE_RETRY_CAP": "5"}, ["retry_cap", "retry_base"]),
    ],
)
def test_bad_environment_values_name_the_option(environ: dict, fragments: list[str]) -> None:
    with pytest.raises(ConfigError) as caught:
        config.load(None, environ)
    for fragment in fragments:
        assert fragment in str(caught.value)


def test_bad_flag_value_names_the_flag(flags: Flags) -> None:
    with pytest.raises(
        ConfigError,
        match=r"workers: expected an integer N or a range MIN:MAX, got 'abc'.*--workers",
    ):
        config.load(flags("--workers", "abc"), {})


def test_wrong_type_in_file_is_rejected(toml_file) -> None:
    with pytest.raises(
        ConfigError, match=r"workers: expected an integer N or a range MIN:MAX, got 2\.5"
    ):
        config.load(None, {"GOQUEUE_CONFIG": toml_file("workers = 2.5\n")})
    with pytest.raises(ConfigError, match="public_reads"):
        config.load(None, {"GOQUEUE_CONFIG": toml_file("public_reads = 1\n")})
    with pytest.raises(ConfigError, match="port"):
        config.load(None, {"GOQUEUE_CONFIG": toml_file("port = true\n")})


def test_unknown_file_key_is_named(toml_file) -> None:
    path = toml_file("workers = 2\nshutdown-grace = 3\n")
    with pytest.raises(ConfigError, match=r"shutdown-grace: unknown option.*'shutdown_grace'"):
        config.load(None, {"GOQUEUE_CONFIG": path})


def test_missing_or_broken_file_is_a_config_error(toml_file, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config: cannot read"):
        config.load(None, {"GOQUEUE_CONFIG": str(tmp_path / "absent.toml")})
    with pytest.raises(ConfigError, match="not valid TOML"):
        config.load(None, {"GOQUEUE_CONFIG": toml_file("workers = [\n")})


def test_limits_from_file_and_flags_merge_per_type(flags: Flags, toml_file) -> None:
    path = toml_file('[limits]\nemail = 4\nreport = 2\n"billing.charge" = 1\n')
    settings = config.load(
        flags("--limit", "email=8", "--limit", "resize=3"), {"GOQUEUE_CONFIG": path}
    )
    assert settings.limits == {"email": 8, "report": 2, "billing.charge": 1, "resize": 3}
    assert config.load(None, {"GOQUEUE_CONFIG": path}).limits["email"] == 4


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--limit", "email"], "expected TYPE=N"),
        (["--limit", "email=0"], "email: must be at least 1"),
        (["--limit", "email=x"], "email: expected an integer"),
        (["--limit", "=3"], "empty"),
    ],
)
def test_bad_limit_flags(flags: Flags, argv: list[str], fragment: str) -> None:
    with pytest.raises(ConfigError, match="limits") as caught:
        config.load(flags(*argv), {})
    assert fragment in str(caught.value)


def test_bad_limits_in_file(toml_file) -> None:
    with pytest.raises(ConfigError, match="limits: email: must be at least 1"):
        config.load(None, {"GOQUEUE_CONFIG": toml_file("[limits]\nemail = 0\n")})
    with pytest.raises(ConfigError, match="limits: expected a table"):
        config.load(None, {"GOQUEUE_CONFIG": toml_file("limits = 3\n")})


def test_comma_lists_from_every_source(flags: Flags, toml_file) -> None:
    settings = config.load(flags("--queues", " high, low ,,"), {"GOQUEUE_ACTORS": "a.b,c"})
    assert settings.queues == ("high", "low")
    assert settings.actors == ("a.b", "c")
    path = toml_file('actors = ["x", "y"]\nwebhook_allow_hosts = "example.com,127.0.0.1"\n')
    from_file = config.load(None, {"GOQUEUE_CONFIG": path})
    assert from_file.actors == ("x", "y")
    assert from_file.webhook_allow_hosts == ("example.com", "127.0.0.1")


def test_booleans_and_numbers_parse(flags: Flags) -> None:
    for text, expected in [("1", True), ("YES", True), ("true", True), ("0", False), ("no", False)]:
        assert config.load(None, {"GOQUEUE_PUBLIC_READS": text}).public_reads is expected
    settings = config.load(
        flags("--no-public-reads", "--kill-grace", "0.2", "--port", "0", "--log-level", "DEBUG"),
        {"GOQUEUE_PUBLIC_READS": "yes"},
    )
    assert settings.public_reads is False
    assert settings.kill_grace == 0.2
    assert settings.port == 0
    assert settings.log_level == "debug"


def test_help_states_default_and_environment_variable() -> None:
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    text = " ".join(parser.format_help().split())
    for option in config.OPTIONS:
        assert option.flag in text
        assert option.env in text
    assert "GOQUEUE_SHUTDOWN_GRACE" in text and "default: 30" in text
    assert "or DATABASE_URL" in text
    assert "--limit TYPE=N" in text


def test_settings_validate_on_construction() -> None:
    with pytest.raises(ConfigError, match="workers"):
        Settings(workers=0)
    with pytest.raises(ConfigError, match="limits"):
        Settings(limits={"email": 0})


def test_reload_rereads_the_file_and_keeps_node_id(toml_file) -> None:
    path = toml_file("workers = 2\n[limits]\nemail = 1\n")
    environ = {"GOQUEUE_CONFIG": path}
    current = config.load(None, environ)
    Path(path).write_text("workers = 4\n[limits]\nemail = 6\n")
    fresh = config.reload(current, None, {**environ, "GOQUEUE_NODE_ID": "other"})
    assert (fresh.workers, fresh.limits) == (4, {"email": 6})
    assert fresh.node_id == current.node_id


def test_a_malformed_database_url_is_refused_naming_the_option() -> None:
    with pytest.raises(ConfigError, match="database_url: not a valid PostgreSQL DSN"):
        config.load(None, {"DATABASE_URL": "foo bar"})


def test_database_schema_must_be_an_identifier() -> None:
    with pytest.raises(ConfigError, match="database_schema"):
        config.load(None, {"GOQUEUE_DATABASE_SCHEMA": "x; drop table jobs"})


def test_retention_defaults_to_a_week_can_be_disabled_and_must_outlive_idempotency() -> None:
    assert config.load(None, {}).retention_seconds == 604_800
    assert config.load(None, {"GOQUEUE_RETENTION_SECONDS": "0"}).retention_seconds == 0
    with pytest.raises(ConfigError, match="retention_seconds: must be at least idempotency_ttl"):
        config.load(None, {"GOQUEUE_RETENTION_SECONDS": "60"})


# -- one source of defaults ---------------------------------------------------------------


def test_every_option_is_a_settings_field_with_a_documented_default() -> None:
    fields = {field.name: field for field in msgspec.structs.fields(config.Settings)}
    assert {option.name for option in config.OPTIONS} == set(fields) - {
        "limits",
        "schedules",
        "rate_limits",
        "key_limits",
        "key_rate_limits",
    }
    for option in config.OPTIONS:
        field = fields[option.name]
        computed = field.default_factory is not msgspec.NODEFAULT
        assert computed == (option.name in config.COMPUTED_DEFAULTS), option.name
        if not computed and field.default is None:
            assert option.optional and option.when_unset, f"{option.name}: unset means what?"
        assert config.describe_default(option)


def test_help_shows_the_default_settings_holds() -> None:
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    text = " ".join(parser.format_help().split())
    assert "(default: 30; env GOQUEUE_SHUTDOWN_GRACE)" in text
    assert "(default: 604800 (7 days); env GOQUEUE_RETENTION_SECONDS)" in text
    assert "(default: the CPU count; env GOQUEUE_WORKERS)" in text


def test_an_unset_default_must_say_what_unset_means() -> None:
    option = config.Option("queues", "list", "queues this node takes work from", optional=True)
    with pytest.raises(LookupError, match="queues"):
        config.describe_default(option)


def test_add_arguments_can_offer_a_subset() -> None:
    parser = argparse.ArgumentParser()
    config.add_arguments(parser, only=("database_url", "config"))
    dests = {action.dest for action in parser._actions} - {"help"}
    assert dests == {"database_url", "config"}
    namespace = parser.parse_args(["--database-url", "postgresql://u@127.0.0.1/db"])
    assert config.load(namespace, {}).database_url == "postgresql://u@127.0.0.1/db"


def test_update_rewrites_only_the_generated_parts(tmp_path: Path) -> None:
    page = tmp_path / "configuration.md"
    stale = f"{config_docs.MARKDOWN_BEGIN}\n| old |\n{config_docs.MARKDOWN_END}\n"
    page.write_text("# Title\n\n" + stale + "\nAfter.\n")
    toml = tmp_path / "example.toml"
    toml.write_text("stale = true\n")
    assert config_docs.update(page) and config_docs.update(toml)
    assert page.read_text() == "# Title\n\n" + config_docs.options_markdown() + "\nAfter.\n"
    assert toml.read_text() == config_docs.example_toml()
    assert not config_docs.update(page) and not config_docs.update(toml)
