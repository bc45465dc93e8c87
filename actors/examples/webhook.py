"""Example: pretend to call a slow third-party API (async handler)."""

import asyncio
import random
from typing import Any

from goqueue.actors import Context, actor


@actor("webhook", timeout=10)
async def call_webhook(payload: dict[str, Any] | None, ctx: Context) -> dict[str, Any]:
    """Simulate an outbound HTTP call: ~50 ms, 10% failures retried with backoff."""
    payload = payload or {}
    await asyncio.sleep(payload.get("sleep", 0.05))
    if random.random() < payload.get("fail_rate", 0.1):
        raise ConnectionError("upstream answered 502")
    return {"status": 200, "attempt": ctx.attempt}
