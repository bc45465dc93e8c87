"""The docs' HTTP API against a real app: the routes table matches the router (and so the
OpenAPI document), and the curl and client examples of README.md and every page under
`docs/` work when run as written."""

from __future__ import annotations

import argparse
import re
import uuid
from urllib.parse import parse_qsl, urlsplit

import pytest
import yaml
from goqueue.api.cli import main as cli

from tests.doctext import (
    DEPLOY_README,
    ROOT,
    USER_DOCS,
    Command,
    blocks,
    code_in,
    commands,
    prose,
    the_table,
)
from tests.e2e.api.conftest import ApiServer

pytestmark = pytest.mark.timeout(60)

DOCUMENTED_HOST = "localhost:8080"  # the node the docs' examples talk to


def openapi_operations(server: ApiServer) -> dict[tuple[str, str], dict]:
    """(METHOD, path template) -> operation, from the served OpenAPI document."""
    doc = server.get("/openapi.json").json
    return {
        (method.upper(), path): op
        for path, item in doc["paths"].items()
        for method, op in item.items()
    }


def documented_routes() -> dict[tuple[str, str], set[str]]:
    """(METHOD, path) -> query parameters, from the docs' "method, path" table."""
    routes: dict[tuple[str, str], set[str]] = {}
    (_, rows) = the_table("method, path")
    for row in rows:
        for code in code_in(row[0]):
            method, _, target = code.partition(" ")
            assert method.isupper() and target.startswith("/"), f"not a route: `{code}`"
            path, _, query = target.partition("?")
            names = {name for name, _ in parse_qsl(query, keep_blank_values=True)}
            routes[(method, path)] = names
    return routes


def test_routes_table_matches_the_router(api_server: ApiServer) -> None:
    operations = openapi_operations(api_server)
    documented = documented_routes()
    for (method, path), params in documented.items():
        op = operations.get((method, path))
        assert op is not None, f"the docs' API table names {method} {path}, which no route serves"
        query = {p["name"] for p in op["parameters"] if p["in"] == "query"}
        assert params <= query, f"{method} {path}: no query parameter {sorted(params - query)}"
    undocumented = sorted(f"{m} {p}" for m, p in set(operations) - set(documented))
    assert not undocumented, f"the docs' API table lacks a row for {undocumented}"


def test_error_shape_in_the_docs_matches_the_schema(api_server: ApiServer) -> None:
    doc = api_server.get("/openapi.json").json
    error = doc["components"]["schemas"]["Error"]["properties"]
    text = "".join(prose(page) for page in USER_DOCS)
    for name in error:
        assert f"`{name}`" in text or f'"{name}"' in text, f"the docs never mention `{name}`"


def test_probe_paths_are_served(api_server: ApiServer) -> None:
    gets = {path for method, path in openapi_operations(api_server) if method == "GET"}
    manifests = list(yaml.safe_load_all((ROOT / "deploy/k8s/goqueue.yaml").read_text()))
    (deployment,) = [d for d in manifests if d["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    probes = [container[k]["httpGet"]["path"] for k in container if k.endswith("Probe")]
    probes += re.findall(r"'(/\w+)'", (ROOT / "deploy/Dockerfile").read_text())
    assert len(probes) == 4 and set(probes) <= gets, probes


def _curl(server: ApiServer, cmd: Command, ids: dict[str, str]) -> tuple[int, bytes]:
    """Send what `curl` would for these arguments, to `server` instead of localhost:8080."""
    args = [_expand(arg, ids) for arg in cmd.argv[1:]]
    method, url, data = None, None, None
    headers: dict[str, str] = {}
    while args:
        arg = args.pop(0)
        if arg == "-s":
            continue
        if arg.startswith("-X"):
            method = arg[2:] or args.pop(0)
        elif arg == "-H":
            name, _, value = args.pop(0).partition(":")
            headers[name.strip()] = value.strip()
        elif arg == "-d":
            data = args.pop(0).encode()
            headers.setdefault("Content-Type", "application/x-www-form-urlencoded")
        else:
            assert url is None and not arg.startswith("-"), f"curl option {arg} not emulated"
            url = arg
    assert url is not None and url.startswith(DOCUMENTED_HOST), cmd.text
    target = urlsplit("http://" + url)
    path = target.path + (f"?{target.query}" if target.query else "")
    reply = server.request(method or ("POST" if data else "GET"), path, raw=data, headers=headers)
    return reply.status, reply.body


def _expand(arg: str, ids: dict[str, str]) -> str:
    for name, value in ids.items():
        arg = arg.replace(f"${name}", value)
    return arg


def _ids(server: ApiServer) -> dict[str, str]:
    """What the docs' $JOB_ID and $DEAD_ID stand for: a real job, an unknown letter."""
    job = server.post("/jobs", {"type": "report"})
    assert job.status == 201
    return {"JOB_ID": job.json["id"], "DEAD_ID": str(uuid.uuid4())}


def user_doc_commands() -> list[Command]:
    """Every command of the shell blocks in README.md and the site's pages."""
    return [cmd for doc in USER_DOCS for block in blocks(doc, "sh") for cmd in commands(block)]


def test_docs_curl_examples_work(api_server: ApiServer) -> None:
    ids = _ids(api_server)
    curls = [c for c in user_doc_commands() if c.argv[0] == "curl"]
    assert len(curls) >= 8
    for cmd in curls:
        status, body = _curl(api_server, cmd, ids)
        if "$DEAD_ID" in cmd.text:  # no dead letter exists: the route must still be found
            assert status == 404 and b"no route" not in body, (cmd.text, status, body)
        else:
            assert 200 <= status < 300, f"{cmd.where}: `{cmd.text}` answered {status}: {body!r}"


def test_docs_client_commands_work(
    api_server: ApiServer, capsys: pytest.CaptureFixture[str]
) -> None:
    ids = _ids(api_server)
    url = f"http://127.0.0.1:{api_server.port}"
    (commands_action,) = [
        a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction)
    ]
    client_commands = set(commands_action.choices) - {"serve", "migrate", "bench"}
    ran = 0
    for cmd in user_doc_commands():
        if cmd.argv[0] != "goqueue" or cmd.argv[1] not in client_commands:
            continue
        argv = [_expand(arg, ids) for arg in cmd.argv[1:]]
        code = cli.main([*argv, "--url", url])
        err = capsys.readouterr().err
        ran += 1
        if "$DEAD_ID" in cmd.text:
            assert code == 1 and "not found" in err, (cmd.text, err)
        else:
            assert code == 0, f"{cmd.where}: `{cmd.text}` exited {code}: {err}"
    assert ran >= 13


def test_deploy_readme_curls_only_documented_routes(api_server: ApiServer) -> None:
    gets = {path for method, path in openapi_operations(api_server) if method == "GET"}
    for block in blocks(DEPLOY_README, "sh"):
        for cmd in commands(block):
            if cmd.argv[0] == "curl":
                path = urlsplit("http://" + cmd.argv[-1]).path
                assert path in gets, cmd.text
