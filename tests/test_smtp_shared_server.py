"""Sessions per server IP (issue 33, point 1): a shared host that gives every customer
domain an MX name of its own, all resolving to one server, carries those domains in the same
sessions — per-domain verdicts and catch-all probes, within the per-session limits — against
the loopback testbed, whose counters say what the server saw."""

from __future__ import annotations

from verimail.engine.core import Engine
from verimail.engine.smtp.findings import probe_address
from verimail.schemas.outcomes import Status
from verimail.testbed.world import DomainSpec, HostBehaviour, HostSpec, World

SERVER = "server.shared.test"
SENDER = "verify@verimail.localhost"  # (the settings' default sender: the probes' triplets)


def _shared_world(
    domains: int, valid: int, invalid: int, *, catch_all: tuple[int, ...] = (), **behaviour
) -> tuple[World, list[str]]:
    """``domains`` customer domains ``cN.test``, each with its own MX name ``mx.cN.test``
    whose A record is the one server's address; ``valid`` mailboxes ``uK`` and ``invalid``
    unknown users ``nobodyK`` per domain. The domains in ``catch_all`` accept anything
    (their probe and their unknown users are scripted to 250), the others refuse unknowns."""
    accept = "250 2.1.5 Ok"
    replies = {}
    for d in catch_all:
        replies[probe_address(f"c{d}.test", SENDER)] = accept
        replies.update({f"nobody{k}@c{d}.test": accept for k in range(invalid)})
    server = HostBehaviour(
        mailboxes={f"u{k}" for k in range(valid)}, rcpt_replies=replies, **behaviour
    )
    specs = []
    addresses = []
    for d in range(domains):
        specs.append(DomainSpec(f"c{d}.test", mx=[(10, f"mx.c{d}.test")]))
        specs.append(DomainSpec(f"mx.c{d}.test", a=[SERVER]))
        addresses += [f"u{k}@c{d}.test" for k in range(valid)]
        addresses += [f"nobody{k}@c{d}.test" for k in range(invalid)]
    return World.of([HostSpec(SERVER, server)], specs), addresses


async def test_domains_of_one_server_share_sessions_with_a_verdict_and_probe_each(
    testbed_factory, tmp_path, testbed_settings
):
    """Six domains, six MX names, one server: every address gets its own domain's verdict
    (catch-all only for the catch-all domain), each domain's catch-all probe is sent once,
    and all 30 recipients go over one session (they took one per domain before)."""
    world, addresses = _shared_world(6, valid=2, invalid=2, catch_all=(3,))
    tb = testbed_factory(world)
    settings = testbed_settings(tb, tmp_path, smtp_max_rejections_per_session=20)
    batch = await Engine(settings).verify_many(addresses)
    got = {r.email: r.status for r in batch.results}
    for address in addresses:
        expected = Status.VALID if address.startswith("u") else Status.INVALID
        if address.endswith("@c3.test"):
            expected = Status.CATCHALL
        assert got[address] is expected, address
    assert {r.email: r.is_catch_all for r in batch.results} == {
        a: a.endswith("@c3.test") for a in addresses
    }
    stats = tb.host_stats(SERVER)
    probes = [r for r in stats.rcpts if r.startswith("vm-probe-")]
    assert sorted(probes) == sorted(probe_address(f"c{d}.test", SENDER) for d in range(6))
    assert stats.sessions == 1
    assert stats.rcpt_to == len(addresses) + 6


async def test_a_shared_server_gets_the_fewest_sessions_its_limits_allow(
    testbed_factory, tmp_path, testbed_settings
):
    """Twenty domains with an MX name each on one server, 3 mailboxes each: 80 RCPTs
    (with the probes) at 20 per session and 9 rejections (the 20 probes) need 4 sessions.
    Grouped by MX name, as before, every domain took a session of its own: 20."""
    world, addresses = _shared_world(20, valid=3, invalid=0)
    tb = testbed_factory(world)
    counts = {}
    for by_server in (False, True):
        tb.reset_stats()
        settings = testbed_settings(
            tb,
            tmp_path,
            smtp_sessions_by_server=by_server,
            smtp_rcpts_per_session=20,
            smtp_max_rejections_per_session=9,
            smtp_max_sessions_per_host=5,
        )
        batch = await Engine(settings).verify_many(addresses)
        assert {r.status for r in batch.results} == {Status.VALID}
        assert tb.wait_idle()
        stats = tb.host_stats(SERVER)
        assert stats.peak_concurrent <= 5
        assert stats.rcpt_to == len(addresses) + 20
        counts[by_server] = stats.sessions
    assert counts == {False: 20, True: 4}


async def test_the_per_session_limits_hold_for_sessions_of_several_domains(
    testbed_factory, tmp_path, testbed_settings
):
    """Our limits (5 RCPTs, 3 rejections a session) below the server's (a 452 past 5
    RCPTs a connection, a hang-up at the 4th rejection): sessions mixing twelve domains
    never reach either, so the server never says 452 or hangs up, nothing is learnt, and
    every verdict is the domain's own."""
    world, addresses = _shared_world(
        12, valid=2, invalid=2, max_rcpts_per_session=5, disconnect_after_rejections=4
    )
    tb = testbed_factory(world)
    settings = testbed_settings(
        tb, tmp_path, smtp_rcpts_per_session=5, smtp_max_rejections_per_session=3
    )
    engine = Engine(settings)
    batch = await engine.verify_many(addresses)
    assert [r.status for r in batch.results] == [
        Status.VALID if a.startswith("u") else Status.INVALID for a in addresses
    ]
    assert tb.wait_idle()
    stats = tb.host_stats(SERVER)
    assert stats.hangups == 0
    assert stats.peak_session_rejections <= 3
    server = tb.address_of(SERVER)
    assert engine.prober.learned.rcpt_limit(server) is None
    assert engine.prober.learned.rejection_limit(server) is None
    # 60 RCPTs, 36 rejections (24 unknown users, 12 probes): at least 12 sessions of 3
    assert 12 <= stats.sessions < 24


async def test_a_shared_server_that_will_not_mix_domains_gets_a_transaction_each(
    testbed_factory, tmp_path, testbed_settings
):
    """A shared server that refuses a second domain in one transaction: the prober learns
    it (by the server's address, whichever MX name led there), gives each domain a
    ``MAIL FROM`` of its own (``RSET`` between) in the same session, and every verdict is
    right."""
    world, addresses = _shared_world(5, valid=2, invalid=1, one_domain_per_transaction=True)
    tb = testbed_factory(world)
    engine = Engine(testbed_settings(tb, tmp_path, smtp_max_rejections_per_session=20))
    batch = await engine.verify_many(addresses)
    assert [r.status for r in batch.results] == [
        Status.VALID if a.startswith("u") else Status.INVALID for a in addresses
    ]
    stats = tb.host_stats(SERVER)
    assert stats.sessions == 1
    assert stats.mail_from >= 5
    assert engine.prober.learned.one_domain(tb.address_of(SERVER))
