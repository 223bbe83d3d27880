"""Hostile mail servers and hostile DNS: every address ends ``unknown`` with a reason, in a
time bounded by the configured timeouts, with bounded memory, and with no socket or task
left behind.

The servers are testbed hosts with ``HostBehaviour.hostile`` set; the DNS tricks (thousands
of MX records that only fit over TCP, CNAME loops, extreme TTLs) are testbed zones. Timeouts
are small here (two seconds), so each bound below is well under a minute.
"""

from __future__ import annotations

import asyncio
import gc
import os
import re
import time
import tracemalloc

import pytest
from hardening_helpers import scaled

from verimail.config import Settings
from verimail.engine import dns_facts
from verimail.engine.core import Engine
from verimail.engine.smtp.group_run import MAX_ATTEMPTS
from verimail.engine.smtp.host_slots import host_semaphore
from verimail.engine.smtp.prober import MAX_CONNECT_ATTEMPTS
from verimail.schemas.outcomes import Status, SubStatus
from verimail.testbed.server import Testbed
from verimail.testbed.world import DomainSpec, HostBehaviour, HostSpec, World

# Connect and command timeout of these tests, seconds: the silent and muted hosts wait it
# out, and every other hostile host must have shown its trick (a garbage banner, a 10 MB
# one) within it — at 0.5 s a busy machine's loopback could miss that (issue 48).
TIMEOUT = 2.0
SLACK = 10.0  # seconds over a bound computed from the settings: a busy machine's room

# mode -> (extra behaviour, the sub-statuses that are a right answer)
HOSTILE: dict[str, tuple[dict, set[SubStatus]]] = {
    "silent": ({}, {SubStatus.TIMEOUT}),
    "garbage_banner": ({}, {SubStatus.PROTOCOL_ERROR}),
    "huge_banner": ({"hostile_bytes": 10 * 1024 * 1024}, {SubStatus.PROTOCOL_ERROR}),
    "endless_line": ({"hostile_bytes": 1 << 30}, {SubStatus.PROTOCOL_ERROR}),
    "endless_multiline": ({"hostile_bytes": 1 << 30}, {SubStatus.PROTOCOL_ERROR}),
    "slow_multiline": ({"hostile_bytes": 1 << 30, "hostile_interval": 0.01}, {SubStatus.TIMEOUT}),
    "rcpt_code_999": ({}, {SubStatus.PROTOCOL_ERROR}),
    "rcpt_code_garbage": ({}, {SubStatus.PROTOCOL_ERROR}),
    "mute_after_ehlo": ({}, {SubStatus.TIMEOUT}),
    "reset_mid_rcpt": ({}, {SubStatus.CONNECTION_FAILED}),
}


def _mode(label: str) -> str:
    return "endless_multiline" if label == "slow_multiline" else label


def _slug(label: str) -> str:
    return label.replace("_", "-")


def hostile_world(per_domain: int) -> tuple[World, dict[str, list[str]]]:
    """One domain per hostile behaviour with ``per_domain`` addresses each."""
    hosts, domains, addresses = [], [], {}
    for label, (extra, _) in HOSTILE.items():
        host = f"mx.{_slug(label)}.hostile.test"
        domain = f"{_slug(label)}.hostile.test"
        hosts.append(HostSpec(host, HostBehaviour(hostile=_mode(label), **extra)))
        domains.append(DomainSpec(domain, mx=[(10, host)]))
        addresses[label] = [f"user{i}@{domain}" for i in range(per_domain)]
    return World.of(hosts, domains), addresses


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def _assert_fds_back_to(before: int) -> None:
    """The process has no more open fds than ``before`` (polled: a closed transport
    releases its socket on a later loop turn)."""
    for _ in range(200):
        if _open_fds() <= before:
            return
        await asyncio.sleep(0.01)
    assert _open_fds() <= before, (before, _open_fds(), os.listdir("/proc/self/fd"))


def _settings(tb: Testbed, tmp_path, testbed_settings, **overrides) -> Settings:
    values = {
        "smtp_connect_timeout": TIMEOUT,
        "smtp_command_timeout": TIMEOUT,
        "smtp_greylist_retries": 1,
        **overrides,
    }
    return testbed_settings(tb, tmp_path, **values)


def _bound(settings: Settings) -> float:
    """The worst time one hostile host group may take, from the settings alone — and not
    from the number of its recipients.

    Opening a session dials at most ``MAX_CONNECT_ATTEMPTS`` addresses; a host that breaks
    ``MAX_ATTEMPTS`` sessions in a row (each: connect, EHLO, one timed-out command) is
    dropped with all its remaining recipients. Plus ``SLACK`` for a loaded CI machine.
    """
    per_session = settings.smtp_connect_timeout + 3 * settings.smtp_command_timeout
    return MAX_CONNECT_ATTEMPTS * settings.smtp_connect_timeout + MAX_ATTEMPTS * per_session + SLACK


async def _run_hostile(
    testbed_factory, tmp_path, testbed_settings, per_domain: int
) -> tuple[Settings, float, float]:
    """Verify ``per_domain`` addresses on every hostile host at once; check each result and
    that nothing leaked. Returns the settings, the elapsed seconds and peak memory."""
    world, addresses = hostile_world(per_domain)
    tb = testbed_factory(world)
    settings = _settings(tb, tmp_path, testbed_settings)
    engine = Engine(settings)
    everything = [a for group in addresses.values() for a in group]

    fds_before = _open_fds()
    tasks_before = asyncio.all_tasks()
    gc.collect()
    tracemalloc.start()
    started = time.monotonic()
    try:
        batch = await engine.verify_many(everything)
        elapsed = time.monotonic() - started
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    by_email = {r.email: r for r in batch.results}
    for label, (_, allowed) in HOSTILE.items():
        for email in addresses[label]:
            result = by_email[email]
            assert result.status is Status.UNKNOWN, (label, result.status, result.reason)
            assert result.sub_status in allowed, (label, result.sub_status, result.smtp_response)
            assert result.reason, label
            # SPEC §2.2: null without an SMTP reply (a timeout, garbage); a reply is quoted
            # as received, one line, and a 10 MB banner is not echoed back.
            reply = result.smtp_response
            assert reply is None or re.match(r"[2-5]\d\d( |$)", reply), (label, reply)
            assert reply is None or len(reply) <= 300
            assert result.safe_to_send is False
    # Every socket we opened is closed (the servers' side closes once ours did), and no
    # task of ours is left running.
    assert tb.wait_idle(), "sessions still open on the testbed"
    await _assert_fds_back_to(fds_before)
    assert asyncio.all_tasks() == tasks_before
    assert tb.total_stats().data == 0
    return settings, elapsed, peak


async def test_hostile_servers_end_unknown_in_bounded_time(
    testbed_factory, tmp_path, testbed_settings, outside_connections
):
    settings, elapsed, peak = await _run_hostile(
        testbed_factory, tmp_path, testbed_settings, per_domain=5
    )
    print(f"hostile run: {elapsed:.2f} s, peak traced memory {peak / 1e6:.1f} MB")
    assert elapsed < _bound(settings), elapsed
    # A 10 MB banner and endless lines never sit in our memory: replies are capped.
    assert peak < 8 * 1024 * 1024, peak
    assert outside_connections == []


@pytest.mark.slow
@pytest.mark.parametrize("per_domain", [scaled(60)])
async def test_hostile_servers_many_addresses(
    testbed_factory, tmp_path, testbed_settings, outside_connections, per_domain: int
):
    """The same with many recipients per hostile host: the time does not grow with them,
    because a host that timed out or broke the protocol is not asked again."""
    settings, elapsed, _ = await _run_hostile(
        testbed_factory, tmp_path, testbed_settings, per_domain
    )
    assert elapsed < _bound(settings), elapsed
    assert outside_connections == []


# --- hostile DNS -------------------------------------------------------------------------


def dns_world(n_mx: int) -> World:
    """Thousands of MX records (only TCP can carry them), CNAME loops, extreme TTLs."""
    many = [(i, f"m{i}.many.test") for i in range(n_mx)]
    return World.of(
        [
            HostSpec("mx.silent.test", HostBehaviour(hostile="silent")),
            HostSpec("mx.good.test", HostBehaviour(mailboxes={"alice"})),
        ],
        [
            DomainSpec("many.test", mx=many),
            *(DomainSpec(name, a=["mx.silent.test"]) for _, name in many),
            # MX target in a two-name CNAME loop, one aliased to itself, and a domain whose
            # own name is a self-loop (so the MX query itself loops).
            DomainSpec("cnameloop.test", mx=[(10, "mx.cnameloop.test")]),
            DomainSpec("mx.cnameloop.test", cname="alias.cnameloop.test"),
            DomainSpec("alias.cnameloop.test", cname="mx.cnameloop.test"),
            DomainSpec("selfmx.test", mx=[(10, "mx.selfmx.test")]),
            DomainSpec("mx.selfmx.test", cname="mx.selfmx.test"),
            DomainSpec("selfloop.test", cname="selfloop.test"),
            # An MX whose host name is an alias back to the domain, which has no address.
            DomainSpec("backref.test", mx=[(10, "mx.backref.test")]),
            DomainSpec("mx.backref.test", cname="backref.test"),
            DomainSpec("hugettl.test", mx=[(10, "mx.good.test")], ttl=2**31 - 1),
            DomainSpec("topbitttl.test", mx=[(10, "mx.good.test")], ttl=2**32 - 1),
            DomainSpec("zerottl.test", mx=[(10, "mx.good.test")], ttl=0),
        ],
    )


def _mx_lookups(tb: Testbed, suffix: str) -> int:
    return sum(n for (name, rdtype), n in tb.dns_queries.items() if name.endswith(suffix))


@pytest.mark.parametrize("n_mx", [2000])
async def test_thousands_of_mx_records_over_tcp(
    testbed_factory, tmp_path, testbed_settings, outside_connections, n_mx: int
):
    tb = testbed_factory(dns_world(n_mx))
    # Parsing a 40 KB answer of 2000 records takes dnspython most of a second here (and
    # the testbed as long to build it): the DNS timeout (the suite's) leaves room for that.
    settings = _settings(tb, tmp_path, testbed_settings)
    fds_before = _open_fds()
    started = time.monotonic()
    result = await Engine(settings).verify("alice@many.test")
    elapsed = time.monotonic() - started
    assert (result.status, result.sub_status) == (Status.UNKNOWN, SubStatus.TIMEOUT), result
    assert len(result.mx_records) == dns_facts.MAX_MX_HOSTS
    # The answer did not fit in UDP: the truncated reply made the resolver ask again on TCP.
    assert tb.dns_queries[("many.test", "MX")] == 2
    # Only the best ten MX hosts were looked up, and at most MAX_CONNECT_ATTEMPTS dialled.
    assert _mx_lookups(tb, ".many.test") == 2 * dns_facts.MAX_MX_HOSTS  # A and AAAA each
    assert tb.host_stats("mx.silent.test").sessions <= MAX_CONNECT_ATTEMPTS
    bound = settings.dns_timeout + MAX_CONNECT_ATTEMPTS * settings.smtp_connect_timeout + SLACK
    assert elapsed < bound, elapsed
    assert tb.wait_idle()
    await _assert_fds_back_to(fds_before)
    assert outside_connections == []


async def test_cname_loops_are_dns_errors(
    testbed_factory, tmp_path, testbed_settings, outside_connections
):
    tb = testbed_factory(dns_world(1))
    settings = _settings(tb, tmp_path, testbed_settings)
    started = time.monotonic()
    batch = await Engine(settings).verify_many(
        ["a@cnameloop.test", "b@selfmx.test", "c@selfloop.test", "d@backref.test"]
    )
    assert time.monotonic() - started < 2 * settings.dns_timeout + SLACK
    by_email = {r.email: r for r in batch.results}
    for email in ("a@cnameloop.test", "b@selfmx.test", "c@selfloop.test"):
        result = by_email[email]
        assert (result.status, result.sub_status) == (Status.UNKNOWN, SubStatus.DNS_ERROR), result
        assert result.reason
    # The alias back to a domain without an address is simply no mail host.
    assert by_email["d@backref.test"].sub_status is SubStatus.NO_MX
    assert tb.total_stats().sessions == 0
    assert outside_connections == []


async def test_extreme_ttls_are_clamped(
    testbed_factory, tmp_path, testbed_settings, outside_connections
):
    """A 68-year TTL is cached for a day at most (a TTL with the top bit set counts as 0,
    RFC 2181 §8); a 0 s TTL still serves the job (a few seconds) rather than making every
    lookup a query."""
    tb = testbed_factory(dns_world(1))
    engine = Engine(_settings(tb, tmp_path, testbed_settings))
    emails = ["alice@hugettl.test", "alice@topbitttl.test", "alice@zerottl.test"]
    batch = await engine.verify_many(emails)
    assert [r.status for r in batch.results] == [Status.VALID] * 3
    now = time.monotonic()
    expiry = {key[1:]: deadline - now for key, (deadline, _) in dns_facts._CACHE.items()}
    assert dns_facts.MAX_TTL - 5 < expiry[("hugettl.test", "MX")] <= dns_facts.MAX_TTL
    assert 0 < expiry[("topbitttl.test", "MX")] <= dns_facts.MAX_TTL
    assert 0 < expiry[("zerottl.test", "MX")] <= dns_facts.MIN_TTL
    again = await engine.verify("alice@zerottl.test")
    assert again.status is Status.VALID
    assert tb.dns_queries[("zerottl.test", "MX")] == 1  # served from the cache
    assert outside_connections == []


async def test_long_running_state_stays_bounded(
    testbed_factory, tmp_path, testbed_settings, monkeypatch, outside_connections
):
    """What a long-running process keeps per domain or host has a ceiling: the DNS cache
    evicts beyond ``MAX_CACHE_ENTRIES`` and per-host politeness semaphores go once unused."""
    monkeypatch.setattr(dns_facts, "MAX_CACHE_ENTRIES", 50)
    hosts = [HostSpec(f"mx{i}.bounded.test", HostBehaviour(accept_all=True)) for i in range(20)]
    domains = [
        DomainSpec(f"d{i}.bounded.test", mx=[(10, f"mx{i}.bounded.test")]) for i in range(20)
    ]
    tb = testbed_factory(World.of(hosts, domains))
    engine = Engine(_settings(tb, tmp_path, testbed_settings))
    random_domains = [f"x@random{i}.nowhere.test" for i in range(300)]  # NXDOMAIN, cached
    batch = await engine.verify_many(
        [*random_domains, *(f"a@d{i}.bounded.test" for i in range(20))]
    )
    assert sum(r.status is Status.INVALID for r in batch.results) == 300
    assert sum(r.is_catch_all for r in batch.results) == 20  # each host was talked to
    assert len(dns_facts._CACHE) <= 50
    gc.collect()
    cap = engine.settings.smtp_max_sessions_per_host
    servers = [tb.address_of(f"mx{i}.bounded.test") for i in range(20)]
    assert [host_semaphore(server, cap) for server in servers] == [None] * 20
    assert outside_connections == []


def test_hostile_world_round_trips_through_its_dict_form() -> None:
    """The new testbed fields (``hostile*``, ``cname``) survive YAML/dict form like the rest."""
    world, _ = hostile_world(1)
    dns = dns_world(3)
    for original in (world, dns):
        assert World.from_dict(original.to_dict()) == original
    with pytest.raises(ValueError, match="hostile"):
        HostBehaviour(hostile="polite")
