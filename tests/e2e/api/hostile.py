"""Helpers for the hostile-input tests: raw HTTP (bytes where a client library would refuse
to send them) and a snapshot of what a node holds, to prove a refusal changed nothing."""

from __future__ import annotations

import http.client
import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

TIMEOUT = 20.0


@dataclass
class Raw:
    """An answer: status, headers (lower-case names), body bytes and, if JSON, the value."""

    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.body)


def send(
    url: str,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: list[tuple[str, str | bytes]] | None = None,
) -> Raw:
    """One request with exactly these bytes: `path` is sent as given (percent-encode it
    yourself), header values may be bytes (sent as they are)."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=TIMEOUT)
    try:
        conn.putrequest(method, path, skip_accept_encoding=True)
        sent = list(headers or [])
        if body is not None:
            sent.append(("Content-Type", "application/json"))
            sent.append(("Content-Length", str(len(body))))
        for name, value in sent:
            conn.putheader(name, value)
        conn.endheaders(body)
        resp = conn.getresponse()
        return Raw(resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read())
    finally:
        conn.close()


def state(url: str, headers: list[tuple[str, str | bytes]] | None = None) -> dict[str, Any]:
    """What a node holds: counts by status, dead letters, depth by queue, the newest jobs
    (ids and statuses) and the paused queues; equal before and after a refused request."""
    stats = send(url, "GET", "/stats", headers=headers)
    jobs = send(url, "GET", "/jobs?limit=1000", headers=headers)
    queues = send(url, "GET", "/queues", headers=headers)
    assert stats.status == jobs.status == queues.status == 200, (stats, jobs, queues)
    listed = jobs.json
    return {
        "counts": stats.json["counts"],
        "dead_letters": stats.json["dead_letters"],
        "queues": stats.json["queues"],
        "jobs": [(j["id"], j["status"]) for j in listed["jobs"]],
        "total": listed["total"],
        "paused": sorted(q["name"] for q in queues.json["queues"] if q["paused"]),
    }
