"""Who can reach the API: a node on loopback is reachable from its own host only; one on
any other address is open to its network, and without an API key anyone there may
enqueue, cancel, pause and replay. That case is logged loudly at start, shown by /ready
(`checks.auth`, informational) and exported as `goqueue_api_open`."""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass

from goqueue.supervisor.settings.config import Settings

LOCALHOST = "localhost"


@dataclass(frozen=True, slots=True)
class Exposure:
    """Where a node listens and whether its API needs a key."""

    host: str
    loopback: bool
    has_key: bool

    @classmethod
    def of(cls, settings: Settings) -> Exposure:
        """The exposure `settings` ask for (the bind address is resolved once, here)."""
        return cls(settings.host, is_loopback(settings.host), bool(settings.api_key))

    @property
    def open(self) -> bool:
        """True when anyone who can reach the port may use the API."""
        return not self.loopback and not self.has_key

    def warning(self) -> str:
        """What the log and /ready say when the API is open."""
        return (
            f"the API listens on {self.host or 'every interface'} with no API key: anyone "
            "who can reach the port may enqueue, cancel, pause and replay jobs; set "
            "--api-key (GOQUEUE_API_KEY) or bind 127.0.0.1"
        )


def is_loopback(host: str) -> bool:
    """True when every address `host` names is a loopback address (127.0.0.0/8, ::1);
    the empty host and unspecified addresses (0.0.0.0, ::) mean every interface."""
    if not host:
        return False
    if host.lower() == LOCALHOST:
        return True
    try:
        return _loopback(ipaddress.ip_address(host))
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return False  # cannot tell: assume the worst, and say so
    return bool(infos) and all(_loopback(_address(str(info[4][0]))) for info in infos)


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    return ipaddress.ip_address(text.split("%", 1)[0])  # drop an IPv6 scope (`%eth0`)


def _loopback(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback
