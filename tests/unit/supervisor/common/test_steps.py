"""The checks of a workflow's graph (`plan`) and the rule for its status."""

from __future__ import annotations

import msgspec
import pytest
from goqueue.supervisor.common.enums import Status, WorkflowStatus
from goqueue.supervisor.common.errors import InvalidWorkflow
from goqueue.supervisor.common.steps import WorkflowStep, plan, workflow_status


def steps(*pairs: tuple[str, list[str]]) -> list[WorkflowStep]:
    raw = [{"key": k, "type": "t", "after": a} for k, a in pairs]
    return msgspec.convert(raw, list[WorkflowStep])


def test_plan_puts_parents_first() -> None:
    given = steps(("c", ["b"]), ("a", []), ("b", ["a"]), ("d", ["a", "c"]))
    order = [given[i].key for i in plan(given)]
    assert order == ["a", "b", "c", "d"]


@pytest.mark.parametrize(
    ("given", "field", "words"),
    [
        ([], "jobs", "at least one step"),
        ([("a", []), ("a", [])], "jobs[1].key", "duplicate key 'a' (also jobs[0])"),
        ([("a", []), ("b", ["a", "x"])], "jobs[1].after[1]", "unknown key 'x'"),
        ([("a", ["a"])], "jobs", "cycle: a -> a"),
        ([("r", []), ("x", ["r", "z"]), ("y", ["x"]), ("z", ["y"])], "jobs", "x -> y -> z -> x"),
    ],
)
def test_plan_refuses_what_is_not_a_dag(
    given: list[tuple[str, list[str]]], field: str, words: str
) -> None:
    with pytest.raises(InvalidWorkflow) as refused:
        plan(steps(*given))
    assert refused.value.field == field and words in str(refused.value)


def test_a_repeated_parent_counts_once() -> None:
    assert len(plan(steps(("a", []), ("b", ["a", "a"])))) == 2


def test_status_rule() -> None:
    done, waiting = Status.DONE, Status.WAITING
    assert workflow_status(False, [done, done]) == WorkflowStatus.DONE
    assert workflow_status(False, [done, waiting]) == WorkflowStatus.RUNNING
    # a failure is the workflow's only once no step is unfinished
    assert workflow_status(False, [Status.FAILED, waiting]) == WorkflowStatus.RUNNING
    assert workflow_status(False, [Status.FAILED, Status.RUNNING]) == WorkflowStatus.RUNNING
    assert workflow_status(False, [Status.FAILED, done]) == WorkflowStatus.FAILED
    assert workflow_status(False, [Status.CANCELLED]) == WorkflowStatus.FAILED
    assert workflow_status(True, [done]) == WorkflowStatus.CANCELLED
