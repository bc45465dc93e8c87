"""What the in-memory store keeps of workflows: the workflows themselves, each step's
children and count of unfinished parents, and its parents' results as they come in.
A workflow's record (`FlowRecord`) and its view (`workflow_of`) serve the SQLite store
too, which keeps the record in a row."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

import msgspec
from goqueue.supervisor.common.enums import Status
from goqueue.supervisor.common.steps import StepState, Workflow, workflow_status

RESULTS = msgspec.json.Decoder(dict[str, msgspec.Raw])


class FlowRecord(msgspec.Struct, kw_only=True):
    """One workflow: its steps' current job ids by key, in creation order."""

    id: str
    name: str
    created_at: datetime
    steps: dict[str, str]
    seq: int
    cancelled: bool = False
    idempotency_key: str | None = None
    request_hash: str = ""


class FlowBook:
    """Workflows and the edges between their steps (job ids)."""

    def __init__(self) -> None:
        self.flows: dict[str, FlowRecord] = {}
        self.children: dict[str, list[str]] = {}  # a step's job id -> its children's
        self.unfinished: dict[str, int] = {}  # a waiting step -> parents not done yet
        self.results: dict[str, dict[str, msgspec.Raw]] = {}  # a step -> parents' results
        self.idempotency: dict[str, tuple[str, str]] = {}  # key -> (request hash, id)

    def parents_json(self, job_id: str) -> msgspec.Raw:
        """The results of a step's finished parents, by key, as one JSON object."""
        return msgspec.Raw(msgspec.json.encode(self.results.get(job_id, {})))

    def descendants(self, job_id: str) -> list[str]:
        """Every step depending on `job_id`, directly or not, parents before children."""
        seen: dict[str, None] = {}
        frontier = list(self.children.get(job_id, ()))
        while frontier:
            child = frontier.pop(0)
            if child not in seen:
                seen[child] = None
                frontier.extend(self.children.get(child, ()))
        return list(seen)


def workflow_of(flow: FlowRecord, kept: Mapping[str, tuple[Status, list[str] | None]]) -> Workflow:
    """A workflow as its steps are now: `kept` gives each kept step's status and parents'
    job ids, by job id (a step not kept was pruned after it finished: only finished jobs
    are ever pruned, and it counts as done)."""
    keys = {job_id: key for key, job_id in flow.steps.items()}
    steps = []
    for key, job_id in flow.steps.items():
        status, parent_ids = kept.get(job_id, (Status.DONE, None))
        after = [keys[p] for p in (parent_ids or ()) if p in keys]
        steps.append(StepState(key, job_id, status, after))
    return Workflow(
        id=flow.id,
        name=flow.name,
        status=workflow_status(flow.cancelled, (s.status for s in steps)),
        created_at=flow.created_at,
        steps=steps,
    )
