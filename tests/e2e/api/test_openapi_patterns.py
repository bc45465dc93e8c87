"""Every pattern the OpenAPI document serves means in JavaScript (ECMA-262, as JSON Schema
validators read it) what the server's own pattern means in Python. Before, the document
carried Python's `\\Z`, which JavaScript reads as a literal `Z`: `email` failed and
`emailZ` passed."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from goqueue.api.http import openapi

from tests.e2e.api.conftest import ApiServer

pytestmark = pytest.mark.timeout(60)

NODE_SCRIPT = """
const {patterns, probes} = JSON.parse(require('fs').readFileSync(0, 'utf8'));
const out = patterns.map((p) => Object.fromEntries(['', 'u'].map((flags) => {
  try {
    const re = new RegExp(p, flags);
    return [flags || 'none', probes.map((s) => re.test(s))];
  } catch (e) {
    return [flags || 'none', String(e)];
  }
})));
process.stdout.write(JSON.stringify(out));
"""

FIXED_PROBES = [
    "", "a", "email", "emailZ", "Z", "email\\n", "email\n", "\nemail", "email\r", "a b",
    "a\x00", "a\u00a0b", "a\u2028", "a\x1c", "q.1:x-y_z", "-", "x" * 200, "x" * 201,
    "http://127.0.0.1/hook", "https://a.b/c?d=e", "http://x\n", "http://x y", "http://é",
    "ftp://x", "http://", "HTTP://X", "k", "k\t", "\x7f", "é", "\ufeff", "a\ud7ff",
]  # fmt: skip
ALPHABET = "aZz09_.:-/ \t\n\r\x00\x1f\x7f\u00a0\u2028é\ufeffhtps:"


def probes() -> list[str]:
    rng = random.Random(11)
    drawn = ["".join(rng.choices(ALPHABET, k=rng.randint(0, 12))) for _ in range(300)]
    drawn += ["http://" + "".join(rng.choices(ALPHABET, k=rng.randint(1, 8))) for _ in range(100)]
    return FIXED_PROBES + drawn


def patterns(node: Any, path: str = "$") -> Iterator[tuple[str, str]]:
    """(location, pattern) of every `pattern` in a JSON document."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "pattern" and isinstance(value, str):
                yield path, value
            else:
                yield from patterns(value, f"{path}.{key}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from patterns(value, f"{path}[{index}]")


def run_node(served: list[str], inputs: list[str]) -> list[dict[str, Any]]:
    node = shutil.which("node")
    if node is None:
        message = "SKIPPING: node is not installed, so no JavaScript engine checks the patterns"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    done = subprocess.run(
        [node, "-e", NODE_SCRIPT],
        input=json.dumps({"patterns": served, "probes": inputs}),
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return list(json.loads(done.stdout))


def test_served_patterns_mean_in_javascript_what_the_server_means_in_python(
    api_server: ApiServer,
) -> None:
    served_doc = api_server.get("/openapi.json").json
    assert api_server.runner is not None
    raw_doc = openapi.describe(api_server.runner.app, api_server.settings)
    served = dict(patterns(served_doc))
    server_side = dict(patterns(raw_doc))
    assert served.keys() == server_side.keys() and len(served) >= 5, served
    assert not [p for p in served.values() if "\\Z" in p or "\\A" in p or "(?P" in p]
    inputs = probes()
    locations = sorted(served)
    results = run_node([served[loc] for loc in locations], inputs)
    for location, by_flags in zip(locations, results, strict=True):
        python = re.compile(server_side[location])
        expected = [python.search(s) is not None for s in inputs]
        for flags, matched in by_flags.items():
            assert isinstance(matched, list), f"{location} {served[location]!r}: {matched}"
            differ = [s for s, e, m in zip(inputs, expected, matched, strict=True) if e != m]
            assert not differ, (
                f"{location}: {served[location]!r} (JavaScript, flags {flags}) and "
                f"{server_side[location]!r} (the server) disagree on {differ[:5]!r}"
            )


def test_the_javascript_reading_of_the_old_pattern_was_wrong() -> None:
    """The check above can fail: the pattern the document used to serve is caught."""
    old = r"^[A-Za-z0-9_.:\-]+\Z"
    (result,) = run_node([old], ["email", "emailZ"])
    assert result["none"] == [False, True]  # JavaScript: `\Z` is a literal Z
    assert re.search(old, "email")  # ...while the server accepts `email`
    assert openapi.ecma_pattern(old) == r"^[A-Za-z0-9_.:\-]+$"
    with pytest.raises(RuntimeError):
        openapi.ecma_pattern(r"^(?P<name>a)$")
