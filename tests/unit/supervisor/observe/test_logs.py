"""JSON log lines: one object a line, with extras and tracebacks."""

from __future__ import annotations

import io
import json
import logging
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
from goqueue.supervisor.common.errors import ConfigError
from goqueue.supervisor.observe import logs

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def stream() -> Iterator[io.StringIO]:
    """Route logs to a buffer through `configure`, and restore the root logger afterwards."""
    root = logging.getLogger()
    saved_handlers, saved_level = list(root.handlers), root.level
    buffer = io.StringIO()
    logs.configure("debug", buffer)
    yield buffer
    for handler in root.handlers[:]:
        if handler not in saved_handlers:
            root.removeHandler(handler)
            handler.close()
    root.setLevel(saved_level)
    logging.getLogger("aiohttp.access").setLevel(logging.NOTSET)


def lines(buffer: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in buffer.getvalue().splitlines()]


def test_extra_fields_and_exception_make_one_json_line(stream: io.StringIO) -> None:
    job_id = uuid.uuid4()
    try:
        raise RuntimeError("boom\nsecond line")
    except RuntimeError:
        logging.getLogger("goqueue.test").exception(
            "attempt %d failed",
            2,
            extra={
                "job_id": job_id,
                "type": "email",
                "attempt": 2,
                "worker_pid": 4242,
                "reason": "crash",
                "where": Path("/tmp/x"),
            },
        )
    text = stream.getvalue()
    assert text.count("\n") == 1, text
    [entry] = lines(stream)
    assert entry["level"] == "error"
    assert entry["logger"] == "goqueue.test"
    assert entry["msg"] == "attempt 2 failed"
    assert entry["job_id"] == str(job_id)
    assert (entry["type"], entry["attempt"], entry["worker_pid"]) == ("email", 2, 4242)
    assert entry["reason"] == "crash"
    assert entry["where"] == "/tmp/x"  # unknown types fall back to str()
    assert "Traceback" in entry["exc"] and "RuntimeError: boom" in entry["exc"]
    stamp = entry["ts"]
    assert stamp.endswith("Z") and len(stamp.split(".")[1]) == 4  # "123Z": milliseconds
    assert datetime.fromisoformat(stamp).utcoffset().total_seconds() == 0


def test_plain_record_has_only_the_base_keys(stream: io.StringIO) -> None:
    logging.getLogger("goqueue.plain").info("hello %s", "world")
    [entry] = lines(stream)
    assert set(entry) == {"ts", "level", "logger", "msg"}
    assert entry["msg"] == "hello world"


def test_extra_named_like_a_base_key_does_not_clobber_it(stream: io.StringIO) -> None:
    logging.getLogger("goqueue.clash").warning("x", extra={"level": "custom", "ts": 1})
    [entry] = lines(stream)
    assert entry["level"] == "warning"
    assert (entry["extra_level"], entry["extra_ts"]) == ("custom", 1)


def test_odd_extra_values_still_log(stream: io.StringIO) -> None:
    loop: dict = {"name": "loop"}
    loop["self"] = loop
    log = logging.getLogger("goqueue.odd")
    log.info("keys", extra={"data": {(1, 2): "tuple key"}})
    log.info("recursive", extra={"data": loop, "attempt": 1})
    keys, recursive = lines(stream)
    assert keys["data"] == {"(1, 2)": "tuple key"}
    assert recursive["msg"] == "recursive"
    assert recursive["attempt"] == 1
    assert "loop" in recursive["data"]


def test_configure_twice_replaces_its_handler(stream: io.StringIO) -> None:
    second = io.StringIO()
    logs.configure("warning", second)
    logging.getLogger("goqueue.again").warning("once")
    logging.getLogger("goqueue.again").info("filtered by level")
    assert stream.getvalue() == ""
    assert [entry["msg"] for entry in lines(second)] == ["once"]
    ours = [h for h in logging.getLogger().handlers if isinstance(h.formatter, logs.JsonFormatter)]
    assert len(ours) == 1


def test_access_log_is_quiet_by_default(stream: io.StringIO) -> None:
    logging.getLogger("aiohttp.access").info("GET / 200")
    assert stream.getvalue() == ""
    assert logging.getLogger("aiohttp.access").getEffectiveLevel() == logging.WARNING


def test_unknown_level_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="log_level"):
        logs.configure("loud", io.StringIO())
