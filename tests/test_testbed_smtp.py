"""The testbed's scripted SMTP hosts, driven by real clients (smtplib and aiosmtplib)."""

from __future__ import annotations

import asyncio
import smtplib
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import aiosmtplib
import pytest

from verimail.testbed import smtp_server
from verimail.testbed.server import Testbed
from verimail.testbed.world import DomainSpec, HostBehaviour, HostSpec, World

MakeTestbed = Callable[..., Testbed]
SENDER = "probe@verimail.test"


def one_host(**behaviour: object) -> World:
    """A world with a single host ``mx.test.test`` serving ``test.test``."""
    host = HostSpec("mx.test.test", HostBehaviour(**behaviour))  # type: ignore[arg-type]
    return World.of([host], [DomainSpec("test.test", mx=[(10, "mx.test.test")])])


@contextmanager
def session(tb: Testbed, host: str = "mx.test.test", mail: bool = True) -> Iterator[smtplib.SMTP]:
    client = smtplib.SMTP(tb.address_of(host), tb.smtp_port, local_hostname="probe", timeout=30)
    try:
        client.ehlo()
        if mail:
            assert client.mail(SENDER)[0] == 250
        yield client
    finally:
        try:
            client.quit()
        except smtplib.SMTPServerDisconnected:
            client.close()


def rcpt(client: smtplib.SMTP, address: str) -> tuple[int, str]:
    code, text = client.rcpt(address)
    return code, text.decode()


def test_banner_and_known_mailboxes(testbed_factory: MakeTestbed) -> None:
    tb = testbed_factory(one_host(mailboxes={"alice", "Info", "bob@test.test"}))
    client = smtplib.SMTP(timeout=30)
    code, banner = client.connect(tb.address_of("mx.test.test"), tb.smtp_port)
    assert (code, banner.decode()) == (220, "mx.test.test ESMTP verimail testbed")
    client.ehlo("probe")
    assert client.mail(SENDER) == (250, b"2.1.0 Ok")
    assert rcpt(client, "alice@test.test") == (250, "2.1.5 Ok")
    assert rcpt(client, "INFO@Test.Test") == (250, "2.1.5 Ok")
    assert rcpt(client, "bob@test.test") == (250, "2.1.5 Ok")
    assert rcpt(client, "bob@other.test")[0] == 550
    assert rcpt(client, "nobody@test.test") == (
        550,
        "5.1.1 <nobody@test.test>: Recipient address rejected: User unknown",
    )
    client.quit()


def test_accept_all(testbed_factory: MakeTestbed) -> None:
    tb = testbed_factory(one_host(accept_all=True))
    with session(tb) as client:
        assert rcpt(client, "x7f3k2q9@test.test") == (250, "2.1.5 Ok")


def test_full_mailbox_and_block(testbed_factory: MakeTestbed) -> None:
    tb = testbed_factory(one_host(mailboxes={"alice"}, full_mailboxes={"stuffed"}))
    with session(tb) as client:
        assert rcpt(client, "stuffed@test.test") == (552, "5.2.2 Mailbox full")
        assert rcpt(client, "alice@test.test")[0] == 250
    tb.replace_world(one_host(mailboxes={"alice"}, block=True))
    with session(tb) as client:
        assert rcpt(client, "alice@test.test") == (
            554,
            "5.7.1 Client host rejected: listed at a block list",
        )


class _Clock:
    """A ``time`` stand-in for the testbed's SMTP module: its ``monotonic`` moves only when
    the test says, so a rule about elapsed time does not depend on the machine's speed."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_postgrey_rule_per_triplet_with_delay_and_retry_window(
    testbed_factory: MakeTestbed, monkeypatch: pytest.MonkeyPatch
) -> None:
    """postgrey: a (client IP, sender, recipient) triplet is deferred until ``greylist_delay``
    after its first try, passes when retried within ``greylist_window``, and is new again
    when first retried after the window. The rule is about elapsed time: the test moves the
    testbed's clock (at 0.3 s, a busy machine's two RCPTs could be that far apart)."""
    clock = _Clock()
    monkeypatch.setattr(smtp_server, "time", clock)
    tb = testbed_factory(one_host(mailboxes={"alice"}, greylist_delay=0.3, greylist_window=0.9))
    greylisted = (450, "4.2.0 Greylisted, try again later")
    with session(tb) as client:
        assert rcpt(client, "alice@test.test") == greylisted
        assert rcpt(client, "alice@test.test") == greylisted  # too early: still deferred
    clock.sleep(0.35)
    other_ip = smtplib.SMTP(
        tb.address_of("mx.test.test"), tb.smtp_port, timeout=30, source_address=("127.0.0.2", 0)
    )
    other_ip.ehlo("probe")
    other_ip.mail(SENDER)
    assert rcpt(other_ip, "alice@test.test") == greylisted  # another client IP: a new triplet
    other_ip.quit()
    with session(tb) as client:
        assert rcpt(client, "alice@test.test") == (250, "2.1.5 Ok")  # retried in the window
        assert rcpt(client, "alice@test.test") == (250, "2.1.5 Ok")  # and passed for good
        client.rset()
        assert client.mail("other@verimail.test")[0] == 250
        assert rcpt(client, "alice@test.test") == greylisted  # another sender: new triplet
    clock.sleep(0.95)
    with session(tb) as client:
        client.rset()
        assert client.mail("other@verimail.test")[0] == 250
        assert rcpt(client, "alice@test.test") == greylisted  # after the window: new again
    tb.reset_greylist()
    with session(tb) as client:
        assert rcpt(client, "alice@test.test") == greylisted  # a restarted MTA forgets passes


def test_postgrey_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="greylist_delay"):
        HostBehaviour(greylist_delay=5, greylist_window=5)


def test_greylisting_counts_tries_per_pair_across_sessions(testbed_factory: MakeTestbed) -> None:
    tb = testbed_factory(one_host(mailboxes={"alice"}, greylist_tries=2))
    greylisted = (450, "4.2.0 Greylisted, try again later")
    with session(tb) as client:
        assert rcpt(client, "alice@test.test") == greylisted
        assert rcpt(client, "nobody@test.test") == greylisted
    with session(tb) as client:
        assert rcpt(client, "alice@test.test") == greylisted
        assert rcpt(client, "alice@test.test")[0] == 250
        assert rcpt(client, "nobody@test.test") == greylisted
        assert rcpt(client, "nobody@test.test")[0] == 550
    with session(tb, mail=False) as client:
        client.mail("other@verimail.test")  # another sender: a new pair
        assert rcpt(client, "alice@test.test") == greylisted
    tb.reset_greylist()
    with session(tb) as client:
        assert rcpt(client, "alice@test.test") == greylisted


def test_recipient_limit_per_session(testbed_factory: MakeTestbed) -> None:
    tb = testbed_factory(one_host(mailboxes={"a", "b", "c"}, max_rcpts_per_session=2))
    with session(tb) as client:
        assert rcpt(client, "a@test.test")[0] == 250
        assert rcpt(client, "zz@test.test")[0] == 550
        assert rcpt(client, "c@test.test") == (452, "4.5.3 Too many recipients")
        client.rset()
        client.mail(SENDER)
        assert rcpt(client, "c@test.test")[0] == 452  # per session, not per transaction
    with session(tb) as client:
        assert rcpt(client, "c@test.test")[0] == 250


def test_disconnect_after_rejections(testbed_factory: MakeTestbed) -> None:
    tb = testbed_factory(one_host(mailboxes={"a"}, disconnect_after_rejections=2))
    with session(tb) as client:
        assert rcpt(client, "x@test.test")[0] == 550
        assert rcpt(client, "a@test.test")[0] == 250
        assert rcpt(client, "y@test.test")[0] == 550
        # Like Postfix at smtpd_hard_error_limit: a 421 right away, then the connection closes.
        code, text = client.getreply()
        assert (code, text.decode()) == (421, "4.7.0 mx.test.test Error: too many errors")
        with pytest.raises(smtplib.SMTPServerDisconnected):
            client.noop()
    stats = tb.host_stats("mx.test.test")
    assert (stats.rejections, stats.hangups) == (2, 1)


def test_pipelined_commands_after_the_disconnect_are_not_handled(
    testbed_factory: MakeTestbed,
) -> None:
    tb = testbed_factory(one_host(pipelining=True, disconnect_after_rejections=2))
    with socket.create_connection((tb.address_of("mx.test.test"), tb.smtp_port), 3) as sock:
        reader = sock.makefile("rb")
        reader.readline()
        sock.sendall(b"HELO probe\r\n")
        reader.readline()
        rcpts = "".join(f"RCPT TO:<u{i}@test.test>\r\n" for i in range(4))
        sock.sendall(f"MAIL FROM:<{SENDER}>\r\n{rcpts}".encode())
        replies = reader.read().splitlines()  # everything up to the server's close
    assert [r[:3] for r in replies] == [b"250", b"550", b"550", b"421"]
    assert tb.wait_idle()
    stats = tb.host_stats("mx.test.test")
    assert (stats.rcpt_to, stats.rejections) == (2, 2)


def test_refused_connection(testbed_factory: MakeTestbed) -> None:
    tb = testbed_factory(one_host(refuse_connections=True))
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((tb.address_of("mx.test.test"), tb.smtp_port), timeout=3)
    assert tb.host_stats("mx.test.test").sessions == 0


def test_greeting_421(testbed_factory: MakeTestbed) -> None:
    tb = testbed_factory(one_host(greeting_421=True))
    with pytest.raises(smtplib.SMTPConnectError) as info:
        smtplib.SMTP(tb.address_of("mx.test.test"), tb.smtp_port, timeout=30)
    assert info.value.smtp_code == 421
    assert info.value.smtp_error == b"4.3.2 Service not available"
    with socket.create_connection((tb.address_of("mx.test.test"), tb.smtp_port), 3) as sock:
        data = b""
        while chunk := sock.recv(1024):  # the server closes after the banner
            data += chunk
    assert data == b"421 4.3.2 Service not available\r\n"


def _first_line(sock: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\r\n") and (chunk := sock.recv(1024)):
        data += chunk
    return data


def test_max_connections_admits_the_first_to_arrive(testbed_factory: MakeTestbed) -> None:
    """A burst of four connections to a host that takes two: the first two get the banner,
    the other two the 421, however the server's loop batches their arrival (deciding when
    the banner was due turned all four away). The refused ones are not counted: once one
    admitted session ends, the next connection is let in."""
    tb = testbed_factory(one_host(max_connections=2))
    where = (tb.address_of("mx.test.test"), tb.smtp_port)
    socks = [socket.create_connection(where, timeout=30) for _ in range(4)]
    try:
        banners = [_first_line(sock) for sock in socks]
        assert [b[:3] for b in banners] == [b"220", b"220", b"421", b"421"], banners
        assert banners[2] == b"421 4.7.0 Too many concurrent connections from your IP\r\n"
        for sock in socks[1:]:
            sock.close()
        assert tb.wait_until(lambda tb: tb.host_stats("mx.test.test").active == 1)
        with socket.create_connection(where, timeout=30) as again:
            assert _first_line(again).startswith(b"220 ")
    finally:
        for sock in socks:
            sock.close()


def test_reply_delay_applies_to_banner_and_every_reply(testbed_factory: MakeTestbed) -> None:
    delay = 0.5
    tb = testbed_factory(one_host(mailboxes={"a"}, reply_delay=delay))
    started = time.perf_counter()
    client = smtplib.SMTP(tb.address_of("mx.test.test"), tb.smtp_port, timeout=30)
    assert time.perf_counter() - started >= delay
    started = time.perf_counter()
    reply = client.ehlo("probe")[1]  # multi-line: delayed once, not per line
    elapsed = time.perf_counter() - started
    lines = reply.count(b"\n") + 1
    assert lines >= 4, reply
    # Per line, it would have taken at least lines × delay: the rest is a busy machine's room.
    assert delay <= elapsed < (lines - 1) * delay
    client.quit()


def test_tarpit_slows_every_reply_after_the_first_rejection(testbed_factory: MakeTestbed) -> None:
    delay = 1.0
    tb = testbed_factory(one_host(mailboxes={"a"}, tarpit_delay=delay))
    with session(tb) as client:
        started = time.perf_counter()
        assert rcpt(client, "a@test.test")[0] == 250
        assert rcpt(client, "nobody@test.test")[0] == 550
        assert time.perf_counter() - started < delay  # the rejection itself is not delayed
        started = time.perf_counter()
        assert rcpt(client, "a@test.test")[0] == 250
        assert client.noop()[0] == 250
        assert time.perf_counter() - started >= 2 * delay


def test_starttls_and_pipelining_are_advertised_only_when_configured(
    testbed_factory: MakeTestbed,
) -> None:
    world = World.of(
        [
            HostSpec("tls.test", HostBehaviour(mailboxes={"a"}, starttls=True, pipelining=True)),
            HostSpec("plain.test", HostBehaviour(mailboxes={"a"})),
        ]
    )
    tb = testbed_factory(world)
    with session(tb, "plain.test", mail=False) as client:
        assert not client.has_extn("starttls") and not client.has_extn("pipelining")
        assert not client.has_extn("auth")
    with session(tb, "tls.test", mail=False) as client:
        assert client.has_extn("starttls") and client.has_extn("pipelining")
        assert client.starttls()[0] == 220
        client.ehlo()
        assert not client.has_extn("starttls")
        assert client.sock.version() is not None  # type: ignore[union-attr]
        client.mail(SENDER)
        assert rcpt(client, "a@test.test")[0] == 250
    stats = tb.host_stats("tls.test")
    assert (stats.starttls, stats.sessions, stats.rcpt_to) == (1, 1, 1)


def test_pipelined_commands_get_replies_in_order(testbed_factory: MakeTestbed) -> None:
    tb = testbed_factory(one_host(mailboxes={"a"}, pipelining=True))
    with socket.create_connection((tb.address_of("mx.test.test"), tb.smtp_port), 3) as sock:
        reader = sock.makefile("rb")
        assert reader.readline().startswith(b"220 ")
        sock.sendall(b"EHLO probe\r\n")
        while not reader.readline().startswith(b"250 "):
            pass
        sock.sendall(
            f"MAIL FROM:<{SENDER}>\r\nRCPT TO:<a@test.test>\r\nRCPT TO:<b@test.test>\r\n"
            "RSET\r\nQUIT\r\n".encode()
        )
        codes = [reader.readline()[:3] for _ in range(5)]
    assert codes == [b"250", b"250", b"550", b"250", b"221"]


def test_data_is_refused_and_counted(testbed_factory: MakeTestbed) -> None:
    tb = testbed_factory(one_host(mailboxes={"a"}))
    with session(tb) as client:
        client.rcpt("a@test.test")
        assert client.docmd("DATA") == (554, b"5.5.1 DATA not allowed on the testbed")
        with pytest.raises(smtplib.SMTPDataError):
            client.data("Subject: hi\r\n\r\nbody\r\n")
    assert tb.host_stats("mx.test.test").data == 2
    assert tb.total_stats().data == 2


def test_session_counters(testbed_factory: MakeTestbed) -> None:
    tb = testbed_factory(one_host(mailboxes={"a"}))
    for _ in range(2):
        with session(tb) as client:
            rcpt(client, "a@test.test")
            rcpt(client, "B@test.test")
    with session(tb, mail=False):
        pass
    stats = tb.host_stats("MX.test.test")
    assert (stats.sessions, stats.mail_from, stats.rcpt_to, stats.data) == (3, 2, 4, 0)
    assert stats.rcpts == ["a@test.test", "B@test.test"] * 2
    assert stats.rejections == 2
    assert tb.host_stats("unknown.test").sessions == 0
    tb.reset_stats()
    assert tb.host_stats("mx.test.test").rcpts == []


async def test_peak_concurrent_with_parallel_sessions(testbed_factory: MakeTestbed) -> None:
    world = World.of(
        [
            HostSpec("one.test", HostBehaviour(mailboxes={"a"})),
            HostSpec("two.test", HostBehaviour(accept_all=True, pipelining=True)),
        ]
    )
    tb = testbed_factory(world)

    async def open_session(host: str) -> aiosmtplib.SMTP:
        client = aiosmtplib.SMTP(
            hostname=tb.address_of(host), port=tb.smtp_port, timeout=30, start_tls=False
        )
        await client.connect()  # returns once the banner arrived: the server counted it
        await client.ehlo()
        await client.mail(SENDER)
        return client

    clients = await asyncio.gather(*(open_session("one.test") for _ in range(4)))
    clients.append(await open_session("two.test"))
    replies = await asyncio.gather(
        *(c.execute_command(b"RCPT", b"TO:<a@test.test>") for c in clients)
    )
    assert [r.code for r in replies] == [250] * 5
    during = tb.host_stats("one.test")
    assert (during.active, during.peak_concurrent, during.sessions) == (4, 4, 4)
    assert tb.total_stats().peak_concurrent == 5
    await asyncio.gather(*(c.quit() for c in clients))

    # QUIT returns before the server has counted the close: wait for that event.
    assert await asyncio.to_thread(tb.wait_idle)
    after = tb.host_stats("one.test")
    assert (after.active, after.peak_concurrent, after.rcpt_to) == (0, 4, 4)
    assert tb.total_stats().rcpt_to == 5
