"""A worker's log lines: JSON, one write per line, tagged with the running job."""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Iterator

import pytest
from goqueue.actors.logs import JobLog, LineCapture, LineHandler

pytestmark = pytest.mark.timeout(30)


class Sink:
    """A pipe standing in for the worker's stderr: every write is recorded separately."""

    def __init__(self) -> None:
        self.read_fd, self.fd = os.pipe()

    def lines(self) -> list[dict[str, object]]:
        os.close(self.fd)
        with os.fdopen(self.read_fd, "rb") as f:
            return [json.loads(line) for line in f.read().splitlines()]


@pytest.fixture
def sink() -> Iterator[Sink]:
    yield Sink()


def job_log(fd: int) -> tuple[JobLog, logging.Logger, LineCapture]:
    handler = LineHandler(fd)
    out = LineCapture(handler, "stdout", logging.INFO, fd)
    logger = logging.getLogger(f"test.joblog.{fd}")
    logger.propagate = False
    logger.handlers = [handler]
    logger.setLevel(logging.INFO)
    return JobLog(handler, (out,)), logger, out


def test_records_inside_a_job_carry_its_fields_and_none_after(sink: Sink) -> None:
    log, logger, _ = job_log(sink.fd)
    log.begin("j-1", "email", 2, "mail")
    logger.warning("sending %s", "now", extra={"to": "a@b"})
    log.end()
    logger.info("between jobs")
    first, second = sink.lines()
    assert first["msg"] == "sending now"
    assert (first["job_id"], first["type"], first["attempt"], first["queue"]) == (
        "j-1",
        "email",
        2,
        "mail",
    )
    assert first["to"] == "a@b" and first["level"] == "warning"
    assert "job_id" not in second and second["msg"] == "between jobs"


def test_a_callers_own_extra_wins_over_the_tags(sink: Sink) -> None:
    log, logger, _ = job_log(sink.fd)
    log.begin("j-1", "email", 1, "default")
    logger.info("x", extra={"queue": "mine"})
    [line] = sink.lines()
    assert line["queue"] == "mine" and line["job_id"] == "j-1"


def test_printed_text_becomes_one_record_a_line_and_partial_lines_wait_for_the_job_end(
    sink: Sink,
) -> None:
    log, _, out = job_log(sink.fd)
    log.begin("j-2", "report", 1, "default")
    out.write("one\ntwo\nthr")
    out.write("ee\nunfinished")
    log.end()
    lines = sink.lines()
    assert [line["msg"] for line in lines] == ["one", "two", "three", "unfinished"]
    assert all(line["job_id"] == "j-2" and line["logger"] == "stdout" for line in lines)


def test_printed_lines_are_kept_whatever_the_log_level(sink: Sink) -> None:
    _, logger, out = job_log(sink.fd)
    logger.setLevel(logging.ERROR)
    logger.warning("dropped")
    out.write("kept\n")
    assert [line["msg"] for line in sink.lines()] == ["kept"]


def test_lines_from_many_threads_never_interleave(sink: Sink) -> None:
    log, logger, out = job_log(sink.fd)
    log.begin("j-3", "bulk", 1, "default")
    reader_lines: list[bytes] = []

    def drain() -> None:
        with os.fdopen(sink.read_fd, "rb") as f:
            reader_lines.extend(f.read().splitlines())

    reader = threading.Thread(target=drain)
    reader.start()

    def chatter(n: int) -> None:
        for i in range(200):
            out.write(f"thread {n} line {i} " + "x" * 300 + "\n")
            logger.info("thread %d record %d", n, i)

    threads = [threading.Thread(target=chatter, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    os.close(sink.fd)
    reader.join(timeout=10)
    parsed = [json.loads(line) for line in reader_lines]  # raises if any line was torn
    assert len(parsed) == 4 * 200 * 2
    assert all(line["job_id"] == "j-3" for line in parsed)


def test_a_write_that_fails_never_raises_into_the_job() -> None:
    read_fd, fd = os.pipe()
    os.close(read_fd)
    os.close(fd)
    handler = LineHandler(fd)  # a closed descriptor: every write fails
    record = logging.LogRecord("x", logging.INFO, "", 0, "lost", None, None)
    handler.handle(record)  # no exception, no recursion through a captured stderr
