"""Servers that refuse at another step than RCPT TO — the banner, EHLO/HELO, STARTTLS, our
MAIL FROM — and 452 replies that are not the recipient limit. A refusal that names no
mailbox never makes an address invalid, and costs no more sessions than it must."""

from __future__ import annotations

import pytest

from verimail.engine.core import Engine
from verimail.engine.finder import find_email
from verimail.schemas.outcomes import Status, SubStatus
from verimail.testbed.world import DomainSpec, HostBehaviour, HostSpec, World

SENDER_UNKNOWN = "553 5.1.8 <verify@verimail.localhost>: Sender address rejected: Domain not found"

HOSTS: dict[str, HostBehaviour] = {
    "sender5": HostBehaviour(mailboxes={"alice"}, mail_from_reply=SENDER_UNKNOWN),
    "sender4": HostBehaviour(
        mailboxes={"alice"},
        mail_from_reply="450 4.1.8 <verify@verimail.localhost>: Sender address rejected: "
        "Domain not found",
    ),
    "banner554": HostBehaviour(
        mailboxes={"alice"}, greeting_reply="554 5.3.2 mx.banner554.test not accepting connections"
    ),
    "helo": HostBehaviour(
        mailboxes={"alice"}, helo_reply="554 5.7.1 <verimail.localhost>: Helo command rejected"
    ),
    "helo450": HostBehaviour(
        mailboxes={"alice"}, helo_reply="450 4.7.1 Helo command rejected: try again later"
    ),
    "helo421": HostBehaviour(
        mailboxes={"alice"}, helo_reply="421 4.7.0 Try again later, closing connection"
    ),
    "notls": HostBehaviour(
        mailboxes={"alice"}, starttls=True, starttls_reply="454 4.7.0 TLS not available"
    ),
    "ascii": HostBehaviour(mailboxes={"alice", "jörg"}, smtputf8=False),
    "nolimit": HostBehaviour(mailboxes={"alice"}, max_rcpts_per_session=0),
    "quota": HostBehaviour(
        mailboxes={f"user{i}" for i in range(10)},
        rcpt_replies={"full": "452 4.2.2 The email account that you tried to reach is over quota"},
    ),
}


@pytest.fixture
def engine(testbed_factory, testbed_settings, tmp_path) -> Engine:
    world = World.of(
        [HostSpec(f"mx.{name}.test", behaviour) for name, behaviour in HOSTS.items()],
        [DomainSpec(f"{name}.test", mx=[(10, f"mx.{name}.test")]) for name in HOSTS],
    )
    tb = testbed_factory(world)
    engine = Engine(testbed_settings(tb, tmp_path))
    engine.testbed = tb  # type: ignore[attr-defined]
    return engine


@pytest.mark.parametrize(
    ("domain", "sub_status"),
    [("sender5.test", SubStatus.BLOCKED), ("sender4.test", SubStatus.TEMP_FAILURE)],
)
async def test_a_refused_sender_says_nothing_of_the_mailbox(engine, domain, sub_status):
    """Postfix's reject_unknown_sender_domain refuses our MAIL FROM with a 5.1.8: that is
    about our address, not alice's or nobody's, so both are unknown and no RCPT is sent."""
    batch = await engine.verify_many([f"alice@{domain}", f"nobody@{domain}"])
    for result in batch.results:
        assert (result.status, result.sub_status) == (Status.UNKNOWN, sub_status), result
        assert "does not exist" not in result.reason
        assert result.smtp_response and "Sender address rejected" in result.smtp_response
    assert engine.testbed.host_stats(f"mx.{domain.removesuffix('.test')}.test").rcpts == []


async def test_the_finder_learns_nothing_from_a_refused_sender(engine):
    """The finder's candidates are not "refused" when our sender was: no find, no claim
    that the addresses do not exist, no RCPT."""
    result = await find_email(engine, "Alice", "Smith", "sender5.test", max_probes=4)
    assert not result.found and result.email is None
    assert "refused all" not in result.reason
    assert engine.testbed.host_stats("mx.sender5.test").rcpts == []


@pytest.mark.parametrize(
    ("domain", "sub_status"),
    [
        ("banner554.test", SubStatus.EGRESS_BLOCKED),  # (refuses our IP: no address named)
        ("helo.test", SubStatus.BLOCKED),
        ("helo450.test", SubStatus.TEMP_FAILURE),
        ("helo421.test", SubStatus.TEMP_FAILURE),
    ],
)
async def test_a_refusal_before_any_address_is_blocked(engine, domain, sub_status):
    """A 554 banner or a refused EHLO/HELO comes before any address is named: unknown
    (egress_blocked: a banner can only refuse our IP; blocked), not risky, and the same
    for every address; a 4xx to EHLO (450, or 421 and
    the server hangs up) is a temporary failure, with the server's reply kept (a 450 was
    a protocol_error, a 421 a connection_failed with no reply)."""
    batch = await engine.verify_many([f"alice@{domain}", f"nobody@{domain}"])
    for result in batch.results:
        assert (result.status, result.sub_status) == (Status.UNKNOWN, sub_status), result
        assert result.smtp_response and result.smtp_response[:3] in ("554", "450", "421")


async def test_a_refused_starttls_goes_on_in_plain_text(engine):
    """The server offers STARTTLS and then answers 454: the check goes on unencrypted, as
    mail servers do, and reads the mailboxes as usual."""
    batch = await engine.verify_many(["alice@notls.test", "nobody@notls.test"])
    assert [r.status for r in batch.results] == [Status.VALID, Status.INVALID]
    assert engine.testbed.host_stats("mx.notls.test").starttls == 1


async def test_an_over_quota_452_is_a_full_mailbox_not_a_recipient_limit(engine):
    """Gmail answers a full mailbox with 452 4.2.2: that mailbox is risky (mailbox_full),
    and the host does not get a recipient limit of one from it — the addresses after it
    still share one session."""
    first = await engine.verify_many(["full@quota.test"])
    assert (first.results[0].status, first.results[0].sub_status) == (
        Status.RISKY,
        SubStatus.MAILBOX_FULL,
    )
    before = engine.testbed.host_stats("mx.quota.test").sessions
    batch = await engine.verify_many([f"user{i}@quota.test" for i in range(10)])
    assert {r.status for r in batch.results} == {Status.VALID}
    assert engine.testbed.host_stats("mx.quota.test").sessions - before == 1


async def test_a_non_ascii_mailbox_on_a_server_without_smtputf8_is_not_checked(engine):
    """The server cannot be asked about jörg@ (it does not offer SMTPUTF8): the result says
    the mailbox was not checked — no reply is made up and none is quoted — and alice@ on
    the same server is checked as usual."""
    batch = await engine.verify_many(["jörg@ascii.test", "alice@ascii.test"])
    jorg, alice = batch.results
    assert (jorg.status, jorg.sub_status) == (Status.UNKNOWN, SubStatus.NOT_CHECKED)
    assert not jorg.smtp_response and "replied" not in jorg.reason
    assert alice.status is Status.VALID
    asked = engine.testbed.host_stats("mx.ascii.test").rcpts
    assert "alice@ascii.test" in asked and not any("jörg" in rcpt for rcpt in asked)


async def test_a_refused_sender_costs_one_refusal_not_one_per_address(engine):
    """Our sender refused: the host will refuse it for every recipient, so it is asked
    once, not once per address (Postfix hangs up after 20 errors), and all 60 addresses
    get that answer."""
    batch = await engine.verify_many([f"user{i}@sender5.test" for i in range(60)])
    assert {(r.status, r.sub_status) for r in batch.results} == {
        (Status.UNKNOWN, SubStatus.BLOCKED)
    }
    stats = engine.testbed.host_stats("mx.sender5.test")
    assert (stats.mail_from, stats.rcpts) == (1, [])


async def test_a_452_on_the_first_recipient_is_not_a_limit_to_learn(engine):
    """A server that answers even the first recipient of a session with 452 4.5.3 has no
    limit to learn (it takes none): the finder and the bulk prober give up within their
    retry bounds instead of reconnecting for ever."""
    found = await find_email(engine, "Alice", "Smith", "nolimit.test", max_probes=3)
    assert not found.found
    batch = await engine.verify_many(["alice@nolimit.test", "bob@nolimit.test"])
    assert {r.status for r in batch.results} == {Status.UNKNOWN}
    assert engine.testbed.host_stats("mx.nolimit.test").sessions < 20


async def test_an_mx_that_only_says_421_is_dropped_for_the_next(
    testbed_factory, testbed_settings, tmp_path
):
    """The preferred MX answers RCPT TO with 421 every time: the address was asked there
    MAX_ATTEMPTS times and came back unknown/temp_failure, though the next MX host holds
    the mailbox. A 421 now counts as a broken session, so the host is dropped and the next
    one asked (README: MX fallback on refusal/timeout/421)."""
    closing = "421 4.3.2 Service shutting down, closing transmission channel"
    world = World.of(
        [
            HostSpec("mx1.fallback.test", HostBehaviour(rcpt_replies={"alice": closing})),
            HostSpec("mx2.fallback.test", HostBehaviour(mailboxes={"alice"})),
        ],
        [DomainSpec("fallback.test", mx=[(10, "mx1.fallback.test"), (20, "mx2.fallback.test")])],
    )
    tb = testbed_factory(world)
    engine = Engine(testbed_settings(tb, tmp_path))
    try:
        batch = await engine.verify_many(["alice@fallback.test"])
    finally:
        engine.close()
    (result,) = batch.results
    assert (result.status, result.sub_status) == (Status.VALID, SubStatus.OK), result.reason
    assert "alice@fallback.test" in tb.host_stats("mx2.fallback.test").rcpts
