"""``DomainResolver`` against the testbed's nameserver: which servers it asks, and how long
it keeps what they said (real DNS packets on loopback)."""

from __future__ import annotations

import socket
import time

from verimail.engine import dns_facts
from verimail.engine.dns_facts import NEGATIVE_TTL, DomainResolver
from verimail.schemas.outcomes import DomainOutcome
from verimail.testbed.world import DomainSpec, HostBehaviour, HostSpec, World

HOSTS = [
    HostSpec("mx.old.test", HostBehaviour(mailboxes={"alice"})),
    HostSpec("mx.new.test", HostBehaviour(mailboxes={"alice"})),
]


def _cached_for(name: str, rdtype: str) -> float:
    """Seconds the cached answer for ``name``/``rdtype`` has left."""
    now = time.monotonic()
    left = [
        exp - now for (_, n, t), (exp, _) in dns_facts._CACHE.items() if (n, t) == (name, rdtype)
    ]
    assert len(left) == 1, (name, rdtype, left)
    return left[0]


async def test_a_silent_first_nameserver_leaves_time_to_ask_the_next(
    testbed_factory, tmp_path, testbed_settings, outside_connections
):
    """Each server gets its share of ``dns_timeout``: the first one taking all of it made
    every domain unknown/dns_error though the second answered at once."""
    tb = testbed_factory(World.of(HOSTS, [DomainSpec("acme.test", mx=[(10, "mx.old.test")])]))
    hole = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # bound, never read: no answer
    hole.bind(("127.0.0.77", 0))
    ip, port = tb.nameserver
    try:
        servers = [f"127.0.0.77:{hole.getsockname()[1]}", f"{ip}:{port}"]
        # 4 s each: the silent one's share is waited out; the testbed must answer within
        # the other's on a busy machine too (issue 48).
        settings = testbed_settings(tb, tmp_path, dns_timeout=8.0, dns_nameservers=servers)
        dns_facts.clear_cache()
        facts = await DomainResolver(settings).facts("acme.test")
    finally:
        hole.close()
    assert (facts.outcome, facts.mx_records) == (DomainOutcome.OK, ("mx.old.test",)), facts
    assert outside_connections == []


async def test_an_answer_through_a_cname_is_kept_for_the_shortest_ttl_on_the_way(
    testbed_factory, tmp_path, testbed_settings
):
    """alias.test is a CNAME (TTL 5) to old.test, whose MX has TTL 3600: the alias may be
    moved in 5 s, so its MX answer is kept 5 s, not an hour."""
    tb = testbed_factory(
        World.of(
            HOSTS,
            [
                DomainSpec("alias.test", cname="old.test", ttl=5),
                DomainSpec("old.test", mx=[(10, "mx.old.test")], ttl=3600),
            ],
        )
    )
    dns_facts.clear_cache()
    facts = await DomainResolver(testbed_settings(tb, tmp_path)).facts("alias.test")
    assert facts.mx_records == ("mx.old.test",)
    assert 0 < _cached_for("alias.test", "MX") <= 5


async def test_negative_answers_are_kept_as_long_as_the_zones_soa_says(
    testbed_factory, tmp_path, testbed_settings
):
    """RFC 2308: an NXDOMAIN or no-data answer may be cached for the SOA's TTL and MINIMUM
    (7 s here), so a domain registered a moment ago is seen soon; at most NEGATIVE_TTL."""
    domains = [DomainSpec("mailless.test", a=["127.0.0.9"])]
    tb = testbed_factory(World.of(HOSTS, domains, dns_ttl=7))
    resolver = DomainResolver(testbed_settings(tb, tmp_path))
    dns_facts.clear_cache()
    missing = await resolver.facts("fresh.test")
    assert missing.outcome is DomainOutcome.NXDOMAIN
    assert 0 < _cached_for("fresh.test", "MX") <= 7
    await resolver.facts("mailless.test")  # no MX: the A record stands in (implicit MX)
    assert 0 < _cached_for("mailless.test", "MX") <= 7

    tb.replace_world(World.of(HOSTS, domains, dns_ttl=3600))
    dns_facts.clear_cache()
    await resolver.facts("fresh.test")
    assert 7 < _cached_for("fresh.test", "MX") <= NEGATIVE_TTL
