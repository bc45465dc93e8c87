"""Chains and groups as the workflow bodies they send: step keys and `after`."""

from __future__ import annotations

import json

import goqueue


def steps(shape: goqueue.Chain | goqueue.Group) -> list[tuple[str, list[str]]]:
    body = json.loads(goqueue.client.workflows.as_workflow(shape).body())
    return [(job["key"], job["after"]) for job in body["jobs"]]


def test_a_task_names_its_step_and_the_rest_default_to_their_type() -> None:
    shape = goqueue.chain(goqueue.task("fetch", {"u": 1}, key="get"), "resize", "resize")
    assert steps(shape) == [("get", []), ("resize", ["get"]), ("resize-2", ["resize"])]


def test_a_chord_waits_for_every_member_by_key() -> None:
    shape = goqueue.group(
        [goqueue.task("report", key="eu"), goqueue.task("report", key="us")]
    ).then(goqueue.task("email", key="mail"))
    assert steps(shape) == [("eu", []), ("us", []), ("mail", ["eu", "us"])]
