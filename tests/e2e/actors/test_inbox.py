"""The worker's inbox, in this process over a real socket pair: the end of the pipe and
a lapsed allowance end the worker (its death recorded, not carried out). The kernel's
alarm itself is tested in a real worker process (`test_child.py`)."""

from __future__ import annotations

import time

import pytest
from goqueue.actors import actor
from goqueue.actors.protocol import Extend, JobDone, RunJob, RunJobs

from tests.conftest import stays_true, wait_for
from tests.e2e.actors.harness import Harness

pytestmark = pytest.mark.timeout(20)


@actor("nap")
def nap(payload, ctx):
    time.sleep(payload)
    return "rested"


def test_the_end_of_the_pipe_ends_the_worker_at_once() -> None:
    harness = Harness(nap)
    harness.sock.close()  # the supervisor is gone, whatever killed it
    closed = time.monotonic()
    wait_for(lambda: harness.deaths, timeout=2)
    assert harness.deaths[0] - closed < 0.5


def test_a_job_past_its_allowance_is_ended_by_the_alarm() -> None:
    harness = Harness(nap)
    try:
        sent = time.monotonic()
        harness.send(RunJobs([RunJob("j1", "nap", 1, "q", b"0.5", allowance=0.3)]))
        assert isinstance(harness.recv(), JobDone)
        assert harness.alarm.armed == [0.3]
        assert 0.3 <= harness.deaths[0] - sent < 0.5  # the (recorded) kernel's kill
    finally:
        harness.close()


def test_extend_keeps_a_job_going_past_its_first_allowance() -> None:
    harness = Harness(nap)
    try:
        harness.send(RunJobs([RunJob("j1", "nap", 1, "q", b"0.8", allowance=0.3)]))
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            harness.send(Extend(0.3))
            try:
                done = harness.recv(timeout=0.1)
                break
            except TimeoutError:
                continue
        assert isinstance(done, JobDone) and harness.deaths == []
        assert len(harness.alarm.armed) > 2 and set(harness.alarm.armed) == {0.3}
    finally:
        harness.close()


def test_without_an_allowance_a_job_runs_as_long_as_it_takes() -> None:
    harness = Harness(nap)
    try:
        harness.send(RunJobs([RunJob("j1", "nap", 1, "q", b"0.5", allowance=None)]))
        harness.send(Extend(0.1))  # an Extend racing the job's end arms nothing
        assert isinstance(harness.recv(), JobDone) and harness.deaths == []
        assert harness.alarm.armed == []
    finally:
        harness.close()


def test_an_allowance_ends_with_its_job() -> None:
    harness = Harness(nap)
    try:
        harness.send(RunJobs([RunJob("j1", "nap", 1, "q", b"0", allowance=0.2)]))
        assert isinstance(harness.recv(), JobDone)
        # idle well past the finished job's allowance
        stays_true(lambda: harness.deaths == [], 0.4, what="an idle worker ended by an allowance")
        assert harness.deaths == []
    finally:
        harness.close()
