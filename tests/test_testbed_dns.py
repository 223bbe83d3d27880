"""The testbed's authoritative DNS server, queried with real dnspython clients (UDP and TCP)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import dns.asyncresolver
import dns.flags
import dns.message
import dns.query
import dns.rcode
import dns.resolver
import pytest

from verimail.testbed.server import Testbed
from verimail.testbed.world import DomainSpec, HostBehaviour, HostSpec, World

MakeTestbed = Callable[..., Testbed]


def dns_world() -> World:
    return World.of(
        [
            HostSpec("mx1.acme.test", HostBehaviour(mailboxes={"alice"})),
            HostSpec("mx2.acme.test"),
            HostSpec("web.implicit.test"),
            HostSpec("internal.evil.test", address="10.0.0.1"),
            HostSpec("six.evil.test", address="::1"),
        ],
        [
            DomainSpec(
                "acme.test",
                mx=[(10, "mx1.acme.test"), (20, "mx2.acme.test")],
                txt=["v=spf1 mx -all", "x" * 300],
            ),
            DomainSpec("nullmx.test", mx=[(0, ".")]),
            DomainSpec("implicit.test", a=["web.implicit.test", "::1", "192.0.2.7"]),
            DomainSpec("evil.test", mx=[(10, "internal.evil.test"), (20, "six.evil.test")]),
            DomainSpec("dangling.test", mx=[(10, "mx.nowhere.test")]),
            DomainSpec("broken.test", servfail=True, mx=[(10, "mx1.acme.test")]),
            DomainSpec("slow.test", mx=[(10, "mx1.acme.test")], dns_delay=0.4, ttl=60),
            DomainSpec("bigtxt.test", txt=[f"record-{i}-" + "y" * 200 for i in range(12)]),
        ],
    )


@pytest.fixture
def tb(testbed_factory: MakeTestbed) -> Testbed:
    return testbed_factory(dns_world())


def query(tb: Testbed, name: str, rdtype: str, tcp: bool = False) -> dns.message.Message:
    ip, port = tb.nameserver
    q = dns.message.make_query(name, rdtype)
    if tcp:
        return dns.query.tcp(q, ip, port=port, timeout=3)
    return dns.query.udp(q, ip, port=port, timeout=3)


def resolver(tb: Testbed) -> dns.resolver.Resolver:
    ip, port = tb.nameserver
    res = dns.resolver.Resolver(configure=False)
    res.nameservers = [ip]
    res.port = port
    res.lifetime = 3
    return res


@pytest.mark.parametrize("tcp", [False, True])
def test_mx_records_in_preference_order_over_udp_and_tcp(tb: Testbed, tcp: bool) -> None:
    response = query(tb, "ACME.test", "MX", tcp=tcp)
    assert response.rcode() == dns.rcode.NOERROR
    assert response.flags & dns.flags.AA
    (rrset,) = response.answer
    assert rrset.ttl == 300
    # Name compression may reuse the question's spelling: compare case-insensitively.
    assert sorted((r.preference, r.exchange.to_text().lower()) for r in rrset) == [
        (10, "mx1.acme.test."),
        (20, "mx2.acme.test."),
    ]


def test_resolver_sees_hosts_and_records(tb: Testbed) -> None:
    res = resolver(tb)
    assert [r.address for r in res.resolve("mx1.acme.test", "A")] == [
        tb.address_of("mx1.acme.test")
    ]
    txt = sorted(b"".join(r.strings).decode() for r in res.resolve("acme.test", "TXT"))
    assert txt == ["v=spf1 mx -all", "x" * 300]
    null = res.resolve("nullmx.test", "MX")
    assert [(r.preference, r.exchange.to_text()) for r in null] == [(0, ".")]


def test_implicit_mx_domain_has_a_and_aaaa_but_no_mx(tb: Testbed) -> None:
    res = resolver(tb)
    with pytest.raises(dns.resolver.NoAnswer):
        res.resolve("implicit.test", "MX")
    a = sorted(r.address for r in res.resolve("implicit.test", "A"))
    assert a == sorted([tb.address_of("web.implicit.test"), "192.0.2.7"])
    assert [r.address for r in res.resolve("implicit.test", "AAAA")] == ["::1"]


def test_fixed_addresses_are_served_as_is(tb: Testbed) -> None:
    res = resolver(tb)
    assert [r.address for r in res.resolve("internal.evil.test", "A")] == ["10.0.0.1"]
    assert [r.address for r in res.resolve("six.evil.test", "AAAA")] == ["::1"]
    with pytest.raises(dns.resolver.NoAnswer):
        res.resolve("six.evil.test", "A")
    assert tb.address_of("internal.evil.test") == "10.0.0.1"


def test_negative_answers(tb: Testbed) -> None:
    nx = query(tb, "nosuchdomain.test", "MX")
    assert nx.rcode() == dns.rcode.NXDOMAIN
    assert nx.authority and nx.authority[0].rdtype == dns.rdatatype.SOA
    # An MX target that is no host of the world has no address.
    assert query(tb, "mx.nowhere.test", "A").rcode() == dns.rcode.NXDOMAIN
    nodata = query(tb, "acme.test", "AAAA")
    assert nodata.rcode() == dns.rcode.NOERROR and not nodata.answer
    assert query(tb, "mx1.acme.test", "MX").answer == []
    assert query(tb, "broken.test", "MX").rcode() == dns.rcode.SERVFAIL
    assert query(tb, "broken.test", "A", tcp=True).rcode() == dns.rcode.SERVFAIL
    res = resolver(tb)
    with pytest.raises(dns.resolver.NXDOMAIN):
        res.resolve("nosuchdomain.test", "MX")
    with pytest.raises(dns.resolver.NoNameservers):  # SERVFAIL from the only server
        res.resolve("broken.test", "MX")


def test_large_answers_truncate_on_udp_and_resolver_retries_on_tcp(tb: Testbed) -> None:
    ip, port = tb.nameserver
    q = dns.message.make_query("bigtxt.test", "TXT", use_edns=False)
    udp = dns.query.udp(q, ip, port=port, timeout=3, ignore_trailing=True)
    assert udp.flags & dns.flags.TC and not udp.answer
    answer = resolver(tb).resolve("bigtxt.test", "TXT")
    assert len(answer) == 12


def test_queries_are_counted_by_name_and_type(tb: Testbed) -> None:
    query(tb, "Acme.Test.", "MX")
    query(tb, "acme.test", "MX", tcp=True)
    query(tb, "nosuch.test", "A")
    counts = tb.dns_queries
    assert counts[("acme.test", "MX")] == 2
    assert counts[("nosuch.test", "A")] == 1
    tb.reset_stats()
    assert tb.dns_queries == {}


def test_ttl_and_delay_per_domain(tb: Testbed) -> None:
    started = time.perf_counter()
    response = query(tb, "slow.test", "MX")
    assert time.perf_counter() - started >= 0.4
    assert response.answer[0].ttl == 60


def test_world_default_delay_and_ttl(testbed_factory: MakeTestbed) -> None:
    world = dns_world()
    world.dns_delay, world.dns_ttl = 0.2, 42
    tb = testbed_factory(world)
    started = time.perf_counter()
    response = query(tb, "acme.test", "MX")
    assert time.perf_counter() - started >= 0.2
    assert response.answer[0].ttl == 42


async def test_a_slow_answer_does_not_hold_up_others(tb: Testbed) -> None:
    """Async resolver from the test's own loop; the testbed's loop runs in its thread."""
    ip, port = tb.nameserver
    res = dns.asyncresolver.Resolver(configure=False)
    res.nameservers = [ip]
    res.port = port
    res.lifetime = 3
    finished: list[str] = []

    async def resolve(name: str) -> None:
        await res.resolve(name, "MX")
        finished.append(name)

    await asyncio.gather(resolve("slow.test"), resolve("acme.test"))
    assert finished == ["acme.test", "slow.test"]
