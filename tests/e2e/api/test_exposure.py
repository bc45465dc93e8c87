"""Open by default no more: a node binds loopback unless told, warns loudly (log, /ready,
metric) when it listens beyond it with no key, and the deploy files that do listen
beyond it take the key from a secret."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from goqueue.api.http.exposure import Exposure, is_loopback
from goqueue.supervisor.settings import config
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import Node

pytestmark = pytest.mark.timeout(60)

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.1.2.3", True),
        ("::1", True),
        ("::ffff:127.0.0.1", True),
        ("localhost", True),
        ("LOCALHOST", True),
        ("0.0.0.0", False),
        ("::", False),
        ("", False),
        ("10.0.0.5", False),
        ("fe80::1%eth0", False),
        ("no-such-host.invalid", False),  # cannot tell: assume reachable
    ],
)
def test_loopback_is_told_apart_from_every_other_address(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_the_default_bind_is_loopback_and_reads_need_the_key() -> None:
    settings = config.load(None, {})
    assert settings.host == "127.0.0.1" and not settings.public_reads
    assert not Exposure.of(settings).open
    assert Exposure.of(config.load(None, {"GOQUEUE_HOST": "0.0.0.0"})).open
    assert not Exposure.of(config.load(None, {"GOQUEUE_HOST": "0.0.0.0", "API_KEY": "k"})).open


def gauge(node: Node, name: str) -> float:
    text = node.get("/metrics").body
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return float(sample.value)
    raise AssertionError(f"{name} not exported")


def test_an_open_api_beyond_loopback_is_logged_shown_by_ready_and_exported(
    make_node: Callable[..., Node],
) -> None:
    # Listens on every interface for the test's few seconds; all traffic goes to 127.0.0.1.
    node = make_node("--host", "0.0.0.0", "--workers", "1")
    assert "THE API IS OPEN" in node.logs()
    ready = node.get("/ready")
    assert ready.status == 200  # a warning, not a failure: trusted networks exist
    assert ready.body["checks"]["auth"] is False
    assert "no API key" in ready.body["warnings"][0]
    assert gauge(node, "goqueue_api_open") == 1

    keyed = make_node("--host", "0.0.0.0", "--workers", "1", "--api-key", "k")
    assert "THE API IS OPEN" not in keyed.logs()
    ready = keyed.get("/ready")
    assert ready.status == 200 and ready.body["checks"]["auth"] is True
    assert "warnings" not in ready.body
    assert gauge(keyed, "goqueue_api_open") == 0
    assert keyed.get("/jobs").status == 401  # reads need the key too
    assert keyed.get("/jobs", headers={"X-API-Key": "k"}).status == 200

    local = make_node("--workers", "1")  # 127.0.0.1, no key: only this host can reach it
    assert local.get("/ready").body["checks"]["auth"] is True
    assert "THE API IS OPEN" not in local.logs()


def test_deploy_files_listen_beyond_loopback_only_with_a_key_from_a_secret() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    nodes = [s for s in compose["services"].values() if "build" in s]
    assert len(nodes) == 3  # node1 and node2 on PostgreSQL, `single` on its SQLite file
    for service in nodes:
        env = service["environment"]
        assert env["GOQUEUE_HOST"] == "0.0.0.0"
        # compose interpolation with `:?`: `docker compose up` fails without the variable
        assert env["API_KEY"].startswith("${GOQUEUE_API_KEY:?"), env["API_KEY"]
    docs = list(yaml.safe_load_all((DEPLOY / "k8s" / "goqueue.yaml").read_text()))
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["GOQUEUE_HOST"]["value"] == "0.0.0.0"
    key = env["API_KEY"]["valueFrom"]["secretKeyRef"]
    assert key["name"] == "goqueue" and not key.get("optional"), key
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert "GOQUEUE_HOST=0.0.0.0" in dockerfile
    unit = (DEPLOY / "systemd" / "goqueue.service").read_text()
    assert "\nLimitNOFILE=65536\n" in unit
