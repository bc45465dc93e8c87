"""The deploy files say what is true: the working directory is on the workers' import
path (a node proves it here), a derived image installs its dependencies as root and runs
as the image's user again, the build context leaves a checkout's virtualenv out, and the
Kubernetes section says how to reach the Service the manifest defines."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest

from tests.conftest import ROOT, Node

pytestmark = pytest.mark.timeout(60)

DEPLOY = ROOT / "deploy"
DOCKERFILE = DEPLOY / "Dockerfile"
UNIT = DEPLOY / "systemd" / "goqueue.service"
GUIDE = DEPLOY / "README.md"
K8S = DEPLOY / "k8s" / "goqueue.yaml"

ACTOR = """
from goqueue.actors import actor


@actor("from_cwd")
def from_cwd(payload, ctx):
    return {"imported": __name__}
"""


def test_the_working_directory_is_on_the_workers_import_path(
    make_node: Callable[..., Node], tmp_path
) -> None:
    (tmp_path / "cwd_actors.py").write_text(ACTOR)  # the node runs in tmp_path
    node = make_node("--actors", "cwd_actors", env={"PYTHONPATH": ""})
    job = node.enqueue(type="from_cwd")
    assert node.wait_status(job["id"], "done")["result"] == {"imported": "cwd_actors"}


@pytest.mark.parametrize("path", [DOCKERFILE, UNIT, GUIDE], ids=lambda p: p.name)
def test_no_deploy_file_says_the_working_directory_is_off_the_path(path) -> None:
    text = " ".join(path.read_text().replace("#", " ").split())
    assert "does not put its working directory" not in text
    assert "not put the working directory" not in text
    assert "working directory" in text and "first on its workers' import path" in text


@pytest.mark.parametrize("path", [DOCKERFILE, GUIDE], ids=lambda p: p.name)
def test_a_derived_image_installs_as_root_then_runs_as_the_images_user(path) -> None:
    lines = [line.lstrip("# ").strip() for line in path.read_text().splitlines()]
    start = lines.index("FROM goqueue")
    steps = lines[start : start + 8]
    root, pip = steps.index("USER root"), next(i for i, s in enumerate(steps) if "pip install" in s)
    back = steps.index("USER 10001:10001")
    assert root < pip < back
    assert "USER 10001:10001" in DOCKERFILE.read_text()  # the user it switches back to


def test_the_build_context_leaves_a_checkout_s_local_files_out() -> None:
    ignored = {
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert {".git", ".venv", "build", "dist", "**/__pycache__"} <= ignored
    assert {"deploy/.env", "**/goqueue.db*"} <= ignored  # a secret and a store stay out
    assert "COPY . /src" in DOCKERFILE.read_text()  # what the file keeps small


def test_the_guide_names_the_working_directories_the_files_set() -> None:
    workdir = re.search(r"^WORKDIR (\S+)$", DOCKERFILE.read_text(), re.M)
    unit_dir = re.search(r"^WorkingDirectory=(\S+)$", UNIT.read_text(), re.M)
    assert workdir is not None and unit_dir is not None
    text = " ".join(GUIDE.read_text().split())
    named = re.findall(r"working directory is `([^`]+)`|`([^`]+)` the working directory", text)
    named += re.findall(r"`([^`]+)` \(the working directory", text)
    paths = {p for match in named for p in (match if isinstance(match, tuple) else (match,)) if p}
    assert paths == {workdir[1], unit_dir[1]}, paths


def test_the_kubernetes_section_says_how_to_reach_the_service() -> None:
    manifest = K8S.read_text()
    service = manifest[manifest.index("kind: Service") :].split("---")[0]
    name = re.search(r"^\s+name: (\S+)$", service, re.M)
    port = re.search(r"^\s+port: (\d+)$", service, re.M)
    assert name and port
    guide = GUIDE.read_text()
    section = guide[guide.index("## Kubernetes") : guide.index("## systemd")]
    assert f"kubectl port-forward svc/{name[1]} {port[1]}:{port[1]}" in section
    assert f"http://{name[1]}.NAMESPACE.svc:{port[1]}" in section
    assert "/ui/" in section
