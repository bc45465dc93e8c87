"""What a handler knows about the attempt it runs (`Context`), and what the context talks
to (`Link`): kept apart from the registry so the signature reader (`typed.py`) can name
the type without a cycle."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol


class Link(Protocol):
    """What a context talks to: the worker's pipe to its supervisor."""

    def enqueue(self, parent_id: str, spec: dict[str, Any]) -> str:
        """Create a child job of `parent_id`; its id. Raises EnqueueError."""

    def progress(self, job_id: str, value: float | Mapping[str, Any]) -> None:
        """Report the job's progress (throttled)."""


@dataclass(frozen=True, slots=True)
class Context:
    """What a handler knows about the attempt it runs, and its line to the supervisor
    (`enqueue`, `progress`), which exists only inside a worker."""

    job_id: str
    attempt: int
    type: str
    queue: str
    link: Link | None = field(default=None, repr=False, compare=False)
    # A workflow step's direct parents' results, by their keys ({} for any other job).
    parents: Mapping[str, Any] = field(default_factory=dict)

    def enqueue(self, job_type: str, payload: Any = None, /, **options: Any) -> str:
        """Enqueue a job of `job_type` whose `parent_id` is this job, with any POST /jobs
        field as an option (`queue=`, `priority=`, `delay_seconds=`, ...); returns its id.

        The supervisor validates it as the API does. Raises EnqueueError when it refuses
        (invalid, duplicate, store unavailable); blocks for the supervisor's answer."""
        if "type" in options:
            raise TypeError("ctx.enqueue takes the job type as its first argument, not type=")
        return self._link().enqueue(self.job_id, {"type": job_type, "payload": payload, **options})

    def progress(self, value: float | Mapping[str, Any]) -> None:
        """Report progress: a number from 0 to 1, or a JSON object of at most 4 KiB. Cheap
        to call often: at most about 5 reports a second reach the supervisor, the latest
        winning. Shown as the running job's `progress` in GET /jobs/{id}."""
        self._link().progress(self.job_id, value)

    def _link(self) -> Link:
        if self.link is None:
            raise RuntimeError("ctx.enqueue and ctx.progress work only inside a worker")
        return self.link
