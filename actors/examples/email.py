"""Example: pretend to send an email (a short sleep, an occasional transient failure)."""

import random
import time
from typing import Any

from goqueue.actors import Context, Fail, Retry, actor


@actor("email", timeout=30, max_retries=3, concurrency=4)
def send_email(payload: dict[str, Any] | None, ctx: Context) -> dict[str, Any]:
    """Simulate an SMTP call: ~20 ms, 5% transient failures, a missing address fails now."""
    payload = payload or {}
    if payload.get("to") == "":
        raise Fail("no recipient")
    time.sleep(payload.get("sleep", 0.02))
    if random.random() < payload.get("fail_rate", 0.05):
        raise Retry("SMTP server busy", delay=1)
    return {"sent": True, "to": payload.get("to"), "attempt": ctx.attempt}
