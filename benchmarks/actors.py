"""Actors used by `goqueue bench`: a no-op, and a hang that only SIGKILL ends."""

import os
import signal

from goqueue import Context, actor


@actor("bench.noop", max_retries=0)
def noop(payload: object, ctx: Context) -> None:
    """Do nothing: the benchmark measures the queue, not the work."""


@actor("bench.hang", max_retries=0)
def hang(payload: dict, ctx: Context) -> None:
    """Record our pid, ignore SIGTERM and spin forever."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with open(payload["pidfile"], "w") as f:
        f.write(str(os.getpid()))
    while True:
        pass


@actor("bench.keyed", max_retries=0, key_concurrency=1)
def keyed(payload: object, ctx: Context) -> None:
    """Do nothing, one job of a key at a time (`concurrency_key`): keys' cost, not work."""
