"""The engine against the loopback testbed: real DNS packets, real SMTP sessions."""

from __future__ import annotations

import asyncio
import gc
import math

import pytest

from verimail.engine import dns_facts
from verimail.engine.core import Engine
from verimail.engine.syntax import ParsedAddress
from verimail.schemas.outcomes import Status, SubStatus
from verimail.schemas.results import VerificationResult
from verimail.testbed.world import DomainSpec, HostBehaviour, HostSpec, World


def _world() -> World:
    """One domain per behaviour worth checking."""
    hosts = [
        HostSpec("mx.acme.test", HostBehaviour(mailboxes={"alice", "bob", "info"})),
        HostSpec("mx.catchall.test", HostBehaviour(accept_all=True)),
        HostSpec("mx.grey.test", HostBehaviour(mailboxes={"carol"}, greylist_tries=1)),
        HostSpec("mx.greyforever.test", HostBehaviour(mailboxes={"dave"}, greylist_tries=99)),
        HostSpec("mx.full.test", HostBehaviour(mailboxes={"erin"}, full_mailboxes={"frank"})),
        HostSpec("mx.block.test", HostBehaviour(mailboxes={"gina"}, block=True)),
        HostSpec("down.fallback.test", HostBehaviour(refuse_connections=True)),
        HostSpec("busy.fallback.test", HostBehaviour(greeting_421=True)),
        HostSpec("mx2.fallback.test", HostBehaviour(mailboxes={"hank"})),
        HostSpec("mx.tls.test", HostBehaviour(mailboxes={"ivy"}, starttls=True)),
        HostSpec("mx.slow.test", HostBehaviour(mailboxes={"jack"}, reply_delay=0.2)),
        HostSpec("web.implicit.test", HostBehaviour(mailboxes={"kim"})),
        HostSpec("internal.evil.test", address="10.0.0.1"),
        HostSpec("loop6.evil.test", address="fd00::1"),
    ]
    domains = [
        DomainSpec("acme.test", mx=[(10, "mx.acme.test")]),
        DomainSpec("catchall.test", mx=[(10, "mx.catchall.test")]),
        DomainSpec("grey.test", mx=[(10, "mx.grey.test")]),
        DomainSpec("greyforever.test", mx=[(10, "mx.greyforever.test")]),
        DomainSpec("full.test", mx=[(10, "mx.full.test")]),
        DomainSpec("block.test", mx=[(10, "mx.block.test")]),
        DomainSpec(
            "fallback.test",
            mx=[(5, "down.fallback.test"), (10, "busy.fallback.test"), (20, "mx2.fallback.test")],
        ),
        DomainSpec("noaddr.test", mx=[(5, "ghost.noaddr.test"), (10, "mx.acme.test")]),
        DomainSpec("onlyghost.test", mx=[(10, "ghost.onlyghost.test")]),
        DomainSpec("nullmx.test", mx=[(0, ".")]),
        DomainSpec("servfail.test", servfail=True),
        DomainSpec("implicit.test", a=["web.implicit.test"]),
        DomainSpec("nothing.test"),
        DomainSpec("tls.test", mx=[(10, "mx.tls.test")]),
        DomainSpec("slow.test", mx=[(10, "mx.slow.test")]),
        DomainSpec("slowdns.test", mx=[(10, "mx.acme.test")], dns_delay=0.5),
        DomainSpec("evil.test", mx=[(10, "internal.evil.test")]),
        DomainSpec("evil6.test", mx=[(10, "loop6.evil.test")]),
        DomainSpec("mailinator.com", mx=[(10, "mx.catchall.test")]),
    ]
    return World.of(hosts, domains)


@pytest.fixture
def world_tb(testbed_factory):
    return testbed_factory(_world())


@pytest.fixture
def engine(world_tb, tmp_path, testbed_settings):
    return Engine(testbed_settings(world_tb, tmp_path))


CASES = [
    ("alice@acme.test", Status.VALID, SubStatus.OK),
    ("info@acme.test", Status.VALID, SubStatus.ROLE_BASED),
    ("nobody@acme.test", Status.INVALID, SubStatus.MAILBOX_NOT_FOUND),
    ("john.smith@catchall.test", Status.LIKELY_VALID, SubStatus.CATCH_ALL),
    ("zq8x7k2m4p9w@catchall.test", Status.CATCHALL, SubStatus.CATCH_ALL),
    ("carol@grey.test", Status.VALID, SubStatus.OK),
    ("dave@greyforever.test", Status.UNKNOWN, SubStatus.GREYLISTED),
    ("frank@full.test", Status.RISKY, SubStatus.MAILBOX_FULL),
    ("gina@block.test", Status.UNKNOWN, SubStatus.EGRESS_BLOCKED),  # a block list: our IP
    ("hank@fallback.test", Status.VALID, SubStatus.OK),
    ("alice@noaddr.test", Status.VALID, SubStatus.OK),
    ("x@onlyghost.test", Status.INVALID, SubStatus.NO_MX),
    ("x@nullmx.test", Status.INVALID, SubStatus.NULL_MX),
    ("x@servfail.test", Status.UNKNOWN, SubStatus.DNS_ERROR),
    ("kim@implicit.test", Status.VALID, SubStatus.OK),
    ("x@nothing.test", Status.INVALID, SubStatus.NO_MX),
    ("x@doesnotexist.test", Status.INVALID, SubStatus.NXDOMAIN),
    ("ivy@tls.test", Status.VALID, SubStatus.OK),
    ("jack@slow.test", Status.VALID, SubStatus.OK),
    ("x@evil.test", Status.UNKNOWN, SubStatus.PRIVATE_ADDRESS),
    ("x@evil6.test", Status.UNKNOWN, SubStatus.PRIVATE_ADDRESS),
    ("someone@mailinator.com", Status.DISPOSABLE, SubStatus.DISPOSABLE),
    ("not an address", Status.INVALID, SubStatus.INVALID_SYNTAX),
]


async def test_every_status_in_one_batch(engine, world_tb, outside_connections):
    batch = await engine.verify_many([address for address, _, _ in CASES])
    got = {r.email: (r.status, r.sub_status) for r in batch.results}
    for (address, status, sub_status), result in zip(CASES, batch.results, strict=True):
        assert (result.status, result.sub_status) == (status, sub_status), (address, got)
        assert result.safe_to_send is (status is Status.VALID)
        assert 0.0 <= result.confidence_score <= 1.0
        assert result.reason
    assert outside_connections == []
    assert world_tb.total_stats().data == 0
    by_email = {r.email: r for r in batch.results}
    assert by_email["alice@acme.test"].mx_records == ["mx.acme.test"]
    assert by_email["alice@acme.test"].smtp_response.startswith("250")
    assert by_email["nobody@acme.test"].smtp_response.startswith("550")
    assert by_email["john.smith@catchall.test"].is_catch_all is True
    assert by_email["alice@acme.test"].is_catch_all is False
    assert by_email["info@acme.test"].is_role_based is True
    assert by_email["x@nullmx.test"].smtp_response is None
    # Hosts behind private addresses were never contacted, not even attempted.
    assert world_tb.host_stats("mx.tls.test").starttls == 1


async def test_private_mx_is_refused_without_any_connection(
    testbed_factory, tmp_path, testbed_settings, outside_connections
):
    tb = testbed_factory(_world())
    settings = testbed_settings(tb, tmp_path)
    result = await Engine(settings).verify("x@evil.test")
    assert result.status is Status.UNKNOWN and result.sub_status is SubStatus.PRIVATE_ADDRESS
    assert "private" in result.reason.lower() or "internal" in result.reason.lower()
    assert outside_connections == []
    # Loopback too is private unless allowed: without the testbed's allowance, no session.
    strict = testbed_settings(tb, tmp_path, smtp_allow_networks=[])
    dns_facts.clear_cache()
    strict_result = await Engine(strict).verify("alice@acme.test")
    assert strict_result.sub_status is SubStatus.PRIVATE_ADDRESS
    assert tb.total_stats().sessions == 0


async def test_fallback_skips_refusing_and_421_hosts(engine, world_tb):
    result = await engine.verify("hank@fallback.test")
    assert result.status is Status.VALID
    assert world_tb.host_stats("busy.fallback.test").sessions >= 1  # greeted with 421
    assert world_tb.host_stats("mx2.fallback.test").rcpt_to >= 1


async def test_greylisting_is_retried_within_the_run(engine, world_tb):
    result = await engine.verify("carol@grey.test")
    assert result.status is Status.VALID
    stats = world_tb.host_stats("mx.grey.test")
    assert stats.rcpts.count("carol@grey.test") == 2  # greylisted once, accepted on retry


async def test_dedupe_and_input_order(engine, world_tb):
    batch = await engine.verify_many(["bob@acme.test", "alice@acme.test", "bob@acme.test"])
    assert [r.email for r in batch.results] == ["bob@acme.test", "alice@acme.test", "bob@acme.test"]
    assert world_tb.host_stats("mx.acme.test").rcpts.count("bob@acme.test") == 1
    assert batch.stats.unique_addresses == 2


async def test_domain_is_normalised_and_local_kept(engine):
    result = await engine.verify("  Alice@ACME.Test ")
    assert result.email == "Alice@acme.test"
    assert result.domain == "acme.test"


def _hosted_world(n_hosts: int, n_domains: int, per_domain: int, **behaviour) -> tuple:
    hosts = [HostSpec(f"mx{h}.big.test", HostBehaviour(**behaviour)) for h in range(n_hosts)]
    domains = []
    addresses = []
    for d in range(n_domains):
        host = hosts[d % n_hosts]
        name = f"d{d}.example.test"
        domains.append(DomainSpec(name, mx=[(10, host.name)]))
        for i in range(per_domain):
            local = f"user{i}"
            host.behaviour.mailboxes.add(f"{local}@{name}")
            addresses.append(f"{local}@{name}")
    return World.of(hosts, domains), addresses


async def test_counters_1000_addresses_50_domains_5_hosts(
    testbed_factory, tmp_path, testbed_settings
):
    world, addresses = _hosted_world(5, 50, 20)
    tb = testbed_factory(world)
    settings = testbed_settings(
        tb, tmp_path, smtp_max_sessions_per_host=3, smtp_rcpts_per_session=50
    )
    batch = await Engine(settings).verify_many(addresses)
    assert all(r.status is Status.VALID for r in batch.results)
    assert batch.stats.mx_queries == 50
    assert sum(1 for (_, rdtype) in tb.dns_queries.elements() if rdtype == "MX") == 50
    assert batch.stats.smtp.catch_all_probes == 50
    for h in range(5):
        stats = tb.host_stats(f"mx{h}.big.test")
        probes = [r for r in stats.rcpts if r.startswith("vm-probe-")]
        assert len(probes) == 10  # one per domain, never one per address
        assert stats.rcpt_to == 210
        assert stats.sessions == math.ceil(210 / 50)  # 5 sessions, not 200
        assert stats.peak_concurrent <= 3
        assert stats.data == 0


@pytest.mark.parametrize("mix", [True, False])
async def test_domains_of_one_host_share_one_transaction(
    testbed_factory, tmp_path, testbed_settings, mix
):
    """10 domains on one host, one session: one MAIL FROM for all of them (no RSET per
    domain), or one per domain with ``smtp_mix_domains`` off; the verdicts are the same."""
    world, good = _hosted_world(1, 10, 2)
    tb = testbed_factory(world)
    settings = testbed_settings(tb, tmp_path, smtp_max_sessions_per_host=1, smtp_mix_domains=mix)
    bad = [f"nobody@d{d}.example.test" for d in range(0, 10, 3)]
    batch = await Engine(settings).verify_many(good + bad)
    statuses = {r.email: r.status for r in batch.results}
    assert all(statuses[a] is Status.VALID for a in good)
    assert all(statuses[a] is Status.INVALID for a in bad)
    stats = tb.host_stats("mx0.big.test")
    rejections = 10 + len(bad)  # a probe per domain, and the bad addresses
    assert stats.sessions == math.ceil(rejections / 9)
    if mix:
        assert stats.mail_from == stats.sessions  # one transaction per session
    else:  # one per domain, and one more for a domain split across two sessions
        assert 10 <= stats.mail_from <= 10 + stats.sessions - 1
    assert batch.stats.smtp.mail_from == stats.mail_from


async def test_a_host_that_refuses_mixed_domains_gets_one_per_transaction(
    testbed_factory, tmp_path, testbed_settings
):
    """The second domain's first recipient is refused (5.7.1) because of the mix: it is
    asked again in a transaction of its own, and every later domain gets one too — no
    address is judged on the refusal of the mix."""
    world, good = _hosted_world(1, 4, 2)
    world.hosts["mx0.big.test"].behaviour.one_domain_per_transaction = True
    tb = testbed_factory(world)
    settings = testbed_settings(tb, tmp_path, smtp_max_sessions_per_host=1)
    bad = [f"nobody@d{d}.example.test" for d in range(4)]
    batch = await Engine(settings).verify_many(good + bad)
    statuses = {r.email: (r.status, r.reason) for r in batch.results}
    assert all(statuses[a][0] is Status.VALID for a in good), statuses
    assert all(statuses[a][0] is Status.INVALID for a in bad), statuses
    assert {r.is_catch_all for r in batch.results} == {False}
    stats = tb.host_stats("mx0.big.test")
    assert stats.sessions == 1
    # d0 opens the transaction; d1's probe is refused in the mix and asked again after
    # RSET + MAIL FROM; d2 and d3 get a transaction of their own at once: one MAIL FROM
    # per domain, and one RCPT more than the addresses and probes.
    assert stats.mail_from == 4
    assert stats.rcpt_to == 4 + len(good) + len(bad) + 1


async def test_rejections_open_a_fresh_session_before_the_tenth(
    testbed_factory, tmp_path, testbed_settings
):
    world, _ = _hosted_world(1, 1, 0)
    tb = testbed_factory(world)
    settings = testbed_settings(tb, tmp_path, smtp_max_sessions_per_host=1)
    bad = [f"nobody{i}@d0.example.test" for i in range(30)]
    batch = await Engine(settings).verify_many(bad)
    assert all(r.sub_status is SubStatus.MAILBOX_NOT_FOUND for r in batch.results)
    # 31 rejections (30 + the catch-all probe), at most 9 per session.
    assert tb.host_stats("mx0.big.test").sessions == math.ceil(31 / 9)


async def test_disconnect_mid_session_retries_the_rest(testbed_factory, tmp_path, testbed_settings):
    world, good = _hosted_world(1, 1, 5, disconnect_after_rejections=2)
    tb = testbed_factory(world)
    settings = testbed_settings(tb, tmp_path, smtp_max_sessions_per_host=1)
    mixed = [
        a
        for pair in zip(good, [f"bad{i}@d0.example.test" for i in range(5)], strict=True)
        for a in pair
    ]
    batch = await Engine(settings).verify_many(mixed)
    statuses = {r.email: r.status for r in batch.results}
    assert all(statuses[a] is Status.VALID for a in good)
    assert all(statuses[a] is Status.INVALID for a in mixed if a.startswith("bad"))


async def test_sessions_cut_at_once_at_the_error_limit_do_not_drop_the_host(
    testbed_factory, tmp_path, testbed_settings
):
    """Five sessions reach a host's error limit (421 after the third rejection) together,
    before any of them has taught the prober that limit. Those hang-ups are the host's
    policy, not a broken host: every address still gets its answer (it used to write the
    host off for the run, 287 of 300 addresses "unknown")."""
    world, _good = _hosted_world(1, 1, 1, disconnect_after_rejections=3, reply_delay=0.01)
    tb = testbed_factory(world)
    settings = testbed_settings(tb, tmp_path, smtp_max_sessions_per_host=5)
    bad = [f"nobody{i}@d0.example.test" for i in range(300)]
    batch = await Engine(settings).verify_many(bad)
    assert [r.sub_status for r in batch.results] == [SubStatus.MAILBOX_NOT_FOUND] * 300
    stats = tb.host_stats("mx0.big.test")
    assert stats.hangups >= 2  # (the burst this is about happened)
    assert stats.sessions <= 160  # two rejections a session once the limit is learned


async def test_a_busy_primary_shared_by_two_domains_falls_back_for_both(
    testbed_factory, tmp_path, testbed_settings
):
    """Two domains' MX sets share a primary that greets with 421 (busy), each with a working
    secondary. While one group's session holds that host's slot, the other's refused dial
    asks whether the host is busy: that check called a property as a method, and the
    TypeError took down the whole batch (no result for any address)."""
    world = World.of(
        [
            HostSpec("busy.test", HostBehaviour(greeting_421=True)),
            HostSpec("mx2.x.test", HostBehaviour(mailboxes={"alice"})),
            HostSpec("mx2.y.test", HostBehaviour(mailboxes={"bob"})),
        ],
        [
            DomainSpec("x.test", mx=[(10, "busy.test"), (20, "mx2.x.test")]),
            DomainSpec("y.test", mx=[(10, "busy.test"), (20, "mx2.y.test")]),
        ],
    )
    tb = testbed_factory(world)
    settings = testbed_settings(tb, tmp_path)
    addresses = ["alice@x.test", "bob@y.test", "nobody@x.test", "nobody@y.test"]
    for _ in range(3):  # (the two groups' dials overlap most runs, not every one)
        batch = await Engine(settings).verify_many(addresses)
        assert [r.status for r in batch.results] == [
            Status.VALID,
            Status.VALID,
            Status.INVALID,
            Status.INVALID,
        ]


async def test_busy_reads_the_slots_in_use():
    """HostSlots.busy: False with no session on the host, True while one holds a slot."""
    from verimail.engine.smtp.host_slots import HostSlots

    slots = HostSlots(per_host=2, total=10, redis_url=None)
    assert not slots.busy("busy-check.test")
    held = await slots.take("busy-check.test")
    try:
        assert slots.busy("busy-check.test")
    finally:
        held.release()
    assert not slots.busy("busy-check.test")


async def test_recipient_limit_452_and_one_per_session_host(
    testbed_factory, tmp_path, testbed_settings
):
    world, addresses = _hosted_world(2, 2, 6)
    world.hosts["mx0.big.test"].behaviour.max_rcpts_per_session = 3
    world.hosts["mx1.big.test"].behaviour.max_rcpts_per_session = 1
    tb = testbed_factory(world)
    settings = testbed_settings(tb, tmp_path, smtp_max_sessions_per_host=1)
    batch = await Engine(settings).verify_many(addresses)
    assert all(r.status is Status.VALID for r in batch.results), [
        (r.email, r.reason) for r in batch.results if r.status is not Status.VALID
    ]
    # The strict host ends up with one recipient per session.
    strict = tb.host_stats("mx1.big.test")
    assert strict.sessions >= 7


async def test_tarpit_within_timeout(testbed_factory, tmp_path, testbed_settings):
    world, addresses = _hosted_world(1, 1, 2, tarpit_delay=0.3)
    tb = testbed_factory(world)
    settings = testbed_settings(tb, tmp_path)
    batch = await Engine(settings).verify_many([*addresses, "nope@d0.example.test"])
    assert [r.status for r in batch.results] == [Status.VALID, Status.VALID, Status.INVALID]


async def test_slow_host_beyond_timeout_is_unknown(testbed_factory, tmp_path, testbed_settings):
    world, addresses = _hosted_world(1, 1, 1, reply_delay=1.0)
    tb = testbed_factory(world)
    settings = testbed_settings(tb, tmp_path, smtp_connect_timeout=0.3, smtp_command_timeout=0.3)
    result = (await Engine(settings).verify_many(addresses)).results[0]
    assert result.status is Status.UNKNOWN
    assert result.sub_status is SubStatus.TIMEOUT


def _live(cls: type) -> int:
    """Instances of ``cls`` still reachable in this process."""
    return sum(1 for obj in gc.get_objects() if type(obj) is cls)


async def test_stream_matches_verify_many_and_hands_each_string_over_once(engine, world_tb):
    given = [address for address, _, _ in CASES] + ["alice@acme.test", " Alice@ACME.test"]
    streamed: list[tuple[str, Status, SubStatus]] = []
    async for raw, result in engine.stream(given):
        streamed.append((raw, result.status, result.sub_status))
    raws = [raw for raw, _, _ in streamed]
    assert sorted(raws) == sorted(set(given))  # each distinct string once, duplicates folded
    dns_facts.clear_cache()
    batch = await engine.verify_many(given)
    expected = {raw: (r.status, r.sub_status) for raw, r in zip(given, batch.results, strict=True)}
    assert {raw: (s, sub) for raw, s, sub in streamed} == expected


async def test_stream_hands_over_fast_hosts_before_a_slow_host_ends(engine, world_tb):
    """Results come as their host group ends: those decided without SMTP first, then a fast
    host's, while the slow host (0.2 s a reply) is still talking."""
    order: list[str] = []
    slow_sessions_open_at_acme: list[int] = []
    async for raw, _result in engine.stream(
        ["jack@slow.test", "alice@acme.test", "not an address", "x@doesnotexist.test"]
    ):
        order.append(raw)
        if raw == "alice@acme.test":
            stats = world_tb.host_stats("mx.slow.test")
            slow_sessions_open_at_acme.append(stats.active)
    assert set(order[:2]) == {"not an address", "x@doesnotexist.test"}
    assert order[2:] == ["alice@acme.test", "jack@slow.test"]
    assert slow_sessions_open_at_acme == [1]


async def test_stream_forgets_what_it_has_handed_over(testbed_factory, tmp_path, testbed_settings):
    """The engine keeps no result and no parse of an address once it is handed over: at the
    last address, only that one's record is alive (verify_many holds them all)."""
    world, addresses = _hosted_world(4, 40, 10)
    tb = testbed_factory(world)
    engine = Engine(testbed_settings(tb, tmp_path))
    gc.collect()
    before = _live(ParsedAddress)
    alive: list[tuple[int, int]] = []
    seen = 0
    async for _raw, _result in engine.stream(addresses):
        seen += 1
        if seen % 100 == 0:
            gc.collect()
            alive.append((_live(VerificationResult), _live(ParsedAddress) - before))
    assert seen == len(addresses) == 400
    # One record alive (the one in hand); the parses left are the groups still to finish.
    assert [records for records, _ in alive] == [1, 1, 1, 1]
    assert [parses for _, parses in alive] == sorted((p for _, p in alive), reverse=True)
    assert alive[-1][1] <= 100  # the last group's own addresses at most, out of 400
    dns_facts.clear_cache()
    batch = await engine.verify_many(addresses)
    gc.collect()
    assert _live(VerificationResult) >= 400 and len(batch.results) == 400


async def test_a_cancelled_caller_leaves_a_shared_dns_lookup_to_the_others(engine):
    """Two verifications of one domain share its DNS lookup; the first caller is cancelled
    (a request that timed out) while the lookup is under way: the second still gets its
    answer, not the first one's cancellation."""
    first = asyncio.ensure_future(engine.verify("alice@slowdns.test"))
    await asyncio.sleep(0)  # it starts the lookup
    second = asyncio.ensure_future(engine.verify("bob@slowdns.test"))
    await asyncio.sleep(0.1)  # both wait on the lookup (0.5 s)
    first.cancel()
    result = await asyncio.wait_for(second, 30)
    assert (result.status.value, result.domain) == ("valid", "slowdns.test")
    with pytest.raises(asyncio.CancelledError):
        await first


async def test_a_mail_host_behind_ten_dead_mx_targets_is_found(
    testbed_factory, tmp_path, testbed_settings
):
    """The best ten MX targets are looked up first; only when none has an address are the
    next ones. A working host at preference 50 behind eleven names without addresses is
    still the domain's mail host (it was invalid/no_mx); with more dead names than are
    looked up at all, the answer is unknown, never invalid."""
    dead = [(i, f"mx{i:02d}.nowhere.test") for i in range(1, dns_facts.MAX_MX_LOOKUPS + 2)]
    tb = testbed_factory(
        World.of(
            [HostSpec("mx.alive.test", HostBehaviour(mailboxes={"alice"}))],
            [
                DomainSpec("behind.test", mx=[*dead[:11], (500, "mx.alive.test")]),
                DomainSpec("buried.test", mx=[*dead, (500, "mx.alive.test")]),
            ],
        )
    )
    engine = Engine(testbed_settings(tb, tmp_path))
    behind = await engine.verify("alice@behind.test")
    assert (behind.status, behind.sub_status) == (Status.VALID, SubStatus.OK)
    assert "mx.alive.test" in behind.mx_records
    buried = await engine.verify("alice@buried.test")
    assert (buried.status, buried.sub_status) == (Status.UNKNOWN, SubStatus.DNS_ERROR)
    assert tb.host_stats("mx.alive.test").sessions == 1  # (behind.test's only)


async def test_a_malformed_address_keeps_its_domains_flags(engine):
    """Bad syntax decides the status (invalid), but what is known of the domain still holds
    (SPEC §2.2: is_disposable "from a disposable email service"): both flags were false."""
    spaced = await engine.verify("john doe@mailinator.com")
    assert (spaced.status, spaced.sub_status) == (Status.INVALID, SubStatus.INVALID_SYNTAX)
    assert spaced.is_disposable is True and spaced.domain == "mailinator.com"
    dotted = await engine.verify("john..doe@gmail.com")
    assert dotted.sub_status is SubStatus.INVALID_SYNTAX and dotted.is_free is True
    bare = await engine.verify("no-domain@")
    assert (bare.is_disposable, bare.is_free, bare.domain) == (False, False, "")


async def test_a_server_that_takes_two_connections_at_once_still_answers_every_address(
    testbed_factory, tmp_path, testbed_settings
):
    """Exim or Microsoft 365 answer a third concurrent connection from one IP with "421 too
    many connections". Five sessions were opened at once; the refused ones wrote off every
    queued address as unknown and dropped the host (81 of 100 mailboxes). Now the sessions
    that were let in carry on with the queue."""
    boxes = {f"u{i}" for i in range(40)}
    tb = testbed_factory(
        World.of(
            [HostSpec("mx.crowd.test", HostBehaviour(mailboxes=boxes, max_connections=2))],
            [DomainSpec("crowd.test", mx=[(10, "mx.crowd.test")])],
        )
    )
    settings = testbed_settings(
        tb, tmp_path, smtp_max_sessions_per_host=5, smtp_rcpts_per_session=10
    )
    batch = await Engine(settings).verify_many([f"u{i}@crowd.test" for i in range(40)])
    others = [(r.email, r.sub_status, r.smtp_response) for r in batch.results]
    assert [r.status for r in batch.results] == [Status.VALID] * 40, [
        o for o in others if o[1] is not SubStatus.OK
    ]
    stats = tb.host_stats("mx.crowd.test")
    assert stats.peak_concurrent >= 3  # (some were refused: the case this is about)


async def test_a_host_that_hangs_up_after_n_rejections_is_not_made_to_again(
    testbed_factory, tmp_path, testbed_settings
):
    """Learnt from the first hang-up, sessions end one rejection before the server's limit:
    a second batch on the same engine is never hung up on (sessions ended at the limit
    itself and raced the server's hang-up, which won 12 times in 13)."""
    tb = testbed_factory(
        World.of(
            [
                HostSpec(
                    "mx.rej.test", HostBehaviour(mailboxes={"ok"}, disconnect_after_rejections=5)
                )
            ],
            [DomainSpec("rej.test", mx=[(10, "mx.rej.test")])],
        )
    )
    engine = Engine(testbed_settings(tb, tmp_path, smtp_max_sessions_per_host=1))
    first = await engine.verify_many([f"nobody{i}@rej.test" for i in range(30)])
    assert {r.status for r in first.results} == {Status.INVALID}
    assert tb.wait_until(lambda t: t.host_stats("mx.rej.test").active == 0)
    taught = tb.host_stats("mx.rej.test").hangups
    assert taught >= 1
    second = await engine.verify_many([f"nobody{i}@rej.test" for i in range(30, 60)])
    assert {r.status for r in second.results} == {Status.INVALID}
    assert tb.wait_until(lambda t: t.host_stats("mx.rej.test").active == 0)
    assert tb.host_stats("mx.rej.test").hangups == taught


def test_what_the_prober_learns_of_hosts_is_bounded(monkeypatch):
    """Recipient and rejection limits and "no mixing" are kept for the hosts learnt of
    last, not for every host a long-lived process ever met (they were never pruned)."""
    from verimail.engine.smtp import learned as smtp_learned

    monkeypatch.setattr(smtp_learned, "LEARNED_HOSTS", 3)
    learned = smtp_learned._Bounded()
    for name in ("a", "b", "c", "d"):
        learned[name] = 1
    assert list(learned) == ["b", "c", "d"]
    learned["b"] = 2  # learnt again: now the newest, so "c" is the oldest
    learned["e"] = 1
    assert list(learned) == ["d", "b", "e"]


async def test_a_recipient_asked_again_unmixed_keeps_to_the_session_cap(
    testbed_factory, tmp_path, testbed_settings
):
    """A host that refuses to mix domains in one message and takes 5 recipients per
    connection: the recipient asked again in a transaction of its own made a session's
    sixth RCPT, whose 452 taught the prober a limit of 1 for good (a second batch then paid
    a session per recipient). Now no session passes 5 RCPTs, nothing learns 1."""
    boxes = {"a1", "a2", "a3"} | {f"b{i}" for i in range(20)}
    strict = HostBehaviour(
        mailboxes=boxes, one_domain_per_transaction=True, max_rcpts_per_session=5
    )
    tb = testbed_factory(
        World.of(
            [HostSpec("mx.strict.test", strict)],
            [
                DomainSpec("a.test", mx=[(10, "mx.strict.test")]),
                DomainSpec("b.test", mx=[(10, "mx.strict.test")]),
            ],
        )
    )
    settings = testbed_settings(
        tb, tmp_path, smtp_max_sessions_per_host=1, smtp_rcpts_per_session=5
    )
    engine = Engine(settings)
    first = ["a1@a.test", "a2@a.test", "a3@a.test"] + [f"b{i}@b.test" for i in range(20)]
    assert {r.status for r in (await engine.verify_many(first)).results} == {Status.VALID}
    assert (engine.prober.learned.rcpt_limit(tb.address_of("mx.strict.test")) or 5) >= 4
    before = tb.host_stats("mx.strict.test").sessions
    again = [f"b{i}@b.test" for i in range(20)]
    assert {r.status for r in (await engine.verify_many(again)).results} == {Status.VALID}
    # 20 recipients and one probe at <= 5 per session: 5 sessions, not 21.
    assert tb.host_stats("mx.strict.test").sessions - before <= 6


DBEB = "550 5.4.1 Recipient address rejected: Access denied. AS(201806281) [x.prod.outlook.com]"


async def test_microsoft_365_refusing_an_unknown_recipient_is_read_as_no_such_mailbox(
    testbed_factory, tmp_path, testbed_settings
):
    """Exchange Online refuses a recipient its tenant does not have with 550 5.4.1 "Access
    denied". Read as "we were blocked", the unknown address was unknown, and the catch-all
    probe unclear made the real one only likely_valid (0.75)."""
    host = HostSpec("mx.m365.test", HostBehaviour(mailboxes={"alice"}, unknown_reply=DBEB))
    tb = testbed_factory(World.of([host], [DomainSpec("m365.test", mx=[(10, "mx.m365.test")])]))
    batch = await Engine(testbed_settings(tb, tmp_path)).verify_many(
        ["alice@m365.test", "nobody@m365.test"]
    )
    real, unknown = batch.results
    assert (real.status, real.sub_status) == (Status.VALID, SubStatus.OK)
    assert (unknown.status, unknown.sub_status) == (Status.INVALID, SubStatus.MAILBOX_NOT_FOUND)
    assert unknown.smtp_response.startswith("550 5.4.1")
