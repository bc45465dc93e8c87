"""Job routes: enqueue (one or a batch), list, show, audit trail, cancel."""

from __future__ import annotations

import hashlib

from aiohttp import web
from goqueue.api.errors import STORE_TIMEOUT, ApiError, bad_request, from_domain, within
from goqueue.api.openapi import Header, operation
from goqueue.api.params import (
    FORCE,
    IDEMPOTENCY_HEADER,
    JOB_FILTERS,
    LIMIT,
    MAX_IDEMPOTENCY_KEY,
    OFFSET,
    QUEUE,
    STATUS,
    STRICT,
    TYPE,
    WAIT,
    check_spec,
    decode,
    idempotency_key,
    path_id,
    read_body,
)
from goqueue.api.schemas import (
    BATCH_DECODER,
    SPEC_DECODER,
    BatchItem,
    BatchRequest,
    BatchResponse,
    EventList,
    JobList,
    JobOut,
    job_out,
    reply,
)
from goqueue.api.state import EGRESS, ENGINE, SETTINGS
from goqueue.supervisor.errors import GoQueueError
from goqueue.supervisor.jobs import Enqueued, JobFilter, JobSpec
from goqueue.supervisor.vocab import Status

routes = web.RouteTableDef()

IDEMPOTENCY = Header(
    IDEMPOTENCY_HEADER,
    {"type": "string", "minLength": 1, "maxLength": MAX_IDEMPOTENCY_KEY},
    "repeat-safe enqueue: the same key and body answer the original job (200)",
)


@routes.post("/jobs")
@operation(
    body=JobSpec,
    responses={201: JobOut, 200: JobOut},
    errors=(409, 422, 503),
    headers=(IDEMPOTENCY,),
    query_params=(STRICT,),
)
async def enqueue(request: web.Request) -> web.Response:
    """Enqueue a job."""
    key = idempotency_key(request)
    strict = STRICT.parse(request.query)
    body = await read_body(request, request.app[SETTINGS].max_body_bytes)
    spec = decode(SPEC_DECODER, body)
    check_spec(spec, request.app[EGRESS])
    digest = hashlib.sha256(body).hexdigest() if key is not None else None
    engine = request.app[ENGINE]
    enqueued = await within(
        engine.enqueue(spec, idempotency_key=key, request_hash=digest, strict=strict)
    )
    job = enqueued.job
    if not enqueued.created:
        return reply(job_out(job))
    return reply(job_out(job), 201, {"Location": f"/jobs/{job.id}"})


@routes.post("/jobs/batch")
@operation(body=BatchRequest, responses={200: BatchResponse}, errors=(503,), query_params=(STRICT,))
async def enqueue_batch(request: web.Request) -> web.Response:
    """Enqueue up to 1000 jobs; each is answered on its own (201, 400, 409 or 503)."""
    if IDEMPOTENCY_HEADER in request.headers:  # refuse rather than silently not honour it
        raise bad_request(
            f"{IDEMPOTENCY_HEADER} is only supported on POST /jobs", header=IDEMPOTENCY_HEADER
        )
    strict = STRICT.parse(request.query)
    body = await read_body(request, request.app[SETTINGS].max_body_bytes)
    batch = decode(BATCH_DECODER, body)
    for index, spec in enumerate(batch.jobs):
        check_spec(spec, request.app[EGRESS], f"jobs[{index}].")
    answers = await within(request.app[ENGINE].enqueue_many(batch.jobs, strict=strict))
    return reply(BatchResponse([batch_item(i, a) for i, a in enumerate(answers)]))


def batch_item(index: int, answer: Enqueued | Exception) -> BatchItem:
    """One job's answer in a batch; an error the API cannot explain is re-raised (500)."""
    if isinstance(answer, Enqueued):
        return BatchItem(201, job=job_out(answer.job))
    error = from_domain(answer) if isinstance(answer, GoQueueError) else None
    if error is None:
        raise answer
    item = BatchItem(error.status, error=error.message)
    if error.details is not None:
        details = dict(error.details)
        if "field" in details:
            details["field"] = f"jobs[{index}].{details['field']}"
        item.details = details
    if error.existing_id is not None:
        item.existing_id = error.existing_id
    return item


@routes.get("/jobs")
@operation(responses={200: JobList}, query_params=JOB_FILTERS)
async def list_jobs(request: web.Request) -> web.Response:
    """List jobs, newest first, filtered by type, status and queue."""
    query = request.query
    filters = JobFilter(
        type=TYPE.parse(query), status=STATUS.parse(query), queue=QUEUE.parse(query)
    )
    limit, offset = LIMIT.parse(query), OFFSET.parse(query)
    engine = request.app[ENGINE]
    page = await within(engine.list_jobs(filters, limit, offset))
    jobs = [
        job_out(job, engine.progress(job.id) if job.status == Status.RUNNING else None)
        for job in page.items
    ]
    return reply(JobList(jobs, page.total, limit, offset))


@routes.get("/jobs/{id}")
@operation(responses={200: JobOut}, errors=(404, 503), query_params=(WAIT,))
async def get_job(request: web.Request) -> web.Response:
    """Show one job; with `wait`, once it has finished (or when the wait is over).

    A wait holds no worker and no database connection: the node answers when it records
    the job's outcome itself, and notices outcomes recorded elsewhere (another node on
    PostgreSQL) by reading the job again every half second."""
    job_id = path_id(request)
    wait = WAIT.parse(request.query)
    engine = request.app[ENGINE]
    if wait:
        job = await within(engine.wait(job_id, wait), wait + STORE_TIMEOUT)
    else:
        job = await within(engine.get(job_id))
    if job is None:
        raise ApiError(404, f"job {job_id} not found")
    return reply(job_out(job, engine.progress(job.id) if job.status == Status.RUNNING else None))


@routes.get("/jobs/{id}/events")
@operation(responses={200: EventList}, errors=(404, 503))
async def job_events(request: web.Request) -> web.Response:
    """Show a job's audit trail, oldest first."""
    job_id = path_id(request)
    engine = request.app[ENGINE]
    events = await within(engine.events(job_id))
    if not events and await within(engine.get(job_id)) is None:
        raise ApiError(404, f"job {job_id} not found")
    return reply(EventList(events))


@routes.delete("/jobs/{id}")
@operation(responses={200: JobOut}, errors=(404, 409, 503), query_params=(FORCE,))
async def cancel_job(request: web.Request) -> web.Response:
    """Cancel a pending job, or with force=true a running one (its worker is killed)."""
    job_id = path_id(request)
    force = FORCE.parse(request.query)
    job = await within(request.app[ENGINE].cancel(job_id, force))
    return reply(job_out(job))
