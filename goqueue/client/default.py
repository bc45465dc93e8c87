"""The client that `Actor.send()` uses when none is given, configured once per program.

`goqueue.configure(url=..., api_key=...)` (or $GOQUEUE_URL / $GOQUEUE_API_KEY) says
where; the clients are made on first use. This is the one piece of process-wide state in
GoQueue, and only a producer's convenience: nodes and workers never read it, and every
call can pass its own `client=` instead. The blocking client is shared by all threads;
async code gets one `AsyncClient` per event loop, closed when that loop shuts down.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from goqueue.client.calls import DEFAULT_TIMEOUT, Retries

if TYPE_CHECKING:
    from goqueue.client.aio import AsyncClient
    from goqueue.client.sync import Client


@dataclass(frozen=True, slots=True)
class Settings:
    """Where and how the default clients connect (None: from the environment)."""

    url: str | None = None
    api_key: str | None = None
    timeout: float = DEFAULT_TIMEOUT
    retries: Retries = field(default_factory=Retries)


@dataclass(slots=True)
class _Loop:
    """One event loop's client, and the generator whose closing closes it."""

    loop: asyncio.AbstractEventLoop
    client: AsyncClient
    closer: AsyncIterator[None]
    settings: Settings


class _Defaults:
    """The configured settings and the clients made from them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.settings = Settings()
        self.client: Client | None = None
        self.loops: dict[int, _Loop] = {}


_DEFAULTS = _Defaults()


def configure(
    url: str | None = None,
    api_key: str | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    retries: Retries | None = None,
) -> None:
    """Say once where `Actor.send()` / `send_async()` enqueue: the node's `url` (else
    $GOQUEUE_URL, else http://127.0.0.1:8080) and `api_key` (else $GOQUEUE_API_KEY).
    Clients made before are replaced on their next use."""
    from goqueue.client.sync import Client

    settings = Settings(url, api_key, timeout, retries or Retries())
    Client(settings.url, settings.api_key).close()  # a bad URL fails here, not at send
    with _DEFAULTS.lock:
        _DEFAULTS.settings = settings
        old, _DEFAULTS.client = _DEFAULTS.client, None
    if old is not None:
        old.close()


def client() -> Client:
    """The shared blocking client, made on first use."""
    from goqueue.client.sync import Client

    with _DEFAULTS.lock:
        if _DEFAULTS.client is None:
            s = _DEFAULTS.settings
            _DEFAULTS.client = Client(s.url, s.api_key, s.timeout, retries=s.retries)
        return _DEFAULTS.client


async def async_client() -> AsyncClient:
    """This event loop's client, made on first use and closed when the loop shuts down
    its async generators (`asyncio.run` and `uvloop.run` do, on the way out)."""
    from goqueue.client.aio import AsyncClient

    loop = asyncio.get_running_loop()
    with _DEFAULTS.lock:
        settings = _DEFAULTS.settings
        entry = _DEFAULTS.loops.get(id(loop))
    if entry is not None and entry.loop is loop and entry.settings is settings:
        return entry.client
    if entry is not None and entry.loop is loop:  # configure() since: replace it
        await entry.client.close()
    made = AsyncClient(settings.url, settings.api_key, settings.timeout, retries=settings.retries)
    closer = _closing(id(loop), made)
    await anext(closer)  # started: the loop now closes it at shutdown
    with _DEFAULTS.lock:
        _DEFAULTS.loops[id(loop)] = _Loop(loop, made, closer, settings)
    return made


async def _closing(key: int, made: AsyncClient) -> AsyncIterator[None]:
    """Suspended until the loop's `shutdown_asyncgens()` closes it; then closes `made`
    (so its connections go without "unclosed session" warnings) and forgets it."""
    try:
        yield
    finally:
        with _DEFAULTS.lock:
            entry = _DEFAULTS.loops.get(key)
            if entry is not None and entry.client is made:
                del _DEFAULTS.loops[key]
        await made.close()
