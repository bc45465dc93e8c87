"""GoQueue: a background job processor with a REST API, whose supervisor really kills hung
handlers.

What users import is here: `from goqueue import actor, Retry, Fail`. The card's folders are
installed beneath this package as `goqueue.actors` (what worker processes load),
`goqueue.supervisor` (the engine) and `goqueue.api` (HTTP and the command line). Importing
`goqueue` loads only `goqueue.actors`, so a worker process stays light.
"""

from goqueue.actors import (
    Actor,
    ActorDefinitionError,
    Context,
    EnqueueError,
    Fail,
    Retry,
    actor,
)

__all__ = ["Actor", "ActorDefinitionError", "Context", "EnqueueError", "Fail", "Retry", "actor"]
