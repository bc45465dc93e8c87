"""Typed actors end to end: each form runs with converted arguments in a real worker; a
payload that does not fit is a 400 naming the field, with nothing stored, wherever a
job is made; /openapi.json publishes each typed schema; `.send(*args)` works from a
program; classic actors are unchanged."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import FIXTURES, Node, start_node, stop_node, wait_for

pytestmark = pytest.mark.timeout(90)

ORDER = {
    "id": "0b7c1c64-5bd8-4f0e-9a39-2bbd9b0a8d11",
    "items": [{"sku": "a", "quantity": 2}, {"sku": "b"}],
    "placed": "2026-12-06T03:00:00Z",
}


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    started = start_node(tmp_path_factory.mktemp("typed"), "--actors", "typedactors,testactors")
    yield started
    stop_node(started)


def run(node: Node, job_type: str, payload: Any) -> dict[str, Any]:
    job = node.enqueue(type=job_type, payload=payload)
    return node.wait_status(job["id"], "done", "failed")


def total(node: Node, job_type: str) -> int:
    return int(node.get(f"/jobs?type={job_type}&limit=1").body["total"])


def test_keyword_form_runs_with_converted_arguments_and_defaults(node: Node) -> None:
    job = run(node, "resize", {"url": "https://x/a.png", "when": "2026-12-06T03:00:00Z"})
    assert job["status"] == "done", job
    assert job["result"] == {
        "url": "https://x/a.png",
        "width": 100,
        "when": "datetime",
        "size": "Size.SMALL",
        "job_id": job["id"],
    }
    job = run(node, "resize", {"url": "u", "width": 7, "size": "large"})
    assert job["result"]["width"] == 7 and job["result"]["size"] == "Size.LARGE"
    job = run(node, "resize_async", {"url": "u"})
    assert job["result"] == {"url": "u", "width": 100, "job_id": job["id"]}


def test_struct_form_converts_the_payload_whole_and_the_result_as_annotated(node: Node) -> None:
    job = run(node, "order", ORDER)
    assert job["status"] == "done", job
    assert job["result"] == {"order": ORDER["id"], "total": 3, "at": "2026-12-06T03:00:00Z"}
    assert run(node, "point", {"x": 2, "y": 3})["result"] == ["Point", "5"]


def test_classic_actors_are_unchanged(node: Node) -> None:
    payload = {"anything": [1, "two", None], "width": "not checked"}
    job = run(node, "classic", payload)
    assert job["result"] == {"payload": payload, "type": "dict"}
    assert run(node, "classic", [1, 2])["result"] == {"payload": [1, 2], "type": "list"}
    assert run(node, "noop", "text")["result"] == "text"


@pytest.mark.parametrize(
    ("job_type", "payload", "field", "message"),
    [
        ("resize", {"url": "u", "width": "wide"}, "payload.width", "Expected `int`, got `str`"),
        ("resize", {"width": 3}, "payload", "Object missing required field `url`"),
        ("resize", {"url": "u", "height": 3}, "payload", "Object contains unknown field `height`"),
        ("resize", {"url": "u", "when": "soon"}, "payload.when", "Invalid RFC3339"),
        ("resize", {"url": "u", "size": "huge"}, "payload.size", "Invalid enum value 'huge'"),
        ("resize", None, "payload", "Object missing required field `url`"),
        ("order", {**ORDER, "items": [{"quantity": 1}]}, "payload.items[0]", "missing"),
        ("order", {**ORDER, "id": "nope"}, "payload.id", "Invalid UUID"),
        ("point", {"x": 1}, "payload", "Object missing required field `y`"),
    ],
)
def test_a_misfit_is_a_400_naming_the_field_and_nothing_is_stored(
    node: Node, job_type: str, payload: Any, field: str, message: str
) -> None:
    before = total(node, job_type)
    resp = node.post("/jobs", {"type": job_type, "payload": payload})
    assert resp.status == 400, resp
    assert resp.body["details"]["field"] == field, resp.body
    assert resp.body["error"].startswith(f"{field}: ") and message in resp.body["error"], resp.body
    assert total(node, job_type) == before


MISFITS = [
    ({"url": "u", "width": "wide"}, "payload.width", "Expected `int`, got `str`"),
    ({"width": 3}, "payload", "Object missing required field `url`"),
    ({"url": "u", "height": 3}, "payload", "Object contains unknown field `height`"),
]


@pytest.mark.parametrize(("payload", "field", "message"), MISFITS)
def test_batch_items_are_checked_each_on_its_own(
    node: Node, payload: Any, field: str, message: str
) -> None:
    before = total(node, "resize")
    good = {"type": "resize", "payload": {"url": "u"}}
    bad = {"type": "resize", "payload": payload}
    resp = node.post("/jobs/batch", {"jobs": [good, bad]})
    assert resp.status == 200, resp
    first, second = resp.body["results"]
    assert first["status"] == 201
    assert second["status"] == 400, second
    assert second["details"]["field"] == f"jobs[1].{field}"
    assert message in second["error"]
    assert total(node, "resize") == before + 1


@pytest.mark.parametrize(("payload", "field", "message"), MISFITS)
def test_a_workflow_with_a_misfit_step_is_refused_whole(
    node: Node, payload: Any, field: str, message: str
) -> None:
    before = node.get("/workflows").body["total"]
    jobs_before = total(node, "resize")
    resp = node.post(
        "/workflows",
        {
            "name": "thumbs",
            "jobs": [
                {"key": "a", "type": "resize", "payload": {"url": "u"}},
                {"key": "b", "type": "resize", "payload": payload, "after": ["a"]},
            ],
        },
    )
    assert resp.status == 400, resp
    assert resp.body["details"]["field"] == f"jobs[1].{field}", resp.body
    assert message in resp.body["error"]
    assert node.get("/workflows").body["total"] == before
    assert total(node, "resize") == jobs_before


def test_a_chained_template_is_checked_at_enqueue(node: Node) -> None:
    before = total(node, "classic")
    template = {"type": "resize", "payload": {"url": "u", "width": "wide"}}
    resp = node.post("/jobs", {"type": "classic", "on_success": template})
    assert resp.status == 400, resp
    assert resp.body["details"]["field"] == "on_success.payload.width"
    assert total(node, "classic") == before


def test_ctx_enqueue_is_checked_too(node: Node) -> None:
    job = run(node, "spawner", {"url": "u", "width": "wide"})
    assert job["result"] == {"error": "payload.width: Expected `int`, got `str`"}, job
    job = run(node, "spawner", {"url": "u"})
    assert "id" in job["result"], job


def test_openapi_holds_each_typed_schema(node: Node) -> None:
    document = node.get("/openapi.json").body
    schemas = document["components"]["schemas"]
    resize = schemas["payload.resize"]
    assert resize["required"] == ["url"] and resize["additionalProperties"] is False
    assert set(resize["properties"]) == {"url", "width", "when", "size"}
    assert resize["properties"]["width"] == {"type": "integer", "default": 100}
    assert {"payload.order", "payload.point", "payload.resize_async"} <= set(schemas)
    assert "payload.classic" not in schemas
    body = document["paths"]["/jobs"]["post"]["requestBody"]["content"]["application/json"]
    variants = body["schema"]["oneOf"]
    assert {"$ref": "#/components/schemas/JobSpec.resize"} in variants
    typed = schemas["JobSpec.resize"]["properties"]
    assert typed["type"] == {"const": "resize"}
    assert typed["payload"] == {"$ref": "#/components/schemas/payload.resize"}
    order = schemas["payload.order"]["properties"]["items"]["items"]
    assert order == {"$ref": "#/components/schemas/payload.order.Item"}
    other = variants[-1]["properties"]["type"]["not"]["enum"]
    assert "resize" in other and "classic" not in other


def test_send_takes_the_handlers_own_arguments_from_a_program(node: Node, tmp_path: Path) -> None:
    program = textwrap.dedent(
        """
        import asyncio

        import goqueue
        from typedactors import resize, place, classic

        job = resize.send("https://x/b.png", width=64)
        print(job.id)
        job = resize.send_with_options(args=("https://x/c.png",), priority=9)
        print(job.id)
        print(classic.send({"k": 1}, priority=2).id)
        try:
            resize.send("u", "wide")
        except goqueue.BadRequest as exc:
            print("refused", exc.details["field"])


        async def main():
            async with goqueue.AsyncClient() as client:
                job = await resize.send_async_with_options(
                    args=("https://x/d.png",), kwargs={"width": 9}, client=client
                )
                print(job.id)

        asyncio.run(main())
        """
    )
    env = {**os.environ, "GOQUEUE_URL": node.url, "PYTHONPATH": str(FIXTURES)}
    out = subprocess.run(
        [sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stderr
    first, second, third, refused, fourth = out.stdout.split("\n")[:5]
    assert node.wait_status(first, "done")["result"]["width"] == 64
    job = node.wait_status(second, "done")
    assert job["priority"] == 9 and job["result"]["width"] == 100
    assert node.wait_status(third, "done")["priority"] == 2
    assert refused == "refused payload.width"
    assert node.wait_status(fourth, "done")["result"]["width"] == 9


def test_a_stored_job_that_no_longer_fits_after_a_reload_goes_to_the_dlq(
    tmp_path: Path,
) -> None:
    module = tmp_path / "shapeshift.py"
    module.write_text(
        "from goqueue import actor\n\n@actor('shift', max_retries=3)\n"
        "def shift(width: int) -> int:\n    return width\n"
    )
    reloading = start_node(tmp_path, "--actors", "shapeshift", "--path", str(tmp_path))
    try:
        assert reloading.post("/queues/held/pause").status == 200
        job = reloading.enqueue(type="shift", queue="held", payload={"width": 3})
        module.write_text(
            "from goqueue import actor\n\n@actor('shift', max_retries=3)\n"
            "def shift(width: str) -> str:\n    return width\n"
        )
        reloading.signal(signal.SIGHUP)
        # probes the old schema lets in wait in a paused queue of their own
        assert reloading.post("/queues/probe/pause").status == 200
        probe = {"type": "shift", "queue": "probe", "payload": {"width": 3}}
        wait_for(
            lambda: reloading.post("/jobs", probe).status == 400,
            timeout=20,
            what="the reload's new schema refusing an int",
        )
        assert reloading.post("/queues/held/resume").status == 200
        dead = reloading.wait_status(job["id"], "failed", timeout=20)
        assert dead["attempts"] == 1, dead
        assert "payload.width: Expected `str`, got `int`" in dead["last_error"], dead
        letters = reloading.get("/dlq").body
        assert [d["job_id"] for d in letters["dead_letters"]] == [job["id"]], letters
    finally:
        stop_node(reloading)


def test_a_schedule_whose_payload_does_not_fit_stops_the_node_at_start(tmp_path: Path) -> None:
    config = tmp_path / "goqueue.toml"
    config.write_text(
        '[[schedules]]\nname = "thumbs"\ntype = "resize"\nevery_seconds = 60\n'
        'payload = {url = "u", width = "wide"}\n'
    )
    refused = start_node(tmp_path, "--actors", "typedactors", "--config", str(config), wait=False)
    try:
        assert refused.proc.wait(timeout=30) != 0
    finally:
        if refused.proc.poll() is None:
            refused.proc.kill()
    line = next(x for x in refused.logs().splitlines() if "cannot start" in x)
    assert "schedule 'thumbs': payload.width: Expected `int`, got `str`" in line, line
