"""The webhook egress policy: which addresses are public, what an enqueue refuses outright,
and the resolver that checks every address a name resolves to.

No test here sends a packet: addresses are classified, and the resolver under test wraps
a fake one, so no name is ever looked up on the network.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket

import pytest
from aiohttp.abc import AbstractResolver, ResolveResult
from goqueue.supervisor.common.errors import ConfigError
from goqueue.supervisor.settings import config
from goqueue.supervisor.settings.config import network_problem
from goqueue.supervisor.webhooks.egress import (
    EgressPolicy,
    EgressRefused,
    GuardedResolver,
    address_problem,
    literal_address,
)

pytestmark = pytest.mark.timeout(10)

REFUSED = {
    "127.0.0.1": "loopback",
    "127.255.0.9": "loopback",
    "::1": "loopback",
    "10.0.0.1": "private",
    "172.16.5.4": "private",
    "192.168.1.1": "private",
    "fc00::1": "private",
    "fd12:3456::1": "private",
    "169.254.169.254": "link-local",
    "fe80::1": "link-local",
    "100.64.0.1": "CGNAT",
    "100.127.255.254": "CGNAT",
    "224.0.0.1": "multicast",
    "239.255.255.250": "multicast",
    "ff02::1": "multicast",
    "0.0.0.0": "unspecified",
    "::": "unspecified",
    "240.0.0.1": "reserved",
    "255.255.255.255": "reserved",  # broadcast
    "192.0.2.1": "private",  # TEST-NET-1, documentation
    "2001:db8::1": "private",  # documentation
    "fec0::1": "site-local",
    "::ffff:127.0.0.1": "loopback",  # IPv4-mapped: judged by the IPv4 inside
    "::ffff:169.254.169.254": "link-local",
    "64:ff9b::a00:1": "private",  # NAT64 of 10.0.0.1
    "2002:7f00:1::": "loopback",  # 6to4 of 127.0.0.1
    "::7f00:1": "reserved",  # IPv4-compatible, deprecated
}
PUBLIC = ["8.8.8.8", "1.1.1.1", "93.184.215.14", "2606:4700:4700::1111", "::ffff:8.8.8.8"]


@pytest.mark.parametrize(("address", "why"), REFUSED.items())
def test_non_public_addresses_are_refused_saying_why(address: str, why: str) -> None:
    problem = address_problem(ipaddress.ip_address(address))
    assert problem is not None and why in problem


@pytest.mark.parametrize("address", PUBLIC)
def test_public_addresses_are_allowed(address: str) -> None:
    assert address_problem(ipaddress.ip_address(address)) is None
    assert EgressPolicy().address_refusal(ipaddress.ip_address(address)) is None


@pytest.mark.parametrize(
    ("text", "address"),
    [
        ("127.1", "127.0.0.1"),  # legacy forms a resolver accepts
        ("2130706433", "127.0.0.1"),
        ("0x7f.1", "127.0.0.1"),
        ("fe80::1%eth0", "fe80::1"),
        ("::ffff:7f00:1", "::ffff:127.0.0.1"),
        ("example.com", None),
        ("localhost", None),
    ],
)
def test_literal_addresses_in_every_spelling(text: str, address: str | None) -> None:
    found = literal_address(text)
    assert (None if found is None else str(found)) == (
        None if address is None else str(ipaddress.ip_address(address))
    )


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1",
        "http://127.0.0.1:8080/hook",
        "http://[::1]/",
        "http://localhost:5432",
        "http://LOCALHOST./x",
        "http://api.localhost/x",
        "http://169.254.169.254/latest/meta-data/",
        "http://10.0.0.1",
        "http://[::ffff:127.0.0.1]/",
        "http://[fe80::1%25eth0]/",
        "http://0.0.0.0:80/",
        "http://127.1/",
        "http://2130706433/",
        "https://user:pw@192.168.0.10/hook?token=x",
        "ftp://example.com/hook",
        "file:///etc/passwd",
        "http:///nohost",
    ],
)
def test_urls_refused_at_enqueue(url: str) -> None:
    assert EgressPolicy().url_refusal(url) is not None


@pytest.mark.parametrize(
    "url",
    ["https://hooks.example.com/x", "http://93.184.215.14:8443/h", "http://[2606:4700::1111]/"],
)
def test_urls_left_to_the_connection_check(url: str) -> None:
    # names are judged when a delivery connects; public literals are fine now
    assert EgressPolicy().url_refusal(url) is None


def test_refusals_name_the_address_and_its_kind() -> None:
    refusal = EgressPolicy().url_refusal("http://169.254.169.254/")
    link_local = "a link-local address, where cloud metadata lives"
    assert refusal == f"must not point at 169.254.169.254 ({link_local})"
    assert "localhost" in (EgressPolicy().url_refusal("http://localhost:5432") or "")


def test_allowed_hosts_and_networks_open_exceptions() -> None:
    policy = EgressPolicy.of(["Receiver.internal.", "127.0.0.1"], ["10.20.0.0/16"])
    assert policy.url_refusal("http://127.0.0.1:9000/") is None
    assert policy.url_refusal("http://receiver.internal/hook") is None
    assert policy.url_refusal("http://10.20.3.4/") is None
    assert policy.url_refusal("http://10.21.0.1/") is not None  # outside the network
    assert policy.url_refusal("http://[::1]/") is not None  # not the allowed host
    networks = EgressPolicy.of(None, ["127.0.0.0/8"])
    assert networks.address_refusal(ipaddress.ip_address("::ffff:127.0.0.5")) is None
    assert networks.url_refusal("http://localhost/") is None  # loopback by definition
    assert networks.url_refusal("http://api.localhost:9999/") is None
    refusal = EgressPolicy().url_refusal("http://localhost:9999") or ""
    assert "--webhook-allow-networks 127.0.0.0/8" in refusal  # says which option allows it


@pytest.mark.parametrize("text", ["10.0.0.0/33", "not-a-net", "10.0.0.0/8/1", ""])
def test_bad_networks_are_refused_by_the_configuration(text: str) -> None:
    assert network_problem(text) is not None
    if text:
        with pytest.raises(ConfigError, match="webhook_allow_networks"):
            config.load(None, {"GOQUEUE_WEBHOOK_ALLOW_NETWORKS": f"10.1.0.0/16,{text}"})


def test_networks_are_read_from_every_source() -> None:
    loaded = config.load(None, {"GOQUEUE_WEBHOOK_ALLOW_NETWORKS": "127.0.0.0/8, fd00::/8"})
    assert loaded.webhook_allow_networks == ("127.0.0.0/8", "fd00::/8")
    assert config.load(None, {}).webhook_allow_networks is None


class FakeResolver(AbstractResolver):
    """Answers from a table, as DNS would (a rebinding name answers what it likes)."""

    def __init__(self, table: dict[str, list[str]]) -> None:
        self.table = table
        self.asked: list[str] = []

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        self.asked.append(host)
        return [
            ResolveResult(
                hostname=host,
                host=address,
                port=port,
                family=socket.AF_INET6 if ":" in address else socket.AF_INET,
                proto=0,
                flags=0,
            )
            for address in self.table[host]
        ]

    async def close(self) -> None:
        pass


def test_the_resolver_checks_every_resolved_address() -> None:
    table = {
        "rebound.example": ["127.0.0.1"],
        "metadata.example": ["169.254.169.254", "fd00::1"],
        "mixed.example": ["10.0.0.1", "93.184.215.14"],
        "public.example": ["93.184.215.14", "2606:4700::1111"],
        "trusted.internal": ["10.1.2.3"],
    }

    async def scenario() -> None:
        policy = EgressPolicy.of(["trusted.internal"], None)
        resolver = GuardedResolver(policy, FakeResolver(table))
        with pytest.raises(EgressRefused, match=r"rebound.example .*127\.0\.0\.1 \(a loopback"):
            await resolver.resolve("rebound.example", 80)
        with pytest.raises(EgressRefused, match=r"169\.254\.169\.254.*fd00::1"):
            await resolver.resolve("metadata.example", 80)
        # only the allowed addresses are handed to the connector
        mixed = await resolver.resolve("mixed.example", 80)
        assert [r["host"] for r in mixed] == ["93.184.215.14"]
        public = await resolver.resolve("public.example", 443)
        assert [r["host"] for r in public] == table["public.example"]
        trusted = await resolver.resolve("trusted.internal", 80)
        assert [r["host"] for r in trusted] == ["10.1.2.3"]
        await resolver.close()

    asyncio.run(scenario())
