"""What the in-memory store keeps of workflows: the workflows themselves, each step's
children and count of unfinished parents, and its parents' results as they come in."""

from __future__ import annotations

from datetime import datetime

import msgspec


class FlowRecord(msgspec.Struct, kw_only=True):
    """One workflow: its steps' current job ids by key, in creation order."""

    id: str
    name: str
    created_at: datetime
    steps: dict[str, str]
    seq: int
    cancelled: bool = False


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
