"""Example: a CPU-bound report, limited to two at a time per node."""

import hashlib
from typing import Any

from goqueue.actors import Context, actor


@actor("report", timeout=120, concurrency=2)
def build_report(payload: dict[str, Any] | None, ctx: Context) -> dict[str, Any]:
    """Hash a buffer `rounds` times (default 20,000): real CPU work, no sleeping."""
    payload = payload or {}
    digest = b"goqueue"
    for _ in range(int(payload.get("rounds", 20_000))):
        digest = hashlib.sha256(digest).digest()
    return {"digest": digest.hex(), "job_id": ctx.job_id}
