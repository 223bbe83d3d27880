"""SSRF: an MX, A or AAAA answer pointing into a private, loopback, link-local or otherwise
reserved network is never connected to. Every test runs under the ``outside_connections``
socket guard, so an attempt would be refused before a packet left and show up in its list;
the testbed's own counters show that no session reached a loopback host either.
"""

from __future__ import annotations

import pytest
from api_helpers import assert_error_body, running_app, total_balance

from verimail.config import Settings
from verimail.engine.core import Engine
from verimail.engine.dns_facts import MailHost
from verimail.engine.netguard import connect_allowed
from verimail.engine.smtp.prober import Prober
from verimail.jobs.webhook import deliver
from verimail.schemas.outcomes import Status, SubStatus
from verimail.testbed.world import DomainSpec, HostBehaviour, HostSpec, World

# label -> an address an attacker would like us to reach
TARGETS: dict[str, str] = {
    "ten": "10.1.2.3",
    "ten-edge": "10.255.255.254",
    "one72": "172.16.0.25",
    "one72-edge": "172.31.255.254",
    "one92": "192.168.1.1",
    "metadata": "169.254.169.254",  # cloud instance metadata
    "linklocal": "169.254.0.1",
    "loop": "127.0.0.1",
    "loop-other": "127.9.9.9",
    "zero": "0.0.0.0",  # Linux connects 0.0.0.0 to the local host
    "zero-net": "0.1.2.3",
    "cgnat": "100.64.0.1",
    "multicast": "224.0.0.251",
    "broadcast": "255.255.255.255",
    "testnet": "192.0.2.10",
    "v6-loop": "::1",
    "v6-unspecified": "::",
    "v6-ula": "fc00::25",
    "v6-ula-fd": "fd12:3456:789a::1",
    "v6-linklocal": "fe80::1",
    "mapped-ten": "::ffff:10.0.0.1",
    "mapped-loop": "::ffff:127.0.0.1",
    "mapped-metadata": "::ffff:169.254.169.254",
    "compat-loop": "::7f00:1",  # deprecated IPv4-compatible form of 127.0.0.1
    "nat64-ten": "64:ff9b::a00:1",
    "sixtofour-ten": "2002:a00:1::1",  # 6to4 of 10.0.0.1
    "ietf-assignments": "192.0.0.8",  # 192.0.0.0/24: Python 3.11 calls it global
    "v6-site-local": "fec0::1",  # fec0::/10: so does it this one
}


def _world() -> World:
    """For each target: a domain whose MX host has that address, and a domain whose own
    A/AAAA record is that address (the implicit MX). A real testbed host is there too, so
    that loopback itself is refused while ``smtp_allow_networks`` is empty."""
    hosts = [HostSpec(f"mx.{label}.ssrf.test", address=ip) for label, ip in TARGETS.items()]
    hosts.append(HostSpec("mx.real.test", HostBehaviour(accept_all=True)))
    domains = [
        DomainSpec(f"{label}.ssrf.test", mx=[(10, f"mx.{label}.ssrf.test")]) for label in TARGETS
    ]
    domains += [DomainSpec(f"a-{label}.ssrf.test", a=[ip]) for label, ip in TARGETS.items()]
    domains += [
        DomainSpec("real.test", mx=[(10, "mx.real.test")]),
        # Several private MX hosts, each with several private addresses: none is tried.
        DomainSpec(
            "mixed.ssrf.test",
            mx=[
                (5, "mx.ten.ssrf.test"),
                (10, "mx.v6-loop.ssrf.test"),
                (20, "mx.metadata.ssrf.test"),
            ],
            a=["192.168.7.7", "fd00::7"],
        ),
        # An MX *name* that spells an address is a name: it has no A record here, so
        # nothing is connected to (a naive verifier would dial 127.0.0.1 directly).
        DomainSpec("literal.ssrf.test", mx=[(10, "127.0.0.1"), (20, "169.254.169.254")]),
    ]
    return World.of(hosts, domains)


@pytest.fixture
def world_tb(testbed_factory):
    return testbed_factory(_world())


def _addresses() -> list[str]:
    names = [f"{label}.ssrf.test" for label in TARGETS] + [
        f"a-{label}.ssrf.test" for label in TARGETS
    ]
    return [f"victim@{name}" for name in [*names, "mixed.ssrf.test"]]


async def test_private_answers_are_never_contacted(
    world_tb, tmp_path, testbed_settings, outside_connections
):
    """Strict settings (``smtp_allow_networks`` empty, as in production): every private
    answer, loopback included, ends ``unknown``/``private_address`` with a reason."""
    settings = testbed_settings(world_tb, tmp_path, smtp_allow_networks=[])
    batch = await Engine(settings).verify_many([*_addresses(), "someone@real.test"])
    for result in batch.results:
        assert (result.status, result.sub_status) == (Status.UNKNOWN, SubStatus.PRIVATE_ADDRESS), (
            result.email,
            result.reason,
        )
        assert "private or internal network" in result.reason
        assert result.safe_to_send is False
        # No server was asked: SPEC §2.2's smtp_response is null (it used to hold our own
        # words, "… resolves only to private or reserved addresses; not contacted").
        assert result.smtp_response is None
    assert batch.stats.smtp.sessions == 0
    assert outside_connections == []
    assert world_tb.total_stats().sessions == 0  # not even the loopback testbed host


async def test_loopback_allowance_does_not_open_other_networks(
    world_tb, tmp_path, testbed_settings, outside_connections
):
    """With the testbed's ``127.0.0.0/8`` allowance every other private range stays shut,
    IPv4-mapped and 6to4 forms of allowed/refused addresses included."""
    settings = testbed_settings(world_tb, tmp_path)  # allows 127.0.0.0/8 only
    loopback = {"loop", "loop-other", "mapped-loop"}
    refused = [
        f"victim@{prefix}{label}.ssrf.test"
        for label in TARGETS
        if label not in loopback
        for prefix in ("", "a-")
    ]
    batch = await Engine(settings).verify_many([*refused, "victim@mixed.ssrf.test"])
    for result in batch.results:
        assert result.sub_status is SubStatus.PRIVATE_ADDRESS, (result.email, result.reason)
    assert outside_connections == []
    assert world_tb.total_stats().sessions == 0


async def test_mx_name_spelling_an_address_is_not_dialled(
    world_tb, tmp_path, testbed_settings, outside_connections
):
    settings = testbed_settings(world_tb, tmp_path)
    result = await Engine(settings).verify("victim@literal.ssrf.test")
    assert result.status is not Status.VALID
    assert result.sub_status is SubStatus.NO_MX  # the names have no addresses
    assert outside_connections == []
    assert world_tb.total_stats().sessions == 0


def test_only_public_addresses_of_a_host_are_kept():
    """A host with private and public addresses keeps only the public ones (unit level:
    no connection is made here at all)."""
    prober = Prober(Settings(smtp_allow_networks=[]))
    host = MailHost("mx.mixed.test", 10, ("10.0.0.1", "8.8.8.8", "::1", "2001:4860:4860::8888"))
    (kept,) = prober.allowed_hosts((host,))
    assert kept.addresses == ("8.8.8.8", "2001:4860:4860::8888")
    assert prober.allowed_hosts((MailHost("mx.private.test", 10, ("10.0.0.1", "fd00::1")),)) == ()
    for address in TARGETS.values():
        assert not connect_allowed(address, []), address


async def test_api_single_reports_private_mx_without_connecting(
    world_tb, tmp_path, testbed_settings, outside_connections
):
    """Through the real app: 200 with ``unknown``/``private_address``, no connection."""
    settings = testbed_settings(world_tb, tmp_path)
    async with running_app(settings) as app:
        customer = app.customer(credits=5)
        for email in ("victim@metadata.ssrf.test", "victim@a-mapped-ten.ssrf.test"):
            response = await app.client.post(
                "/api/verify/single", json={"email": email}, headers=customer.headers
            )
            assert response.status_code == 200, response.text
            body = response.json()
            assert (body["status"], body["sub_status"]) == ("unknown", "private_address")
            assert "private" in body["reason"]
    assert outside_connections == []
    assert world_tb.total_stats().sessions == 0


# --- webhooks: a user-chosen URL gets the same guard ---------------------------------------

PRIVATE_WEBHOOKS = [
    "http://10.0.0.1/hook",
    "http://172.16.0.1/hook",
    "http://192.168.0.1/hook",
    "http://169.254.169.254/latest/meta-data/",
    "http://127.0.0.1:6379/",  # loopback is refused too unless webhook_allow_networks says so
    "http://0.0.0.0/",
    "http://[::1]:8080/",
    "http://[::ffff:10.0.0.1]/",
    "http://[fc00::1]/",
    "http://[fe80::1]/",
    "http://[2002:a00:1::1]/",  # 6to4 of 10.0.0.1
    # Legacy IPv4 spellings a resolver reads as addresses, without DNS:
    "http://2130706433/",  # 127.0.0.1 as one number
    "http://0x7f000001/",
    "http://127.1/",
    "http://0/",
    "http://2852039166/latest/meta-data/",  # 169.254.169.254
]


async def test_webhook_delivery_to_private_addresses_is_refused(outside_connections):
    for url in PRIVATE_WEBHOOKS:
        result = await deliver(url, {"job_id": 1}, "secret", backoff=0.01)
        assert not result.delivered, url
        assert "private" in result.detail, (url, result.detail)
        assert result.status_code is None  # no request was made
    assert outside_connections == []


async def test_private_webhook_url_is_refused_at_job_creation(
    world_tb, tmp_path, testbed_settings, outside_connections
):
    """Refused with 422 before a job exists: nothing charged, nothing stored."""
    settings = testbed_settings(world_tb, tmp_path)
    async with running_app(settings) as app:
        customer = app.customer(credits=5)
        for url in PRIVATE_WEBHOOKS:
            response = await app.client.post(
                "/api/verify/bulk",
                headers=customer.headers,
                json={"emails": ["victim@real.test"], "webhook_url": url},
            )
            assert "private" in assert_error_body(response, 422), url
        assert total_balance(app.store, customer.account_id) == 5
    assert outside_connections == []
