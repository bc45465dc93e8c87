"""`@actor` declarations and loading actor modules."""

from __future__ import annotations

from pathlib import Path

import pytest
from goqueue.actors import ActorDefinitionError, actor, load_actors

pytestmark = pytest.mark.timeout(10)


def test_unknown_option_fails_at_import_with_a_suggestion() -> None:
    with pytest.raises(
        ActorDefinitionError, match=r"unknown option 'timout'; did you mean 'timeout'"
    ):
        actor("x", timout=3)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"timeout": 0}, "timeout must be a positive number"),
        ({"timeout": "5"}, "timeout must be a positive number"),
        ({"max_retries": -1}, "max_retries must be an integer >= 0"),
        ({"concurrency": 0}, "concurrency must be an integer >= 1"),
        ({"concurrency": True}, "concurrency must be an integer >= 1"),
        ({"queue": ""}, "queue must be 1-200 characters"),
        ({"queue": "has space"}, "queue must be 1-200 characters"),
        ({"queue": "mail\n"}, "queue must be 1-200 characters"),
        ({"queue": 3}, "queue must be 1-200 characters"),
        ({"priority": 11}, "priority must be an integer from 0 to 10"),
        ({"priority": -1}, "priority must be an integer from 0 to 10"),
        ({"priority": True}, "priority must be an integer from 0 to 10"),
    ],
)
def test_invalid_option_values_are_refused(options: dict, message: str) -> None:
    with pytest.raises(ActorDefinitionError, match=message):
        actor("x", **options)


def test_bare_decorator_and_bad_names_are_refused() -> None:
    with pytest.raises(ActorDefinitionError, match="with parentheses"):
        actor(lambda payload, ctx: None)  # type: ignore[arg-type]
    with pytest.raises(ActorDefinitionError, match="actor name"):
        actor("has space")(lambda payload, ctx: None)
    with pytest.raises(ActorDefinitionError, match="actor name"):
        actor("trailing\n")(lambda payload, ctx: None)


def test_name_defaults_to_the_function_name_and_options_are_kept() -> None:
    @actor(timeout=2.5, max_retries=0, concurrency=3)
    def resize(payload, ctx):
        return payload

    assert resize.name == "resize"
    assert resize.info().timeout == 2.5 and resize.info().concurrency == 3
    assert resize({"a": 1}, None) == {"a": 1}


def test_queue_and_priority_are_declared_defaults_for_its_jobs() -> None:
    @actor("mail", queue="outbox", priority=9, timeout=5, max_retries=2)
    def mail(payload, ctx):
        return None

    info = mail.info()
    assert (info.queue, info.priority) == ("outbox", 9)
    # What `send` fills in: the declaration, under the options a caller gives.
    assert mail.options({}) == {
        "queue": "outbox",
        "priority": 9,
        "timeout_seconds": 5,
        "max_retries": 2,
    }
    assert mail.options({"priority": 0, "queue": None})["priority"] == 0
    assert actor("bare")(lambda payload, ctx: None).options({"delay_seconds": 3}) == {
        "delay_seconds": 3
    }


def write_module(tmp_path: Path, name: str, body: str) -> None:
    (tmp_path / f"{name}.py").write_text(body)


def test_load_actors_collects_each_modules_actors(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))
    write_module(
        tmp_path,
        "mod_one",
        "from actors import actor\n@actor('one')\ndef one(p, c):\n    return 1\n"
        "@actor('two')\nasync def two(p, c):\n    return 2\n",
    )
    registry = load_actors(["mod_one"])
    assert sorted(registry) == ["one", "two"]
    assert registry["two"].is_async and not registry["one"].is_async


def test_a_module_without_actors_and_a_name_defined_twice_are_errors(
    tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))
    write_module(tmp_path, "mod_empty", "x = 1\n")
    write_module(tmp_path, "mod_a", "from actors import actor\n@actor('dup')\ndef f(p, c): ...\n")
    write_module(tmp_path, "mod_b", "from actors import actor\n@actor('dup')\ndef g(p, c): ...\n")
    with pytest.raises(ActorDefinitionError, match="defines no @actor"):
        load_actors(["mod_empty"])
    with pytest.raises(ActorDefinitionError, match="'dup' is defined twice"):
        load_actors(["mod_a", "mod_b"])
