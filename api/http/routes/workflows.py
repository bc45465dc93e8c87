"""Workflow routes: create one (every step at once), show, list, cancel.

A workflow is checked whole before anything is stored: each step as `POST /jobs` checks
a job (its fields named `jobs[3].type`, as the batch endpoint names items), then the
graph (`plan`: duplicate or unknown keys, cycles). Any refusal stores nothing."""

from __future__ import annotations

import hashlib

import msgspec
from aiohttp import web
from goqueue.api.http.openapi import operation
from goqueue.api.http.params import (
    LIMIT,
    OFFSET,
    ChoiceParam,
    check_spec,
    decode,
    idempotency_key,
    path_id,
    read_body,
)
from goqueue.api.http.replies import ApiError, bad_request, reply, within
from goqueue.api.http.routes.jobs import IDEMPOTENCY
from goqueue.api.http.state import EGRESS, ENGINE, SETTINGS, STORE
from goqueue.api.http.strict import check_spec_text, check_utf8, request_digest
from goqueue.api.wire import WorkflowList, WorkflowOut, WorkflowRequest, workflow_out
from goqueue.supervisor.common.enums import WorkflowStatus

routes = web.RouteTableDef()

_DECODER = msgspec.json.Decoder(WorkflowRequest)
WORKFLOW_STATUS = ChoiceParam("status", tuple(WorkflowStatus), "only workflows in this status")
# The answer of POST /workflows leads to its live state, and to each step's job.
_CREATED_LINKS = {
    "GetWorkflow": {
        "operationId": "get_workflow",
        "parameters": {"id": "$response.body#/id"},
        "description": "The workflow with its steps' live statuses",
    },
    "GetFirstStep": {
        "operationId": "get_job",
        "parameters": {"id": "$response.body#/jobs/0/id"},
        "description": "A step's job (each `jobs[i].id` is one)",
    },
}


@routes.post("/workflows")
@operation(
    body=WorkflowRequest,
    responses={201: WorkflowOut, 200: WorkflowOut},
    errors=(408, 413, 422, 429, 503, 504),
    headers=(IDEMPOTENCY,),
    links={201: _CREATED_LINKS, 200: _CREATED_LINKS},
)
async def create_workflow(request: web.Request) -> web.Response:
    """Create a workflow: jobs that wait for others (`after`), stored all at once."""
    app = request.app
    settings = app[SETTINGS]
    key = idempotency_key(request)
    body = await read_body(request, settings.max_body_bytes, settings.body_timeout)
    check_utf8(body)
    wanted = decode(_DECODER, body)
    if len(wanted.jobs) > settings.max_workflow_jobs:
        raise ApiError(
            413,
            f"a workflow has at most {settings.max_workflow_jobs} steps "
            f"(--max-workflow-jobs), got {len(wanted.jobs)}",
            {"field": "jobs", "max_workflow_jobs": settings.max_workflow_jobs},
        )
    for i, step in enumerate(wanted.jobs):
        prefix = f"jobs[{i}]."
        check_spec(step, app[EGRESS], prefix)
        check_spec_text(step, prefix)
        for name in ("dedupe_key", "unique_key", "debounce_key"):
            if getattr(step, name) is not None:
                raise bad_request(
                    f"{name} is not allowed in a workflow step (its workflow is its key)",
                    field=prefix + name,
                )
    digest = _digest(wanted) if key is not None else None
    made = await within(
        app[ENGINE].submit_workflow(wanted, idempotency_key=key, request_hash=digest),
        writes=True,
    )
    out = workflow_out(made.workflow)
    if not made.created:
        return reply(out)
    return reply(out, 201, {"Location": f"/workflows/{out.id}"})


def _digest(wanted: WorkflowRequest) -> str:
    """The fingerprint an Idempotency-Key is held to: the name, and each step's key,
    parents and job as `POST /jobs` fingerprints one."""
    parts = [wanted.name] + [
        f"{s.key}\x00{','.join(s.after)}\x00{request_digest(s.job_spec())}" for s in wanted.jobs
    ]
    return hashlib.sha256("\x01".join(parts).encode()).hexdigest()


@routes.get("/workflows")
@operation(responses={200: WorkflowList}, query_params=(WORKFLOW_STATUS, LIMIT, OFFSET))
async def list_workflows(request: web.Request) -> web.Response:
    """List workflows, newest first."""
    status = WORKFLOW_STATUS.parse(request.query)
    limit, offset = LIMIT.parse(request.query), OFFSET.parse(request.query)
    chosen = None if status is None else WorkflowStatus(status)
    page = await within(request.app[STORE].list_workflows(chosen, limit, offset))
    items = [workflow_out(w) for w in page.items]
    return reply(WorkflowList(items, page.total, limit, offset))


@routes.get("/workflows/{id}")
@operation(responses={200: WorkflowOut}, errors=(404, 503))
async def get_workflow(request: web.Request) -> web.Response:
    """Show a workflow with its steps' live statuses."""
    workflow_id = path_id(request, "workflow")
    found = await within(request.app[STORE].get_workflow(workflow_id))
    if found is None:
        raise ApiError(404, f"workflow {workflow_id} not found")
    return reply(workflow_out(found))


@routes.delete("/workflows/{id}")
@operation(responses={200: WorkflowOut}, errors=(404, 409, 503, 504))
async def cancel_workflow(request: web.Request) -> web.Response:
    """Cancel a workflow: its waiting and pending steps end cancelled, running ones are
    killed."""
    workflow_id = path_id(request, "workflow")
    cancelled = await within(request.app[ENGINE].cancel_workflow(workflow_id), writes=True)
    return reply(workflow_out(cancelled))
