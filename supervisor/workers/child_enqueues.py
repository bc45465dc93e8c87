"""Jobs created by running jobs (`ctx.enqueue`): a worker's `EnqueueRequest` becomes an
enqueue through the engine's own validation, answered with the new job's id or a refusal
the handler sees as `EnqueueError`.

The pool knows nothing of the engine: the builder hands it an `EnqueueChild` callable.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import msgspec
from goqueue.actors.protocol import EnqueueReply, EnqueueRequest, Refusal
from goqueue.supervisor.common.errors import (
    Draining,
    DuplicateJob,
    GoQueueError,
    InvalidJob,
    OutcomeUnknown,
    StoreFull,
    StoreUnavailable,
    TooManyQueues,
    UnknownJobType,
)
from goqueue.supervisor.common.jobs import JobSpec

log = logging.getLogger("goqueue.pool")

ENQUEUE_TIMEOUT = 10.0  # as long as an API request may wait on the store

# Enqueue `spec` as a child of the job with the given id; the new job's id. Raises the
# engine's errors (InvalidJob, UnknownJobType, DuplicateJob, StoreUnavailable, ...).
EnqueueChild = Callable[[JobSpec, str], Awaitable[str]]


async def unwired(spec: JobSpec, parent_id: str) -> str:
    """The pool's `EnqueueChild` until the builder wires the engine's."""
    raise StoreUnavailable("this node cannot take jobs from running jobs")


_decode_spec = msgspec.json.Decoder(JobSpec).decode


async def answer(enqueue: EnqueueChild, request: EnqueueRequest) -> EnqueueReply:
    """Enqueue the job `request` asks for; never raises."""
    reply = EnqueueReply(request.request_id)
    try:
        spec = _decode_spec(request.spec)
        async with asyncio.timeout(ENQUEUE_TIMEOUT):
            if request.trace_context is None:
                reply.job_id = await enqueue(spec, request.job_id)
            else:  # --otel: the enqueue's span is a child of the asking attempt's
                from goqueue.supervisor.observe.tracing import joined

                with joined(request.trace_context):
                    reply.job_id = await enqueue(spec, request.job_id)
    except msgspec.ValidationError as exc:
        refuse(reply, Refusal.INVALID, f"invalid job: {exc}")
    except (msgspec.DecodeError, InvalidJob, UnknownJobType) as exc:
        refuse(reply, Refusal.INVALID, str(exc))
    except DuplicateJob as exc:
        refuse(reply, Refusal.DUPLICATE, str(exc))
        reply.existing_id = exc.existing_id
    except (StoreUnavailable, OutcomeUnknown, StoreFull, TooManyQueues, Draining) as exc:
        refuse(reply, Refusal.UNAVAILABLE, str(exc))
    except TimeoutError:
        refuse(reply, Refusal.UNAVAILABLE, f"the store did not answer within {ENQUEUE_TIMEOUT:g}s")
    except GoQueueError as exc:
        refuse(reply, Refusal.INVALID, str(exc))
    except Exception:
        log.exception("enqueueing a child job failed", extra={"job_id": request.job_id})
        refuse(reply, Refusal.UNAVAILABLE, "the supervisor failed to enqueue the job")
    return reply


def refuse(reply: EnqueueReply, refusal: Refusal, error: str) -> None:
    """Mark `reply` as a refusal."""
    reply.refusal = refusal
    reply.error = error
