"""Workflow steps as clients send them and as a workflow shows them: the request, its
validation (`plan`: keys, parents, cycles), the record of a workflow with its steps'
statuses, and the one rule for a workflow's status. Shared by the API, the stores and
the Python client (no store here: a client imports it).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Annotated

import msgspec
from goqueue.supervisor.common.enums import TERMINAL, Status, WorkflowStatus
from goqueue.supervisor.common.errors import InvalidWorkflow
from goqueue.supervisor.common.jobs import JobSpec, Name

MAX_PARENTS = 1_000  # keys one step may wait for

StepKey = Name


class WorkflowStep(JobSpec, kw_only=True, forbid_unknown_fields=True, gc=False):
    """One step as a client sends it: a job spec, its key, the keys it waits for."""

    key: StepKey
    after: Annotated[list[StepKey], msgspec.Meta(max_length=MAX_PARENTS)] = msgspec.field(
        default_factory=list
    )

    def job_spec(self) -> JobSpec:
        """The step's job alone (without `key` and `after`)."""
        fields = {f: getattr(self, f) for f in JobSpec.__struct_fields__}
        return JobSpec(**fields)


class WorkflowRequest(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    """`POST /workflows`: a name and the steps (any order; `after` names the parents)."""

    name: Name
    jobs: list[WorkflowStep]


def plan(steps: Sequence[WorkflowStep]) -> list[int]:
    """The steps' indexes, parents before children; raises InvalidWorkflow naming the
    problem: no steps, a duplicate key, an unknown key in `after`, a cycle (its keys)."""
    if not steps:
        raise InvalidWorkflow("a workflow needs at least one step", "jobs")
    index: dict[str, int] = {}
    for i, step in enumerate(steps):
        if step.key in index:
            raise InvalidWorkflow(
                f"duplicate key {step.key!r} (also jobs[{index[step.key]}])", f"jobs[{i}].key"
            )
        index[step.key] = i
    children: list[list[int]] = [[] for _ in steps]
    unfinished = [0] * len(steps)
    for i, step in enumerate(steps):
        for n, parent in enumerate(dict.fromkeys(step.after)):
            if parent not in index:
                raise InvalidWorkflow(
                    f"after names unknown key {parent!r}", f"jobs[{i}].after[{n}]"
                )
            children[index[parent]].append(i)
            unfinished[i] += 1
    order = [i for i, n in enumerate(unfinished) if n == 0]
    for i in order:  # grows as it goes: Kahn's algorithm
        for child in children[i]:
            unfinished[child] -= 1
            if unfinished[child] == 0:
                order.append(child)
    if len(order) < len(steps):
        cycle = _a_cycle(steps, index, {i for i, n in enumerate(unfinished) if n})
        raise InvalidWorkflow(f"the steps form a cycle: {' -> '.join(cycle)}", "jobs")
    return order


def _a_cycle(steps: Sequence[WorkflowStep], index: dict[str, int], stuck: set[int]) -> list[str]:
    """The keys of one cycle among the `stuck` steps (each waits for another stuck one)."""
    seen: dict[int, int] = {}
    path: list[int] = []
    at = min(stuck)
    while at not in seen:
        seen[at] = len(path)
        path.append(at)
        at = next(index[k] for k in steps[at].after if index[k] in stuck)
    loop = path[seen[at] :]  # each waits for the next: read backwards, parents first
    ordered = [loop[0], *reversed(loop[1:]), loop[0]]
    return [steps[i].key for i in ordered]


class StepState(msgspec.Struct, gc=False):
    """One step of a workflow as it is now: its key, its current job, that job's status,
    the keys it waits for."""

    key: str
    id: str
    status: Status
    after: list[str] = msgspec.field(default_factory=list)


class Workflow(msgspec.Struct, kw_only=True, gc=False):
    """A stored workflow with its steps' live statuses (in creation order)."""

    id: str
    name: str
    status: WorkflowStatus
    created_at: datetime
    steps: list[StepState]


class WorkflowCounts(msgspec.Struct, gc=False):
    """For metrics: workflows by status (every status present), and steps waiting."""

    by_status: dict[str, int]
    steps_waiting: int


def workflow_status(cancelled: bool, statuses: Iterable[Status]) -> WorkflowStatus:
    """The one rule: cancelled as a whole; else running while any step is unfinished
    (a step that does not depend on a failure still runs, and a wait still waits); else
    failed when a step failed or was cancelled; else done."""
    if cancelled:
        return WorkflowStatus.CANCELLED
    failed = False
    for status in statuses:
        if status not in TERMINAL:
            return WorkflowStatus.RUNNING
        failed = failed or status in (Status.FAILED, Status.CANCELLED)
    return WorkflowStatus.FAILED if failed else WorkflowStatus.DONE


def dependent_error(failed_key: str) -> str:
    """The error of a step cancelled because one it depends on failed for good."""
    return f"cancelled: step {failed_key!r} it depends on failed"


WORKFLOW_CANCELLED = "cancelled: the workflow was cancelled"
