"""Workflows from Python: a builder that reads like the producer API, and the calls of
the workflow routes (`POST /workflows`, `GET /workflows/{id}`, `DELETE /workflows/{id}`).

    wf = goqueue.Workflow("thumbnails")
    fetch = wf.add(fetch_image, {"url": url})
    sizes = [wf.add(resize, {"width": w}, after=[fetch]) for w in (64, 256)]
    wf.add(notify, {"to": "ops"}, after=sizes)
    run = client.submit(wf)                     # or wf.send()
    client.wait_workflow(run.id, timeout=60)

`chain(a, b, c)` runs its parts one after the other, `group([a, b])` side by side, and
`group([...]).then(callback)` is a chord: the callback after every member. Each part is
an actor, `(actor, payload)`, a `Task` (`task(actor, payload, **options)`), or another
chain or group; all of them are built into one `Workflow`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, Unpack

import msgspec
from goqueue.api.wire import WorkflowOut, WorkflowRequest
from goqueue.client.calls import Call, decoder, quote
from goqueue.client.core import IDEMPOTENCY_HEADER, SPEC_OPTIONS, JobOptions, check, new_key
from goqueue.client.errors import ClientError, InvalidJob
from goqueue.supervisor.common.errors import InvalidWorkflow
from goqueue.supervisor.common.steps import plan

if TYPE_CHECKING:
    from goqueue.client.aio import AsyncClient
    from goqueue.client.sync import Client


class Named(Protocol):
    """An actor (what `@actor` returns): its name, and its declared defaults."""

    @property
    def name(self) -> str:
        """The job type."""
        ...

    def options(self, given: JobOptions) -> JobOptions:
        """`given` with the actor's declared defaults filled in."""
        ...


Target = Named | str  # an actor, or a job type by name


def _type_and_options(target: Target, options: JobOptions) -> tuple[str, JobOptions]:
    if isinstance(target, str):
        return target, options
    return target.name, target.options(options)


@dataclass(frozen=True, slots=True)
class Step:
    """One step added to a workflow: pass it in another step's `after`."""

    key: str
    type: str
    payload: Any
    options: Mapping[str, Any]
    after: tuple[str, ...]


class Workflow:
    """A DAG of jobs built step by step and sent at once (`client.submit(wf)`)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.steps: list[Step] = []
        self._keys: set[str] = set()

    def add(
        self,
        target: Target,
        payload: Any = None,
        *,
        after: Iterable[Step | str] = (),
        key: str | None = None,
        **options: Unpack[JobOptions],
    ) -> Step:
        """Add a job of `target` (an actor or a type name) that runs once every step of
        `after` is done. Its `key` (unique in the workflow) defaults to the type, then
        `type-2`, `type-3`...; options are those of `Client.enqueue`."""
        job_type, merged = _type_and_options(target, options)
        unknown = sorted(set(merged) - set(SPEC_OPTIONS))
        if unknown:
            raise TypeError(f"unknown workflow step option(s): {', '.join(unknown)}")
        chosen = key or self._free_key(job_type)
        if chosen in self._keys:
            raise ValueError(f"duplicate step key {chosen!r}")
        parents = tuple(p.key if isinstance(p, Step) else p for p in after)
        step = Step(chosen, job_type, payload, dict(merged), parents)
        self.steps.append(step)
        self._keys.add(chosen)
        return step

    def _free_key(self, base: str) -> str:
        if base not in self._keys:
            return base
        n = 2
        while f"{base}-{n}" in self._keys:
            n += 1
        return f"{base}-{n}"

    def body(self) -> bytes:
        """The `POST /workflows` body, checked here as the node checks it (InvalidJob
        naming `jobs[i].field`, or the graph's problem)."""
        jobs = []
        for i, step in enumerate(self.steps):
            fields: dict[str, Any] = {"type": step.type}
            if step.payload is not None:
                fields["payload"] = step.payload
            fields.update((k, v) for k, v in step.options.items() if v is not None)
            check(_encode(fields), f"jobs[{i}].")
            jobs.append({**fields, "key": step.key, "after": list(step.after)})
        body = _encode({"name": self.name, "jobs": jobs})
        try:
            plan(_REQUEST.decode(body).jobs)
        except InvalidWorkflow as exc:
            raise InvalidJob(str(exc), {"field": exc.field}) from None
        except msgspec.ValidationError as exc:
            raise InvalidJob(str(exc)) from None
        return body

    def send(self, client: Client | None = None, idempotency_key: str | None = None) -> WorkflowOut:
        """Create the workflow through `client`, else the one `goqueue.configure()` set."""
        from goqueue.client import default

        sender = client if client is not None else default.client()
        return sender.submit_workflow(self, idempotency_key=idempotency_key)

    async def send_async(
        self, client: AsyncClient | None = None, idempotency_key: str | None = None
    ) -> WorkflowOut:
        """`send` for async code, through `client` or the configured one of this loop."""
        from goqueue.client import default

        sender = client if client is not None else await default.async_client()
        return await sender.submit_workflow(self, idempotency_key=idempotency_key)


_encode = msgspec.json.Encoder().encode
_REQUEST = msgspec.json.Decoder(WorkflowRequest)


# -- canvas: chain, group, chord -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Task:
    """A job to place in a chain or a group: `task(resize, {"width": 64}, queue="img")`."""

    target: Target
    payload: Any = None
    options: Mapping[str, Any] = field(default_factory=dict)
    key: str | None = None

    def place(self, wf: Workflow, after: Sequence[Step]) -> list[Step]:
        """Add it to `wf` after `after`; its steps (the last ones, to wait for)."""
        opts: Any = dict(self.options)  # checked by `Workflow.add`
        return [wf.add(self.target, self.payload, after=after, key=self.key, **opts)]


def task(
    target: Target, payload: Any = None, *, key: str | None = None, **options: Unpack[JobOptions]
) -> Task:
    """A job of `target` with its payload and options, for `chain` and `group`; `key`
    names its step (as in `ctx.parents`), its job type by default."""
    return Task(target, payload, dict(options), key)


Part = Any  # an actor, a type name, (target, payload), a Task, a Chain or a Group


def _placeable(part: Part) -> Task | Chain | Group:
    if isinstance(part, Task | Chain | Group):
        return part
    if isinstance(part, tuple):
        target, payload = part
        return Task(target, payload)
    return Task(part)


@dataclass(frozen=True, slots=True)
class Chain:
    """Parts run one after the other; each sees the previous one's results in
    `ctx.parents`."""

    parts: tuple[Task | Chain | Group, ...]
    kind: str = "chain"  # its workflow's name unless given one ("chord": a group, then one)

    def place(self, wf: Workflow, after: Sequence[Step]) -> list[Step]:
        """Add the parts in order, each after the one before."""
        last = list(after)
        for part in self.parts:
            last = part.place(wf, last)
        return last

    def then(self, part: Part) -> Chain:
        """This chain, then `part`."""
        return Chain((*self.parts, _placeable(part)), self.kind)

    def workflow(self, name: str | None = None) -> Workflow:
        """The chain as a workflow to submit (named for its kind unless `name`)."""
        wf = Workflow(name or self.kind)
        self.place(wf, [])
        return wf


@dataclass(frozen=True, slots=True)
class Group:
    """Parts run side by side; `.then(callback)` adds a callback after all of them (a
    chord), which sees every member's result in `ctx.parents`."""

    parts: tuple[Task | Chain | Group, ...]

    def place(self, wf: Workflow, after: Sequence[Step]) -> list[Step]:
        """Add every part after `after`; their last steps together."""
        return [step for part in self.parts for step in part.place(wf, after)]

    def then(self, part: Part) -> Chain:
        """A chord: `part` after every member of this group."""
        return Chain((self, _placeable(part)), "chord")

    def workflow(self, name: str = "group") -> Workflow:
        """The group as a workflow to submit."""
        wf = Workflow(name)
        self.place(wf, [])
        return wf


def chain(*parts: Part) -> Chain:
    """`chain(a, b, c)`: a, then b, then c."""
    return Chain(tuple(_placeable(p) for p in parts))


def group(parts: Iterable[Part]) -> Group:
    """`group([a, b])`: a and b side by side; `group([...]).then(c)`: a chord."""
    return Group(tuple(_placeable(p) for p in parts))


Submittable = Workflow | Chain | Group


def as_workflow(item: Submittable) -> Workflow:
    """A workflow, a chain or a group, as the workflow to send."""
    return item if isinstance(item, Workflow) else item.workflow()


# -- calls -------------------------------------------------------------------------------

_read_workflow = decoder(WorkflowOut)


def create(item: Submittable, idempotency_key: str | None) -> Call[WorkflowOut]:
    """POST /workflows, safe to repeat thanks to its Idempotency-Key (made up here when
    the caller gives none)."""
    body = as_workflow(item).body()
    headers = {IDEMPOTENCY_HEADER: idempotency_key or new_key()}
    return Call("POST", "/workflows", _read_workflow, body, headers, safe=True)


def get(workflow_id: str) -> Call[WorkflowOut]:
    """GET /workflows/{id}."""
    return Call("GET", f"/workflows/{quote(workflow_id)}", _read_workflow, safe=True)


def cancel(workflow_id: str) -> Call[WorkflowOut]:
    """DELETE /workflows/{id} (not repeated: a second cancel is a 409)."""
    return Call("DELETE", f"/workflows/{quote(workflow_id)}", _read_workflow)


class WorkflowWait:
    """A wait for a workflow to finish: when to look again (backing off to half a
    second), and when to give up."""

    def __init__(self, timeout: float | None, now: Any) -> None:
        self._now = now
        self._deadline = None if timeout is None else now() + timeout
        self.timeout = timeout
        self._pause = 0.02

    def pause(self, seen: WorkflowOut) -> float | None:
        """Seconds to sleep before looking again; None when the wait is over."""
        if seen.finished:
            return None
        left = None if self._deadline is None else self._deadline - self._now()
        if left is not None and left <= 0:
            raise WorkflowTimeout(seen, self.timeout or 0.0)
        pause = self._pause if left is None else min(self._pause, left)
        self._pause = min(self._pause * 2, 0.5)
        return pause


class WorkflowTimeout(ClientError, TimeoutError):
    """`wait_workflow`: still running after the timeout; `workflow` is its state then."""

    def __init__(self, workflow: WorkflowOut, timeout: float) -> None:
        self.workflow = workflow
        super().__init__(f"workflow {workflow.id} is still {workflow.status} after {timeout:g} s")
