"""The user's side of GoQueue: declare handlers with `@actor`, steer them with `Retry`/`Fail`.

Worker processes import only this package (and the user's actor modules): no aiohttp,
psycopg or prometheus-client is ever loaded in a worker.
"""

from goqueue.actors.errors import ActorDefinitionError, EnqueueError, Fail, Retry
from goqueue.actors.job_context import Context
from goqueue.actors.registry import Actor, Registry, TypedActor, actor, load_actors

__all__ = [
    "Actor",
    "ActorDefinitionError",
    "Context",
    "EnqueueError",
    "Fail",
    "Registry",
    "Retry",
    "TypedActor",
    "actor",
    "load_actors",
]
