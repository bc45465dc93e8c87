"""Job routes: enqueue (one or a batch), list, show, audit trail, cancel."""

from __future__ import annotations

import logging

from aiohttp import web
from goqueue.api.http.openapi import Header, operation
from goqueue.api.http.params import (
    CONCURRENCY_KEY,
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
    decode,
    decode_spec,
    idempotency_key,
    path_id,
    read_body,
)
from goqueue.api.http.replies import (
    BATCH_DECODER,
    BULK_CANCEL_DECODER,
    STORE_TIMEOUT,
    ApiError,
    BatchItem,
    BatchRequest,
    BatchResponse,
    BulkCancelled,
    BulkCancelRequest,
    EventList,
    JobList,
    JobOut,
    bad_request,
    from_domain,
    job_out,
    reply,
    within,
)
from goqueue.api.http.state import EGRESS, ENGINE, SETTINGS, STORE
from goqueue.api.http.strict import request_digest
from goqueue.api.wire import TimeoutOut
from goqueue.supervisor.common.bulk import CancelFilter
from goqueue.supervisor.common.catalog import Catalog
from goqueue.supervisor.common.enums import Status
from goqueue.supervisor.common.errors import GoQueueError
from goqueue.supervisor.common.jobs import Enqueued, Job, JobSpec
from goqueue.supervisor.common.reads import JobFilter

log = logging.getLogger("goqueue.api")

routes = web.RouteTableDef()

IDEMPOTENCY = Header(
    IDEMPOTENCY_HEADER,
    {
        "type": "string",
        "minLength": 1,
        "maxLength": MAX_IDEMPOTENCY_KEY,
        "pattern": "^[^\\u0000-\\u001f\\u007f]+\\Z",  # no control character (`strict.py`)
    },
    "repeat-safe enqueue: the same key and the same job (compared as parsed JSON, so "
    "spacing and key order do not matter) answer the original job (200); another job, 422",
)


@routes.post("/jobs")
@operation(
    body=JobSpec,
    responses={201: JobOut, 200: JobOut},
    errors=(408, 409, 422, 429, 503, 504),
    headers=(IDEMPOTENCY,),
    query_params=(STRICT,),
)
async def enqueue(request: web.Request) -> web.Response:
    """Enqueue a job."""
    app = request.app
    settings = app[SETTINGS]
    key = idempotency_key(request)
    strict = STRICT.parse(request.query) if request.query_string else STRICT.default
    body = await read_body(request, settings.max_body_bytes, settings.body_timeout)
    spec = decode_spec(body, app[EGRESS])
    digest = request_digest(spec) if key is not None else None
    engine = app[ENGINE]
    enqueued = await within(
        engine.enqueue(spec, idempotency_key=key, request_hash=digest, strict=strict),
        writes=True,
    )
    job = enqueued.job
    if not enqueued.created:
        return reply(_shown(request, job))
    return reply(_shown(request, job), 201, {"Location": f"/jobs/{job.id}"})


@routes.post("/jobs/batch")
@operation(
    body=BatchRequest,
    responses={200: BatchResponse},
    errors=(408, 503, 504),
    query_params=(STRICT,),
)
async def enqueue_batch(request: web.Request) -> web.Response:
    """Enqueue up to 1000 jobs; each is checked and answered on its own (201, 400, 409, 429,
    503 or 504): bad items do not keep the good ones out."""
    if IDEMPOTENCY_HEADER in request.headers:  # refuse rather than silently not honour it
        raise bad_request(
            f"{IDEMPOTENCY_HEADER} is only supported on POST /jobs", header=IDEMPOTENCY_HEADER
        )
    strict = STRICT.parse(request.query)
    settings = request.app[SETTINGS]
    body = await read_body(request, settings.max_body_bytes, settings.body_timeout)
    batch = decode(BATCH_DECODER, body)
    answers: list[BatchItem | None] = []
    specs: list[JobSpec] = []
    for index, raw in enumerate(batch.jobs):
        prefix = f"jobs[{index}]."
        try:
            spec = decode_spec(bytes(raw), request.app[EGRESS], prefix)
        except ApiError as exc:
            answers.append(refused_item(exc))
            continue
        specs.append(spec)
        answers.append(None)
    stored = iter(
        await within(request.app[ENGINE].enqueue_many(specs, strict=strict), writes=True)
        if specs
        else []
    )
    results = [
        answer if answer is not None else batch_item(index, next(stored))
        for index, answer in enumerate(answers)
    ]
    return reply(BatchResponse(results))


def refused_item(error: ApiError) -> BatchItem:
    """A batch item the API refused before the engine saw it (its field already prefixed)."""
    item = BatchItem(error.status, error=error.message)
    if error.details is not None:
        item.details = error.details
    return item


def batch_item(index: int, answer: Enqueued | Exception) -> BatchItem:
    """One job's answer in a batch. An error the API cannot explain is logged and answered
    500 in its slot alone: the other items' answers still reach the client."""
    if isinstance(answer, Enqueued):
        return BatchItem(201, job=job_out(answer.job))
    error = from_domain(answer) if isinstance(answer, GoQueueError) else None
    if error is None:
        log.error("batch item %d failed", index, exc_info=answer)
        return BatchItem(500, error="internal server error")
    item = refused_item(error)
    if error.details is not None and "field" in error.details:
        item.details = {**error.details, "field": f"jobs[{index}].{error.details['field']}"}
    if error.existing_id is not None:
        item.existing_id = error.existing_id
    return item


@routes.get("/jobs")
@operation(responses={200: JobList}, query_params=JOB_FILTERS)
async def list_jobs(request: web.Request) -> web.Response:
    """List jobs, newest first, filtered by type, status, queue and flow-control key."""
    query = request.query
    filters = JobFilter(
        type=TYPE.parse(query),
        status=STATUS.parse(query),
        queue=QUEUE.parse(query),
        concurrency_key=CONCURRENCY_KEY.parse(query),
    )
    limit, offset = LIMIT.parse(query), OFFSET.parse(query)
    engine = request.app[ENGINE]
    page = await within(request.app[STORE].list_jobs(filters, limit, offset))
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
        job = await within(request.app[STORE].get(job_id))
    if job is None:
        raise ApiError(404, f"job {job_id} not found")
    return reply(_shown(request, job))


def _shown(request: web.Request, job: Job) -> JobOut:
    """One job as its own routes show it: with its live progress and the deadline its
    attempts get, and where that comes from."""
    engine = request.app[ENGINE]
    out = job_out(job, engine.progress(job.id) if job.status == Status.RUNNING else None)
    timeout = effective_timeout(job, engine.catalog, request.app[SETTINGS].default_timeout)
    if timeout is not None:
        out.timeout = timeout
    return out


def effective_timeout(job: Job, catalog: Catalog, default: float) -> TimeoutOut | None:
    """The deadline an attempt of `job` gets here and its source, as the dispatcher picks
    it; None when the job names none and this node does not know its actor."""
    seconds, source = catalog.deadline(job, default)
    if source == "node" and job.type not in catalog.actors:
        return None
    return TimeoutOut(seconds, source)


@routes.get("/jobs/{id}/events")
@operation(responses={200: EventList}, errors=(404, 503))
async def job_events(request: web.Request) -> web.Response:
    """Show a job's audit trail, oldest first."""
    job_id = path_id(request)
    events = await within(request.app[STORE].events(job_id))
    if not events and await within(request.app[STORE].get(job_id)) is None:
        raise ApiError(404, f"job {job_id} not found")
    return reply(EventList(events))


@routes.post("/jobs/cancel")
@operation(body=BulkCancelRequest, responses={200: BulkCancelled}, errors=(408, 503, 504))
async def cancel_matching(request: web.Request) -> web.Response:
    """Cancel the unfinished jobs a filter selects (the oldest `limit`), running ones only
    with force=true (their workers are killed)."""
    settings = request.app[SETTINGS]
    body = await read_body(request, settings.max_body_bytes, settings.body_timeout)
    asked = decode(BULK_CANCEL_DECODER, body)
    if not asked.filtered and not asked.all:
        raise bad_request(
            "give a filter (queue, type, status, created_before) or all: true to cancel "
            "every unfinished job",
            field="all",
        )
    if asked.status is not None and asked.force:
        raise bad_request("status pending takes no running job: drop force", field="force")
    statuses = (Status.PENDING, Status.CLAIMED, *((Status.RUNNING,) if asked.force else ()))
    filters = CancelFilter(
        statuses=statuses, queue=asked.queue, type=asked.type, created_before=asked.created_before
    )
    done = await within(request.app[ENGINE].cancel_many(filters, asked.limit), writes=True)
    return reply(BulkCancelled(len(done.jobs), done.killed, done.remaining, done.running))


@routes.delete("/jobs/{id}")
@operation(responses={200: JobOut}, errors=(404, 409, 503, 504), query_params=(FORCE,))
async def cancel_job(request: web.Request) -> web.Response:
    """Cancel a pending job, or with force=true a running one (its worker is killed)."""
    job_id = path_id(request)
    force = FORCE.parse(request.query)
    job = await within(request.app[ENGINE].cancel(job_id, force), writes=True)
    return reply(_shown(request, job))
