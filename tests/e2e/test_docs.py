"""The docs and deploy files, checked against the code as a user would follow them.

The docs are README.md, the pages of the site under `docs/` and `deploy/README.md`. The
options table (in the configuration page) and `deploy/goqueue.example.toml` are generated
from the code and must equal what the generator prints; every command, flag, path,
environment variable and config key the docs name must exist; the compose, Kubernetes
and systemd files must pass only options the node accepts. Routes and HTTP examples are
checked against a real app in `tests/e2e/api/test_docs_api.py`.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import inspect
import io
import json
import re
import signal
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
import yaml
from goqueue.api.cli import jobs as client
from goqueue.api.cli import main as cli
from goqueue.client import calls
from goqueue.supervisor.common.enums import EventKind
from goqueue.supervisor.common.jobs import DEFAULT_PRIORITY, DEFAULT_QUEUE, JobSpec
from goqueue.supervisor.settings import config
from goqueue.supervisor.settings import reference as config_docs

from tests.conftest import free_port, request, wait_for
from tests.doctext import (
    DEPLOY_README,
    DOCS,
    README,
    ROOT,
    SITE,
    USER_DOCS,
    Block,
    Command,
    blocks,
    code_in,
    commands,
    prose,
    shell_command,
    spans,
    table,
    the_table,
)

pytestmark = pytest.mark.timeout(60)

DEPLOY = ROOT / "deploy"
EXAMPLE_TOML = DEPLOY / "goqueue.example.toml"
COMPOSE = DEPLOY / "compose.yaml"
K8S = DEPLOY / "k8s" / "goqueue.yaml"
UNIT = DEPLOY / "systemd" / "goqueue.service"
DOCKERFILE = DEPLOY / "Dockerfile"
DEPLOY_FILES = (EXAMPLE_TOML, COMPOSE, K8S, UNIT, DOCKERFILE)
OPTIONS_PAGE = SITE / "operations" / "configuration.md"  # holds the generated options table
REGENERATE = (
    "python -m goqueue.supervisor.settings.reference --update "
    f"{OPTIONS_PAGE.relative_to(ROOT)} {EXAMPLE_TOML.relative_to(ROOT)}"
)
USER_EXAMPLE_PREFIX = "myapp/"  # the docs' example of the user's own code
POSTGRESQL_SETTINGS = frozenset({"synchronous_commit"})  # named in prose, not GoQueue's


# -- shared readings ----------------------------------------------------------------------


def all_commands() -> list[Command]:
    """Every command in the shell blocks of the docs."""
    return [cmd for doc in DOCS for block in blocks(doc, "sh") for cmd in commands(block)]


def goqueue_commands() -> list[Command]:
    """Every `goqueue ...` the docs tell a user to run: blocks, inline spans, and the ones
    run inside a container (`docker compose exec node1 goqueue ...`)."""
    found = []
    for cmd in all_commands():
        argv = cmd.argv
        if argv[:3] == ["docker", "compose", "exec"]:
            argv = argv[4:]
        if argv and Path(argv[0]).name == "goqueue":
            found.append(Command(cmd.env, ["goqueue", *argv[1:]], cmd.text, cmd.where))
    for doc in DOCS:
        for span in spans(doc):
            if span.startswith("goqueue ") and "<" not in span:
                found.append(shell_command(span, f"{doc.name} (inline)"))
    return found


def parse(argv: list[str]) -> tuple[int | None, str]:
    """Parse a goqueue command line with the real parser: (exit code or None, stderr)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            cli.build_parser().parse_args(argv)
        except SystemExit as exc:
            return int(exc.code or 0), err.getvalue()
    return None, err.getvalue()


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The subcommands of a parser, by name."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def walk(
    parser: argparse.ArgumentParser, prefix: str = "goqueue"
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """Every command path (`goqueue dlq list`) and its parser, leaves and inner nodes."""
    yield prefix, parser
    for name, sub in subparsers(parser).items():
        yield from walk(sub, f"{prefix} {name}")


def all_flags() -> set[str]:
    """Every option string of every goqueue command."""
    return {
        flag
        for _, parser in walk(cli.build_parser())
        for action in parser._actions
        for flag in action.option_strings
    }


def known_env_names() -> set[str]:
    """The variables GoQueue reads: every option's, and the clients' own."""
    names = {env for option in config.OPTIONS for env in option.envs}
    names |= set(re.findall(r'os\.environ\.get\("([A-Z_]+)"\)', inspect.getsource(client)))
    names |= {calls.URL_ENV, *calls.KEY_ENVS}
    return names


def settings_from_env(env: dict[str, str], where: str) -> config.Settings:
    """The settings a node would start with from these variables (and nothing else)."""
    unknown = {name for name in env if name.startswith("GOQUEUE_")} - known_env_names()
    assert not unknown, f"{where}: unknown GoQueue variables {sorted(unknown)}"
    try:
        return config.load(None, env)
    except config.ConfigError as exc:
        raise AssertionError(f"{where}: a node would refuse these settings: {exc}") from None


def assert_serve_args(args: list[str], where: str) -> None:
    code, err = parse(["serve", *args])
    assert code is None, f"{where}: `goqueue serve {' '.join(args)}` is refused: {err}"


def seconds(text: str | int) -> float:
    """`45s`, `1m30s` or a number of seconds."""
    if isinstance(text, int):
        return float(text)
    total = 0.0
    for amount, unit in re.findall(r"(\d+(?:\.\d+)?)(h|m|s|ms)?", text):
        total += float(amount) * {"h": 3600, "m": 60, "s": 1, "ms": 0.001, "": 1}[unit]
    return total


# -- options: one source, generated docs --------------------------------------------------


def test_options_table_is_the_generated_one() -> None:
    text = OPTIONS_PAGE.read_text(encoding="utf-8")
    page = OPTIONS_PAGE.relative_to(ROOT)
    assert config_docs.MARKDOWN_BEGIN in text, f"{page} lost its options table markers"
    committed = config_docs.replace_table(text, config_docs.options_markdown())
    assert committed == text, f"{page}'s options table is out of date: run `{REGENERATE}`"
    (holder, _) = the_table("flag")  # and it is the only options table users read
    assert holder == OPTIONS_PAGE, holder


def test_example_config_is_the_generated_one() -> None:
    committed = EXAMPLE_TOML.read_text(encoding="utf-8")
    assert committed == config_docs.example_toml(), (
        f"{EXAMPLE_TOML.relative_to(ROOT)} is out of date: run `{REGENERATE}`"
    )


def test_example_config_names_every_key_and_loads_once_uncommented(tmp_path: Path) -> None:
    text = re.sub(r"^#(?=[a-z_\[])", "", EXAMPLE_TOML.read_text(encoding="utf-8"), flags=re.M)
    assert set(tomllib.loads(text)) == config.FILE_KEYS
    path = tmp_path / "goqueue.toml"
    path.write_text(text)
    settings = config.load(None, {"GOQUEUE_CONFIG": str(path)})
    assert settings.limits
    for option in config.OPTIONS:  # the file shows each default that is a value as it is
        default = config.default_of(option)
        if default is not None and option.name not in config.COMPUTED_DEFAULTS:
            assert getattr(settings, option.name) == default, option.name


def test_unedited_example_config_changes_nothing(tmp_path: Path) -> None:
    settings = config.load(None, {"GOQUEUE_CONFIG": str(EXAMPLE_TOML), "GOQUEUE_WORKERS": "1"})
    defaults = config.load(None, {"GOQUEUE_WORKERS": "1"})
    assert msgspec.structs.replace(settings, node_id="x") == msgspec.structs.replace(
        defaults, node_id="x", config=str(EXAMPLE_TOML)
    )


def test_config_keys_written_in_the_docs_exist(tmp_path: Path) -> None:
    """`shutdown_grace = 10` and the like, in prose and in TOML blocks, load as written."""
    snippets = [
        s
        for doc in DOCS
        for s in spans(doc)
        if re.fullmatch(r"[a-z_]+ = .+", s) and s.split()[0] not in POSTGRESQL_SETTINGS
    ]
    snippets += [block.text for doc in DOCS for block in blocks(doc, "toml")]
    assert snippets, "the docs show no config key at all?"
    for snippet in snippets:
        path = tmp_path / "snippet.toml"
        path.write_text(snippet + "\n")
        try:
            config.load(None, {"GOQUEUE_CONFIG": str(path)})
        except config.ConfigError as exc:
            raise AssertionError(f"the docs' config `{snippet}` is refused: {exc}") from None


# -- the command line ---------------------------------------------------------------------


def test_every_goqueue_command_in_the_docs_parses() -> None:
    found = goqueue_commands()
    assert len(found) > 20
    for cmd in found:
        argv = cmd.argv[1:]
        code, err = parse(argv)
        wanted = 0 if {"-h", "--help"} & set(argv) else None
        assert code == wanted, f"{cmd.where}: `{cmd.text}` is not a valid command: {err}"


def test_every_command_is_documented() -> None:
    documented = {" ".join(cmd.argv[:3]) for cmd in goqueue_commands()}
    documented |= {" ".join(cmd.argv[:2]) for cmd in goqueue_commands()}
    for path, parser in walk(cli.build_parser()):
        if path != "goqueue" and not subparsers(parser):
            assert path in documented, f"the docs never show `{path}`"


def test_flags_the_docs_name_exist() -> None:
    flags = all_flags()
    for doc in USER_DOCS:
        named = {
            word.split("=")[0]
            for span in spans(doc)
            if span.startswith("--")
            for word in span.split()
            if re.fullmatch(r"--[a-z][a-z0-9-]*(=\S*)?", word)
        }
        missing = sorted(named - flags)
        assert not missing, f"{doc.relative_to(ROOT)} names flags no goqueue command has: {missing}"
    assert any(s.startswith("--") for doc in USER_DOCS for s in spans(doc)), "no flag named?"


def test_serve_help_lists_every_flag_of_the_options_table() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "goqueue.api.cli.main", "serve", "--help"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    rows = table(OPTIONS_PAGE, "flag")
    flags = {word for row in rows for code in code_in(row[0]) for word in code.split()[:1]}
    assert "--node-id" in flags and "--public-reads" in flags
    for flag in flags:
        assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", out), flag
    for row in rows:
        for env in code_in(row[1]):
            assert env in known_env_names() or not env.isupper(), env


def test_env_names_in_docs_and_deploy_files_are_real() -> None:
    known = known_env_names()
    for path in (*DOCS, *DEPLOY_FILES):
        for name in re.findall(r"\bGOQUEUE_[A-Z0-9_]+\b", path.read_text(encoding="utf-8")):
            assert name in known, f"{path.relative_to(ROOT)} names {name}, which nothing reads"


def test_commands_with_environment_assignments_use_real_names() -> None:
    for cmd in [*all_commands(), *goqueue_commands()]:
        if cmd.argv and Path(cmd.argv[0]).name == "goqueue" and cmd.argv[1:2] == ["serve"]:
            settings_from_env(cmd.env, cmd.where)


def test_pip_only_ever_installs_into_a_virtualenv() -> None:
    """PEP 668 systems refuse `pip install` into the system Python."""
    venvs = [cmd.argv[3] for cmd in all_commands() if cmd.argv[:3] in (["python3", "-m", "venv"],)]
    for cmd in all_commands():
        if not cmd.argv or ("pip" not in Path(cmd.argv[0]).name and "pip" not in cmd.argv[:3]):
            continue
        tool = cmd.argv[0]
        assert any(tool.startswith(f"{venv}/bin/") for venv in venvs), (
            f"{cmd.where}: `{cmd.text}` does not use a virtualenv's pip"
        )


# -- the actor example, run as written ------------------------------------------------------


def actor_examples() -> list[Block]:
    """The docs' actor module (`# myapp/tasks.py`), wherever they show it."""
    return [
        block
        for doc in USER_DOCS
        for block in blocks(doc, "python")
        if block.text.startswith("# " + USER_EXAMPLE_PREFIX)
    ]


def test_the_docs_show_one_actor_module() -> None:
    """README's tour and the guide show the same module the other examples run against."""
    examples = actor_examples()
    assert {b.path for b in examples} >= {README, SITE / "guide" / "actors.md"}, examples
    assert len({b.text for b in examples}) == 1, [b.where for b in examples]


@pytest.mark.timeout(60)
def test_actor_example_runs_as_documented(tmp_path: Path) -> None:
    example = actor_examples()[0]
    first = example.text.splitlines()[0]
    assert first.startswith("# ") and first.endswith(".py")
    module_path = tmp_path / first[2:]
    module_path.parent.mkdir(parents=True)
    module_path.write_text(example.text)
    # run from the project's folder with nothing else on the import path, as users do
    runs = {tuple(c.argv): c for c in goqueue_commands() if "myapp.tasks" in c.argv}
    (run,) = runs.values()  # every page starts it the same way
    goqueue = Path(sys.executable).parent / "goqueue"  # the console script, as users run it
    port = free_port()
    argv = [str(goqueue), *run.argv[1:], "--host", "127.0.0.1", "--port", str(port)]
    log = tmp_path / "node.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [*argv, "--workers", "1"],
            cwd=tmp_path,
            env={"PATH": str(goqueue.parent), **run.env},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:

        def ready() -> bool:
            assert proc.poll() is None, f"node exited {proc.returncode}: {log.read_text()}"
            with contextlib.suppress(OSError):
                return request("GET", url + "/ready").status == 200
            return False

        wait_for(ready, timeout=30)
        job = request("POST", url + "/jobs", {"type": "email", "payload": {"to": "a@b.c"}})
        assert job.status == 201, job

        def finished() -> dict | None:
            found = request("GET", f"{url}/jobs/{job.body['id']}").body
            return found if found["status"] in ("done", "failed") else None

        done = wait_for(finished, timeout=20)
        assert done["status"] == "done" and done["result"] == {"sent_to": "a@b.c"}, done
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log.read_text()


# -- paths and the map of the code --------------------------------------------------------


def test_paths_the_docs_name_exist() -> None:
    """Repository paths in code spans and diagrams; names inside the layout table are
    relative to their row."""
    path_like = re.compile(r"[\w-]+(/[\w.*-]+)*/?")
    in_map = {name for row in the_table("folder")[1] for name in code_in(row[1])}
    for doc in DOCS:
        candidates = [s for s in spans(doc) if "/" in s and s not in in_map]
        for block in blocks(doc, "mermaid"):
            candidates += re.findall(r"[\w/]+\.py", block.text)
        for text in candidates:
            if not path_like.fullmatch(text) or text.startswith(USER_EXAMPLE_PREFIX):
                continue  # not a path in this repository (a route, a URL, a user's module)
            assert (ROOT / text).exists() or (doc.parent / text).exists(), (
                f"{doc.relative_to(ROOT)} names `{text}`, which does not exist"
            )


def test_readme_links_lead_somewhere() -> None:
    """README's links into the repository (the docs pages, the screenshot); the site's own
    links are checked by `mkdocs build --strict`."""
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", prose(README))
    local = [t for t in targets if "://" not in t]
    assert len(local) > 10, local
    missing = [t for t in local if not (ROOT / t).exists()]
    assert not missing, f"README.md links to {missing}, which do not exist"


def test_readme_stays_short() -> None:
    """The README is the front page; the guide, the operations and the internals are in
    docs/."""
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= 300, f"README.md has {lines} lines: move what is not the quick start to docs/"


def test_docs_speak_to_users_not_about_how_the_project_was_built() -> None:
    for path in (*DOCS, *DEPLOY_FILES, DEPLOY / "prometheus.yml", ROOT / "mkdocs.yml"):
        for word in re.findall(r"\b(issues?|seeds?|sessions?)\b", path.read_text(), re.I):
            raise AssertionError(f"{path.relative_to(ROOT)} speaks of {word!r}")
    for doc in DOCS:  # a year of the prose is the project's history (examples use 2030)
        for year in re.findall(r"\b20[12]\d\b", prose(doc)):
            raise AssertionError(f"{doc.relative_to(ROOT)} dates something: {year}")


# -- the HTTP reference the site generates -----------------------------------------------


def test_http_reference_covers_every_operation_and_schema() -> None:
    """The hook behind `reference/http.md` renders every route and schema of the node's
    OpenAPI document, with working links between them."""
    path = SITE / "hooks" / "openapi_reference.py"
    spec = importlib.util.spec_from_file_location("openapi_reference", path)
    assert spec is not None and spec.loader is not None
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    page = (SITE / hook.PAGE).read_text(encoding="utf-8")
    assert hook.MARKER in page, f"{hook.PAGE} lost the marker the reference replaces"
    doc = hook.document()
    text = hook.reference(doc)
    for route, item in doc["paths"].items():
        for method, op in item.items():
            assert f"### `{method.upper()} {route}` {{#{op['operationId']}}}" in text, route
            for param in op.get("parameters", []):
                assert f"| `{param['name']}`" in text, (route, param["name"])
    schemas = set(doc["components"]["schemas"])
    anchors = set(re.findall(r"\{#schema-([\w-]+)\}", text))
    assert anchors == {name.lower() for name in schemas}
    linked = set(re.findall(r"\]\(#schema-([\w-]+)\)", text))
    assert linked and linked <= anchors, sorted(linked - anchors)


# -- what the HTTP API section says about jobs --------------------------------------------


def test_job_fields_table_matches_the_job_schema() -> None:
    (_, schemas) = msgspec.json.schema_components([JobSpec])
    properties = schemas["JobSpec"]["properties"]
    (page, fields) = the_table("field")
    rows = {code_in(row[0])[0]: row for row in fields}
    assert set(rows) == set(properties), f"{page.name}: job fields differ from POST /jobs's"
    # Left out, queue and priority are the actor's, else the server's default.
    assert rows["queue"][1] == f"the actor's, else `{DEFAULT_QUEUE}`"
    assert rows["priority"][1] == f"the actor's, else `{DEFAULT_PRIORITY}`"
    priority = properties["priority"]["anyOf"][0]
    assert rows["priority"][2].startswith(
        f"{priority['minimum']} to {priority['maximum']}; higher runs first"
    )
    retries = properties["max_retries"]["anyOf"][0]
    assert f"{retries['minimum']} to {retries['maximum']}" in rows["max_retries"][2]
    text = "".join(prose(doc) for doc in USER_DOCS)
    assert "existing_id" in text and '{"error": ' in text


def test_metrics_table_lists_every_series_with_its_labels() -> None:
    from goqueue.supervisor.observe.metrics import Metrics, Tally, TallyHistogram
    from prometheus_client.metrics import MetricWrapperBase

    exported: dict[str, set[str]] = {}
    metrics = Metrics()
    for metric in [*vars(metrics).values(), *vars(metrics.loop).values()]:
        if isinstance(metric, Tally | TallyHistogram):  # counts built into families at scrape
            exported[metric.name + ("_total" if isinstance(metric, Tally) else "")] = set(
                metric.labels
            )
        elif isinstance(metric, MetricWrapperBase):
            # prometheus-client keeps a metric's name (a counter's without `_total`) and
            # label names privately; describing them publicly needs a sample of each
            name = metric._name + ("_total" if metric._type == "counter" else "")
            exported[name] = set(metric._labelnames)
    (page, series) = the_table("series")
    rows = {code_in(row[0])[0]: set(code_in(row[1])) for row in series}
    assert rows == exported, f"{page.name}'s metrics table differs from the series /metrics shows"


def event_names() -> set[str]:
    """The audit trail's event names: the one vocabulary every store writes them from."""
    return {kind.value for kind in EventKind}


def test_docs_list_every_audit_event() -> None:
    emitted = event_names()
    assert len(emitted) >= 5, (
        f"found only {sorted(emitted)} as event names: if events became an enum, read it here"
    )
    (paragraph,) = [
        p
        for doc in USER_DOCS
        for p in prose(doc).split("\n\n")
        if p.startswith("A job's audit trail")
    ]
    listed = {name for name in re.findall(r"`([a-z_]+)`", paragraph)}
    assert listed == emitted, (
        f"the docs' audit trail lacks {sorted(emitted - listed)}, "
        f"or names what is never written: {sorted(listed - emitted)}"
    )


# -- deploy files -------------------------------------------------------------------------


def test_compose_nodes_get_valid_settings_and_time_to_drain() -> None:
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    nodes = {name: s for name, s in services.items() if "build" in s or "goqueue" in s["image"]}
    assert set(nodes) == {"node1", "node2", "single"}  # a cluster, and one node on SQLite
    for name, service in nodes.items():
        where = f"compose.yaml {name}"
        env = {k: str(v) for k, v in service["environment"].items()}
        settings = settings_from_env(env, where)
        assert seconds(service["stop_grace_period"]) > settings.shutdown_grace, where
        if "command" in service:
            assert_serve_args(list(service["command"]), where)


def test_kubernetes_manifest_keeps_the_secret_the_docs_create() -> None:
    docs = list(yaml.safe_load_all(K8S.read_text()))
    secret = [c for c in all_commands() if c.argv[:3] == ["kubectl", "create", "secret"]]
    (create,) = secret
    name = create.argv[4]
    created = {a.split("=", 2)[1] for a in create.argv if a.startswith("--from-literal=")}
    overwritten = [d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"] == name]
    assert not overwritten, "applying the manifest would overwrite the Secret the docs create"
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    literal = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    from_secret = {
        e["name"]: e["valueFrom"]["secretKeyRef"] for e in container["env"] if "valueFrom" in e
    }
    settings = settings_from_env(
        {**literal, **{k: "postgresql://u@127.0.0.1/db" for k in from_secret if "DATABASE" in k}},
        "k8s",
    )
    for env_name, ref in from_secret.items():
        assert env_name in known_env_names(), env_name
        assert ref["name"] == name and (ref["key"] in created or ref.get("optional")), ref
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    drain = float(pre_stop[1]) + settings.shutdown_grace
    assert pod["terminationGracePeriodSeconds"] > drain
    assert_serve_args(list(container.get("args", [])), "k8s container args")


def test_systemd_unit_runs_what_the_steps_install() -> None:
    unit: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        if "=" in line and not line.startswith("#"):
            key, _, value = line.partition("=")
            unit.setdefault(key, []).append(value)
    steps = [c for block in blocks(DEPLOY_README, "sh") for c in commands(block)]
    venvs = [c.argv[3] for c in steps if c.argv[:3] == ["python3", "-m", "venv"]]
    created_dirs = {c.argv[-1] for c in steps if c.argv[:2] == ["install", "-d"]}
    installed = {c.argv[-1] for c in steps if c.argv[:1] == ["install"]}
    (exec_start,) = unit["ExecStart"]
    binary, *args = exec_start.split()
    assert binary in {f"{venv}/bin/goqueue" for venv in venvs}, binary
    assert args[0] == "serve"
    assert_serve_args(args[1:], "ExecStart")
    config_file = args[args.index("--config") + 1]
    assert config_file in installed, f"the steps never install {config_file}"
    env = dict(e.split("=", 1) for e in unit["Environment"])
    assert env["PYTHONPATH"] in created_dirs
    # the working directory holds the default store's file: the unit's own state directory
    (state,) = unit["StateDirectory"]
    assert unit["WorkingDirectory"] == [f"/var/lib/{state}"]
    assert unit["ProtectHome"] == ["yes"] and unit["LimitNOFILE"] == ["65536"]
    assert seconds(unit["TimeoutStopSec"][0]) > config.load(None, {}).shutdown_grace


def test_dockerfile_entrypoint_and_environment() -> None:
    text = DOCKERFILE.read_text()
    (entry,) = re.findall(r"^ENTRYPOINT (\[.*\])$", text, re.M)
    argv = json.loads(entry)
    assert argv[:2] == ["goqueue", "serve"]
    assert_serve_args(argv[2:], "Dockerfile ENTRYPOINT")
    instructions = "\n".join(line for line in text.splitlines() if not line.startswith("#"))
    env = dict(re.findall(r"\b(GOQUEUE_[A-Z_]+)=(\S+)", instructions))
    assert settings_from_env(env, "Dockerfile").host == "0.0.0.0"


def test_every_page_is_in_the_nav() -> None:
    def pages(node: object) -> Iterator[str]:
        if isinstance(node, str):
            yield node
        elif isinstance(node, list):
            for item in node:
                yield from pages(item)
        elif isinstance(node, dict):
            for value in node.values():
                yield from pages(value)

    class Loader(yaml.SafeLoader):
        """mkdocs.yml's `!!python/name:` tags read as nothing: only the nav matters here."""

    Loader.add_multi_constructor("", lambda loader, suffix, node: None)
    site = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=Loader)
    in_nav = set(pages(site["nav"]))
    written = {str(p.relative_to(SITE)) for p in SITE.rglob("*.md") if "hooks" not in p.parts}
    assert written - in_nav == set()
    assert site["validation"]["nav"]["omitted_files"] == "warn"  # so --strict fails on one


def test_every_screenshot_the_docs_show_is_made_by_a_ui_test() -> None:
    shown = set()
    for doc in [README, *SITE.rglob("*.md")]:
        shown |= set(re.findall(r"screenshots/([\w-]+)\.png", doc.read_text()))
    ui_tests = " ".join(p.read_text() for p in (ROOT / "tests" / "e2e" / "ui").glob("test_*.py"))
    made = set(re.findall(r'shot\("([\w-]+)", docs=', ui_tests))
    assert shown and shown <= made, shown - made
    kept = {p.stem for p in (SITE / "screenshots").glob("*.png")}
    assert kept == shown  # none stale, none missing


def test_the_typed_actors_example_has_the_forms_it_names() -> None:
    from goqueue import TypedActor
    from goqueue.actors.typed import Form

    (example,) = [
        b for b in blocks(SITE / "guide" / "actors.md", "python") if "# keyword form" in b.text
    ]
    names: dict[str, object] = {}
    exec(compile(example.text, str(example.path), "exec"), names)
    resize, place, send_email = names["resize"], names["place"], names["send_email"]
    assert isinstance(resize, TypedActor) and resize.signature.form is Form.KEYWORD
    assert place.signature.form is Form.STRUCT  # type: ignore[attr-defined]
    assert send_email.signature.form is Form.CLASSIC  # type: ignore[attr-defined]
    assert resize.payload(("https://example.com/a.png",), {"width": 64}) == {
        "url": "https://example.com/a.png",
        "width": 64,
    }
