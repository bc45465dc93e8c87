"""Workflows: jobs that run after other jobs (a DAG), created at once, released once.

A workflow is stored whole or not at all. Each step is an ordinary job with a `key`
unique in the workflow and the keys it waits for (`after`). A step with unfinished
parents is `waiting`: not claimable, not pending. The outcome of its last parent makes
it pending in the same atomic step (a counter of unfinished parents, decremented by
each parent's success). A step dead-lettered cancels every step depending on it; its
replay puts a fresh job in its place and makes those wait again.

The request, its validation and the records are in `common/steps.py`; this module holds
what the engine hands a store (`NewWorkflow`) and how it builds it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import msgspec
from goqueue.supervisor.common.errors import InvalidPayload, TooManyQueues, UnknownJobType
from goqueue.supervisor.common.jobs import JobSpec
from goqueue.supervisor.common.steps import (
    Workflow,
    WorkflowRequest,
    plan,
)
from goqueue.supervisor.store.base import NewJob


class NewStep(msgspec.Struct, kw_only=True, gc=False):
    """A step after the engine resolved its defaults; `after` holds keys of steps that
    come before it in `NewWorkflow.steps`."""

    key: str
    after: list[str]
    new: NewJob


class NewWorkflow(msgspec.Struct, kw_only=True, gc=False):
    """A workflow to store: its steps in order, parents first (`plan`)."""

    id: str
    name: str
    steps: list[NewStep]
    idempotency_key: str | None = None
    request_hash: str | None = None


class WorkflowCreated(msgspec.Struct, gc=False):
    """What storing a workflow did: the workflow, and whether this call created it (an
    Idempotency-Key repeated with the same request answers the first one)."""

    workflow: Workflow
    created: bool


Prepare = Callable[[JobSpec], Awaitable[NewJob]]


async def prepare_workflow(
    request: WorkflowRequest,
    prepare: Prepare,
    *,
    workflow_id: str,
    idempotency_key: str | None = None,
    request_hash: str | None = None,
) -> NewWorkflow:
    """The workflow to store: checked (`plan`), each step's defaults resolved by
    `prepare` (the engine's, which checks types and admits queues), in order, parents
    first. An unknown type, a bad payload or a queue refused is named under its step
    (`jobs[3].type`)."""
    order = plan(request.jobs)
    steps: list[NewStep] = []
    for i in order:
        step = request.jobs[i]
        try:
            new = await prepare(step.job_spec())
        except UnknownJobType as exc:
            raise UnknownJobType(exc.job_type, f"jobs[{i}].{exc.path}") from None
        except InvalidPayload as exc:
            raise InvalidPayload(exc.reason, f"jobs[{i}].{exc.field}") from None
        except TooManyQueues as exc:
            raise TooManyQueues(exc.limit, f"jobs[{i}].{exc.field}") from None
        steps.append(NewStep(key=step.key, after=list(dict.fromkeys(step.after)), new=new))
    return NewWorkflow(
        id=workflow_id,
        name=request.name,
        steps=steps,
        idempotency_key=idempotency_key,
        request_hash=request_hash,
    )
