"""The node's job types (`Catalog`): the deadline rule the dispatcher arms and
`GET /jobs/{id}` shows, with where each deadline comes from."""

from __future__ import annotations

import pytest
from goqueue.actors.protocol import ActorInfo
from goqueue.supervisor.common.catalog import Catalog
from goqueue.supervisor.common.jobs import Job, JobSpec, ResolvedSpec, resolve_spec, utcnow
from goqueue.supervisor.common.steps import WorkflowStep

pytestmark = pytest.mark.timeout(10)

CATALOG = Catalog([ActorInfo("slow", timeout=90.0), ActorInfo("plain")], {})


def job(job_type: str, timeout: float | None = None) -> Job:
    spec = resolve_spec(JobSpec(type=job_type, timeout_seconds=timeout), CATALOG.actors.get)
    return Job.from_spec(spec, now=utcnow(), max_retries=spec.max_retries, parent_id=None)


@pytest.mark.parametrize(
    ("job_type", "own", "expected"),
    [
        ("slow", 5.0, (5.0, "job")),  # the job's own timeout wins
        ("slow", None, (90.0, "actor")),  # then its actor's
        ("plain", None, (30.0, "node")),  # then the node's default
        ("unknown", None, (30.0, "node")),  # a type this node does not know: the default
    ],
)
def test_the_deadline_is_the_jobs_then_its_actors_then_the_nodes(
    job_type: str, own: float | None, expected: tuple[float, str]
) -> None:
    assert CATALOG.deadline(job(job_type, own), 30.0) == expected


def test_resolved_retries_are_an_int_templates_included() -> None:
    declared = Catalog([ActorInfo("a", max_retries=7), ActorInfo("b")], {}).actors.get
    spec = JobSpec(type="a", on_success=JobSpec(type="b", on_failure=JobSpec(type="a")))
    resolved = resolve_spec(spec, declared)
    assert resolved.max_retries == 7
    assert resolved.on_success is not None and resolved.on_success.max_retries == 3
    assert resolved.on_success.on_failure is not None
    assert resolved.on_success.on_failure.max_retries == 7
    assert resolve_spec(JobSpec(type="a", max_retries=0), declared).max_retries == 0


def test_a_workflow_step_resolves_to_its_job_alone() -> None:
    step = WorkflowStep(key="k", type="a", after=["j"])
    resolved = resolve_spec(step, Catalog([ActorInfo("a", queue="q")], {}).actors.get)
    assert type(resolved) is ResolvedSpec
    assert (resolved.type, resolved.queue, resolved.max_retries) == ("a", "q", 3)
