"""Where webhooks may go: the egress policy, checked twice.

A job's `webhook_url` is chosen by whoever enqueues it, and the node POSTs the job there,
so an open policy lets any client make the node reach what only the node can reach:
the database port on loopback, the cloud metadata service at 169.254.169.254, the
private network behind it. By default only http(s) to public (globally routable)
addresses is allowed; `allow_hosts` and `allow_networks` open specific exceptions.

The policy is checked when a job is enqueued, where it can be judged without DNS (an
IP literal, `localhost`), and again on every connection, on the addresses the name
resolved to (`GuardedResolver`), so a name that resolves to a public address at
enqueue and to 127.0.0.1 later (DNS rebinding) is refused all the same.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass

from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver
from yarl import URL

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

SCHEMES = frozenset({"http", "https"})
CGNAT = ipaddress.IPv4Network("100.64.0.0/10")
NAT64 = ipaddress.IPv6Network("64:ff9b::/96")  # embeds an IPv4 address in its last 32 bits
SITE_LOCAL = ipaddress.IPv6Network("fec0::/10")  # deprecated, but routed like private
LOOPBACKS = (ipaddress.IPv4Address("127.0.0.1"), ipaddress.IPv6Address("::1"))


class EgressRefused(OSError):
    """A connection the egress policy does not allow (raised by `GuardedResolver`: an
    `OSError`, so aiohttp reports it as a connection error that carries it)."""


def address_problem(address: Address) -> str | None:
    """Why `address` is not a public destination, or None when it is.

    IPv4 addresses inside IPv6 (mapped `::ffff:a.b.c.d`, NAT64, 6to4) are judged by the
    IPv4 address they carry, so `::ffff:127.0.0.1` is loopback."""
    if isinstance(address, ipaddress.IPv6Address):
        inner = _embedded_ipv4(address)
        if inner is not None:
            return address_problem(inner)
        if address in SITE_LOCAL:
            return "a site-local address"
    checks = (
        (address.is_unspecified, "an unspecified address"),
        (address.is_loopback, "a loopback address"),
        (address.is_link_local, "a link-local address, where cloud metadata lives"),
        (address.is_multicast, "a multicast address"),
        (isinstance(address, ipaddress.IPv4Address) and address in CGNAT, "a CGNAT address"),
        (address.is_reserved, "a reserved address"),
        (address.is_private, "a private address"),
        (not address.is_global, "not a public address"),
    )
    for refused, why in checks:
        if refused:
            return why
    return None


def _embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address in NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def literal_address(host: str) -> Address | None:
    """`host` as an IP address when it is one, in any form a resolver would accept:
    `::1`, `fe80::1%eth0`, and the legacy IPv4 spellings `127.1`, `2130706433`, `0x7f.1`."""
    try:
        return ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        pass
    try:
        return ipaddress.IPv4Address(socket.inet_aton(host))
    except (OSError, ValueError):
        return None


def _host_key(host: str) -> str:
    """A host name as compared: lower case, without the root's trailing dot."""
    return host.lower().rstrip(".")


@dataclass(frozen=True, slots=True)
class EgressPolicy:
    """What webhooks may reach: public addresses, plus the hosts and networks allowed.

    A host in `allow_hosts` is trusted whatever it resolves to (compare the name in the
    URL, case-insensitively); an address in `allow_networks` is allowed whatever name led
    to it."""

    allow_hosts: frozenset[str] = frozenset()
    allow_networks: tuple[Network, ...] = ()

    @classmethod
    def of(cls, hosts: Iterable[str] | None, networks: Iterable[str] | None) -> EgressPolicy:
        """The policy of the options `webhook_allow_hosts` and `webhook_allow_networks`
        (already checked by the configuration)."""
        return cls(
            frozenset(_host_key(h) for h in hosts or ()),
            tuple(ipaddress.ip_network(n, strict=False) for n in networks or ()),
        )

    def trusts(self, host: str) -> bool:
        """True when `host` is allowed whatever it resolves to."""
        return _host_key(host) in self.allow_hosts

    def address_refusal(self, address: Address) -> str | None:
        """Why a connection to `address` is refused, or None when it is allowed."""
        if any(address in network for network in self.allow_networks):
            return None
        inner = _embedded_ipv4(address) if isinstance(address, ipaddress.IPv6Address) else None
        if inner is not None and any(inner in network for network in self.allow_networks):
            return None
        problem = address_problem(address)
        return None if problem is None else f"{address} ({problem})"

    def url_refusal(self, url: str) -> str | None:
        """Why `url` can never receive webhooks, judged without DNS, or None.

        Refused: a scheme other than http(s), no host, an IP literal the policy refuses,
        and `localhost` (or a name under it), which only ever means this machine. Other
        names are judged when a delivery connects (`GuardedResolver`)."""
        try:
            target = URL(url)
        except (TypeError, ValueError):
            return "is not a valid URL"
        if target.scheme not in SCHEMES or not target.host:
            return "must be an absolute http(s) URL"
        host = target.host
        if self.trusts(host):
            return None
        address = literal_address(host)
        if address is not None:
            refusal = self.address_refusal(address)
            return None if refusal is None else f"must not point at {refusal}"
        name = _host_key(host)
        if name == "localhost" or name.endswith(".localhost"):
            # Such a name only ever means this machine (RFC 6761): judge it as loopback,
            # which `allow_networks` may open; each connection still checks its address.
            if any(self.address_refusal(a) is None for a in LOOPBACKS):
                return None
            return (
                f"must not point at {host} (this machine): allow it with "
                "--webhook-allow-networks 127.0.0.0/8 (or --webhook-allow-hosts "
                f"{name})"
            )
        return None


class GuardedResolver(AbstractResolver):
    """A resolver that only answers addresses the policy allows (checked on every
    lookup, so on every new connection); raises `EgressRefused` when none is left.

    IP literals never reach a resolver (aiohttp connects to them directly): those are
    checked with `EgressPolicy.url_refusal` before each request."""

    def __init__(self, policy: EgressPolicy, inner: AbstractResolver | None = None) -> None:
        self.policy = policy
        self._inner = inner or DefaultResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        """The addresses of `host` the policy allows (all of them for a trusted host)."""
        found = await self._inner.resolve(host, port, family)
        if self.policy.trusts(host):
            return found
        allowed: list[ResolveResult] = []
        refusals: list[str] = []
        for result in found:
            refusal = self.policy.address_refusal(ipaddress.ip_address(result["host"]))
            if refusal is None:
                allowed.append(result)
            else:
                refusals.append(refusal)
        if not allowed:
            refused = ", ".join(refusals) or "no address"
            raise EgressRefused(f"{host} resolves only to refused addresses: {refused}")
        return allowed

    async def close(self) -> None:
        """Close the resolver it wraps."""
        await self._inner.close()
