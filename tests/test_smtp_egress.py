"""SMTP through SOCKS5 proxies (issue 34): a real proxy that no code of ours wrote (pproxy, a
subprocess on loopback) between the engine and the testbed's mail servers."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from api_helpers import PATIENCE, RawTcpServer, clean_env, env_for_testbed, wait_until
from cli_helpers import folded, run_verimail

from bench.socks_proxy import DialingSocksProxy, SocksProxy
from verimail.config import Settings
from verimail.engine import Egress, Engine, Routes, find_email
from verimail.engine.smtp.findings import probe_address
from verimail.engine.smtp.host_slots import HostSlots
from verimail.schemas.outcomes import Status, SubStatus
from verimail.testbed.world import DomainSpec, HostBehaviour, HostSpec, World

PASSWORD = "s3cret-Pa55"
REDIS_URL = "redis://127.0.0.1:6379/0"


def _world() -> World:
    return World.of(
        [
            HostSpec("mx.alpha.test", HostBehaviour(mailboxes={"alice", "bob"})),
            HostSpec("mx.beta.test", HostBehaviour(mailboxes={"carol"})),
        ],
        [
            DomainSpec("alpha.test", mx=[(10, "mx.alpha.test")]),
            DomainSpec("beta.test", mx=[(10, "mx.beta.test")]),
        ],
    )


ADDRESSES = ["alice@alpha.test", "bob@alpha.test", "nobody@alpha.test", "carol@beta.test"]


@pytest.fixture
def proxy() -> Iterator[SocksProxy]:
    """pproxy with a user name and password, started here and stopped at teardown."""
    with SocksProxy(user="verifier", password=PASSWORD) as running:
        yield running


def _verdicts(batch) -> list[tuple[Status, SubStatus]]:  # type: ignore[no-untyped-def]
    return [(r.status, r.sub_status) for r in batch.results]


async def test_verification_through_an_authenticating_proxy_matches_a_direct_run(
    testbed_factory, tmp_path, testbed_settings, proxy
):
    """Every session goes through the proxy (its log names each server's address), the
    testbed counts them, and the verdicts are those of a direct run."""
    tb = testbed_factory(_world())
    direct = await Engine(testbed_settings(tb, tmp_path)).verify_many(ADDRESSES)
    direct_sessions = tb.total_stats().sessions
    assert direct_sessions > 0 and proxy.destinations() == []

    tb.reset_stats()
    settings = testbed_settings(tb, tmp_path, smtp_proxy=proxy.url)
    proxied = await Engine(settings).verify_many(ADDRESSES)

    assert _verdicts(proxied) == _verdicts(direct)
    assert _verdicts(proxied)[0] == (Status.VALID, SubStatus.OK)
    assert _verdicts(proxied)[2] == (Status.INVALID, SubStatus.MAILBOX_NOT_FOUND)
    sessions = tb.total_stats().sessions
    assert sessions == direct_sessions
    port = settings.smtp_port
    asked = proxy.destinations()
    assert len(asked) == sessions
    assert set(asked) == {
        f"{tb.address_of('mx.alpha.test')}:{port}",
        f"{tb.address_of('mx.beta.test')}:{port}",
    }


async def test_a_wrong_password_is_egress_failed_and_the_reason_says_authentication(
    testbed_factory, tmp_path, testbed_settings, proxy, caplog
):
    tb = testbed_factory(_world())
    wrong = "wrong-Pa55word"
    settings = testbed_settings(tb, tmp_path, smtp_proxy=proxy.url_with(wrong))
    with caplog.at_level(logging.DEBUG):
        batch = await Engine(settings).verify_many(ADDRESSES)
    assert {(r.status, r.sub_status) for r in batch.results} == {
        (Status.UNKNOWN, SubStatus.EGRESS_FAILED)
    }
    reason = batch.results[0].reason
    assert "authentication" in reason and f"127.0.0.1:{proxy.port}" in reason
    assert batch.results[0].smtp_response is None  # (our words, not a server's reply)
    assert tb.total_stats().sessions == 0
    everything = caplog.text + repr(settings) + "".join(r.model_dump_json() for r in batch.results)
    assert wrong not in everything and PASSWORD not in everything


async def test_an_unreachable_proxy_is_egress_failed(testbed_factory, tmp_path, testbed_settings):
    tb = testbed_factory(_world())
    gone = SocksProxy()
    gone.start()
    url = gone.url
    gone.remove()  # (nothing listens on its port any more)
    batch = await Engine(testbed_settings(tb, tmp_path, smtp_proxy=url)).verify_many(ADDRESSES)
    assert {(r.status, r.sub_status) for r in batch.results} == {
        (Status.UNKNOWN, SubStatus.EGRESS_FAILED)
    }
    assert "could not be reached" in batch.results[0].reason


class _SilentProxy(RawTcpServer):
    """Takes the connection and reads the SOCKS greeting, never answers: a proxy that hangs,
    or one still waiting for a firewalled server (it answers only once it reached it)."""

    def handle(self, conn: socket.socket) -> None:
        while conn.recv(4096):
            pass


async def test_a_proxy_that_never_answers_is_a_timeout(testbed_factory, tmp_path, testbed_settings):
    """No answer within the connect time-out reads as a direct dial's time-out (a silent
    proxy and a firewalled server cannot be told apart), never egress_failed, whichever of
    the two deadlines (ours, the SOCKS client's) expires first (docs/egress.md)."""
    tb = testbed_factory(_world())
    silent = _SilentProxy()
    try:
        url = f"socks5://{silent.address}"
        settings = testbed_settings(tb, tmp_path, smtp_proxy=url, smtp_connect_timeout=0.5)
        batch = await Engine(settings).verify_many(["alice@alpha.test"])
    finally:
        silent.close()
    (result,) = batch.results
    assert (result.status, result.sub_status) == (Status.UNKNOWN, SubStatus.TIMEOUT)


async def test_a_destination_the_proxy_refuses_is_never_invalid(
    testbed_factory, tmp_path, testbed_settings
):
    """pproxy answers the SOCKS request before it dials, then hangs up on a destination its
    rule blocks: to us that is a connection closed before the greeting, as when a server
    does it (`unknown`, the reason naming the egress), never a verdict on the mailbox. A
    proxy that refuses in the SOCKS reply (code 2, "not allowed by ruleset") gives
    `egress_failed` / destination_refused (docs/egress.md)."""
    tb = testbed_factory(_world())
    beta = tb.address_of("mx.beta.test")
    with SocksProxy(block=beta.replace(".", r"\.")) as proxy:
        settings = testbed_settings(tb, tmp_path, smtp_proxy=proxy.url)
        batch = await Engine(settings).verify_many(["alice@alpha.test", "carol@beta.test"])
        blocked = proxy.blocked()
    alice, carol = batch.results
    assert (alice.status, alice.sub_status) == (Status.VALID, SubStatus.OK)
    assert carol.status is Status.UNKNOWN
    assert carol.sub_status in (SubStatus.CONNECTION_FAILED, SubStatus.EGRESS_FAILED)
    assert beta in blocked
    assert tb.host_stats("mx.beta.test").sessions == 0


async def test_a_destination_refused_behind_a_proxy_that_dials_first_reads_as_direct(
    testbed_factory, tmp_path, testbed_settings
):
    """A SOCKS5 server that dials before it answers (asyncio-socks-server, as RFC 1928 and
    Dante do) replies 5, "connection refused", for a mail server that is down: that is the
    server's refusal, not the proxy's fault — read as a direct dial's (`unknown` /
    connection_failed, never egress_failed), and the next MX host is asked.

    Only the refusal is judged through this proxy: asyncio-socks-server 0.3.0 can relay a
    server's greeting before its own SOCKS reply when the server speaks first, as SMTP
    servers do (a race in it, seen on a busy machine: "Unexpected SOCKS version number:
    0X32", the "2" of "220"). Verdicts through a working relay are pproxy's tests above."""
    down = "127.0.0.250"  # (no mail server of the testbed there)
    tb = testbed_factory(
        World.of(
            [HostSpec("mx.alpha.test", HostBehaviour(mailboxes={"alice"}))],
            [
                DomainSpec("dead.test", mx=[(10, "mx.down.test")]),
                DomainSpec("backup.test", mx=[(10, "mx.down.test"), (20, "mx.alpha.test")]),
                DomainSpec("mx.down.test", a=[down]),
            ],
        )
    )
    direct = await Engine(testbed_settings(tb, tmp_path)).verify_many(["alice@dead.test"])
    with DialingSocksProxy("127.0.0.2") as proxy:
        # (Room for a proxy process slow to answer on a busy machine: what is tested is its
        # reply, not its speed; the refusal itself comes at once.)
        settings = testbed_settings(tb, tmp_path, smtp_proxy=proxy.url, smtp_connect_timeout=20)
        dead = await Engine(settings).verify_many(["alice@dead.test"])
        # (the proxy dialled the server that is down, and says so in its log, written late)
        await wait_until(lambda: proxy.refused() >= 1, 30, what="the proxy's refusal")
        before = tb.host_stats("mx.alpha.test").sessions
        await Engine(settings).verify_many(["alice@backup.test"])
        after = tb.host_stats("mx.alpha.test").sessions
    assert _verdicts(dead) == _verdicts(direct) == [(Status.UNKNOWN, SubStatus.CONNECTION_FAILED)]
    assert "way out" not in (dead.results[0].reason or ""), dead.results[0].reason
    assert after > before  # (refused by the first MX host, it asked the next)


async def test_the_proxy_is_never_asked_for_an_address_the_guard_refuses(
    testbed_factory, tmp_path, testbed_settings, proxy
):
    """With the allow-list narrowed so that a testbed server counts as private, its domain
    is `private_address` and the proxy's log shows no request for it: verimail resolves the
    MX itself and the guard decides before the proxy is asked."""
    tb = testbed_factory(_world())
    alpha = tb.address_of("mx.alpha.test")
    settings = testbed_settings(
        tb, tmp_path, smtp_proxy=proxy.url, smtp_allow_networks=[f"{alpha}/32"]
    )
    batch = await Engine(settings).verify_many(["alice@alpha.test", "carol@beta.test"])
    alice, carol = batch.results
    assert (alice.status, alice.sub_status) == (Status.VALID, SubStatus.OK)
    assert (carol.status, carol.sub_status) == (Status.UNKNOWN, SubStatus.PRIVATE_ADDRESS)
    beta = tb.address_of("mx.beta.test")
    assert proxy.destinations() and not [d for d in proxy.destinations() if d.startswith(beta)]
    assert tb.host_stats("mx.beta.test").sessions == 0


def _egress_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "egress.yaml"
    path.write_text(text)
    return path


async def test_two_egresses_with_rules_send_each_pattern_through_its_own(
    testbed_factory, tmp_path, testbed_settings
):
    """Two proxies on two loopback addresses (two source addresses to the servers): the
    rule sends `*.alpha.test` through the first, the default route takes the rest through
    the second, each with its own HELO name."""
    tb = testbed_factory(_world())
    with (
        SocksProxy("127.0.0.2", user="a", password=PASSWORD) as first,
        SocksProxy("127.0.0.3") as second,
    ):
        path = _egress_file(
            tmp_path,
            f"""
egresses:
  - name: first
    url: {first.url}
    helo_name: first.verimail.test
  - name: second
    url: {second.url}
    helo_name: second.verimail.test
    mail_from: check@second.verimail.test
    max_sessions_per_host: 2
routes:
  - match: "*.alpha.test"
    use: first
default: second
""",
        )
        settings = testbed_settings(tb, tmp_path, smtp_egress_file=path)
        batch = await Engine(settings).verify_many(ADDRESSES)
        via_first, via_second = first.destinations(), second.destinations()
    assert _verdicts(batch)[:3] == [
        (Status.VALID, SubStatus.OK),
        (Status.VALID, SubStatus.OK),
        (Status.INVALID, SubStatus.MAILBOX_NOT_FOUND),
    ]
    port = settings.smtp_port
    assert set(via_first) == {f"{tb.address_of('mx.alpha.test')}:{port}"}
    assert set(via_second) == {f"{tb.address_of('mx.beta.test')}:{port}"}
    assert len(via_first) == tb.host_stats("mx.alpha.test").sessions
    assert len(via_second) == tb.host_stats("mx.beta.test").sessions


async def test_a_greylisted_address_is_retried_from_the_same_egress(
    testbed_factory, tmp_path, testbed_settings
):
    """postgrey keys on the client address: a retry from another egress (another address)
    would be deferred again. Two equal routes spread 12 domains of one server over two
    proxies on two addresses; every greylisted address passes on its retry, so each retry
    went out where its first try did."""
    boxes = {"alice"}
    domains = [f"d{i}.test" for i in range(12)]
    host = HostBehaviour(mailboxes=boxes, greylist_delay=0.2)
    tb = testbed_factory(
        World.of(
            [HostSpec("mx.grey.test", host)],
            [DomainSpec(d, mx=[(10, "mx.grey.test")]) for d in domains],
        )
    )
    with SocksProxy("127.0.0.2") as first, SocksProxy("127.0.0.3") as second:
        path = _egress_file(
            tmp_path,
            f"""
egresses:
  - {{name: first, url: "{first.url}", helo_name: first.verimail.test}}
  - {{name: second, url: "{second.url}", helo_name: second.verimail.test}}
default: {{first: 1, second: 1}}
""",
        )
        settings = testbed_settings(
            tb, tmp_path, smtp_egress_file=path, smtp_greylist_delay=0.3, smtp_greylist_retries=1
        )
        batch = await Engine(settings).verify_many([f"alice@{d}" for d in domains])
        used = (len(first.destinations()), len(second.destinations()))
    assert {(r.status, r.sub_status) for r in batch.results} == {(Status.VALID, SubStatus.OK)}
    assert all(used), used  # (both egresses carried domains)
    assert tb.host_stats("mx.grey.test").rcpt_to > len(domains)  # (they were greylisted)


def test_the_egress_of_a_domain_is_the_same_on_every_pass_and_weights_spread_domains(
    tmp_path,
):
    """A deferred retry pass runs in another process, perhaps days later: the choice is a
    function of the egress settings and the domain, so it is the same egress (and client
    address) as the first try. Weights spread domains in proportion."""
    path = _egress_file(
        tmp_path,
        """
egresses:
  - {name: a, url: "socks5://127.0.0.1:1080", helo_name: a.example.com}
  - {name: b, url: "socks5://127.0.0.1:1081", helo_name: b.example.com}
  - {name: c, url: direct, helo_name: c.example.com}
routes:
  - {match: ["*.google.com", "*.googlemail.com"], use: {a: 3, b: 1}}
default: c
""",
    )
    settings = Settings(data_dir=tmp_path, smtp_egress_file=path)
    once, again = Routes.from_settings(settings), Routes.from_settings(Settings(**dict(settings)))
    domains = [f"company{i}.example" for i in range(400)]
    google = ("aspmx.l.google.com", "alt1.aspmx.l.google.com")
    first = [once.choose(google, d).name for d in domains]
    assert first == [again.choose(google, d).name for d in domains]
    assert 240 <= first.count("a") <= 360 and first.count("c") == 0
    assert {once.choose(("mx.other.example",), d).name for d in domains} == {"c"}


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("egresses: [{name: a, url: direct, helo_name: localhost}]", "fully qualified"),
        (
            "egresses: [{name: a, url: direct, helo_name: a.example.com}]\ndefault: b",
            "not defined",
        ),
        (
            "egresses: [{name: a, url: 'http://u:topsecret@h:1', helo_name: a.example.com}]",
            "socks5://",
        ),
    ],
)
def test_a_bad_egress_file_stops_the_start_and_never_quotes_a_password(tmp_path, text, says):
    path = _egress_file(tmp_path, text)
    with pytest.raises(ValueError, match=says) as refused:
        Settings(data_dir=tmp_path, smtp_egress_file=path)
    assert "topsecret" not in str(refused.value)


def test_a_helo_name_that_is_not_fully_qualified_stops_the_start(tmp_path):
    with pytest.raises(ValueError, match="fully qualified"):
        Settings(data_dir=tmp_path, smtp_helo_name="verimail")
    with pytest.raises(ValueError, match="not both"):
        Settings(
            data_dir=tmp_path,
            smtp_proxy="socks5://127.0.0.1:1080",
            smtp_egress_file=_egress_file(
                tmp_path, "egresses: [{name: a, url: direct, helo_name: a.example.com}]"
            ),
        )


@pytest.mark.redis
async def test_politeness_slots_are_per_egress_and_server_in_redis() -> None:
    """Each egress is a source address of its own: its sessions to a server hold leases
    under a key of their own (fleet-wide in Redis, as before), with its own cap; the direct
    egress keeps the server's key of before."""
    prefix = f"verimail-test-{uuid.uuid4().hex}"
    slots = HostSlots(5, 100, REDIS_URL, prefix=prefix)
    assert slots.leases is not None
    server = "127.9.9.9"
    first = Egress("first", "socks5://127.0.0.2:1080", "a.example.com", max_sessions_per_host=1)
    second = Egress("second", "socks5://127.0.0.3:1080", "b.example.com", max_sessions_per_host=1)
    direct = Egress("direct", None, "c.example.com")
    assert direct.slot_key(server) == server
    keys = {slots.leases.key(e.slot_key(server)) for e in (first, second, direct)}
    assert len(keys) == 3
    held = []
    try:
        for egress in (first, second):  # (one each, though each egress's cap is 1)
            held.append(await asyncio.wait_for(slots.take(egress.slot_key(server), 1), PATIENCE))
        client = slots.leases._client
        for egress in (first, second):
            assert client.zcard(slots.leases.key(egress.slot_key(server))) == 1
        assert client.zcard(slots.leases.key(server)) == 0
    finally:
        for one in held:
            one.release()
        slots.close()


async def test_each_egress_holds_its_own_session_cap_to_a_server(
    testbed_factory, tmp_path, testbed_settings
):
    """Two egresses with a cap of one session each: at most two sessions at once reach the
    server, and both egresses carried some."""
    domains = [f"e{i}.test" for i in range(16)]
    host = HostBehaviour(mailboxes={"alice"}, reply_delay=0.02)
    tb = testbed_factory(
        World.of(
            [HostSpec("mx.one.test", host)],
            [DomainSpec(d, mx=[(10, "mx.one.test")]) for d in domains],
        )
    )
    with SocksProxy("127.0.0.2") as first, SocksProxy("127.0.0.3") as second:
        path = _egress_file(
            tmp_path,
            f"""
egresses:
  - {{name: first, url: "{first.url}", helo_name: first.verimail.test, max_sessions_per_host: 1}}
  - {{name: second, url: "{second.url}", helo_name: second.verimail.test, max_sessions_per_host: 1}}
default: [first, second]
""",
        )
        settings = testbed_settings(tb, tmp_path, smtp_egress_file=path, smtp_rcpts_per_session=2)
        batch = await Engine(settings).verify_many([f"alice@{d}" for d in domains])
        used = (len(first.destinations()), len(second.destinations()))
    assert {r.status for r in batch.results} == {Status.VALID}
    assert all(used), used
    stats = tb.host_stats("mx.one.test")
    assert sum(used) == stats.sessions
    assert stats.peak_concurrent <= 2


def test_the_cli_never_shows_the_password(testbed_factory, tmp_path, proxy):
    """`verimail verify` through a proxy with a wrong password: `egress_failed`, the reason
    naming the proxy and authentication, and neither password in anything printed; a proxy
    URL that is no SOCKS5 URL stops the command with the URL masked."""
    tb = testbed_factory(_world())
    wrong = "cli-wrong-Pa55"
    env = clean_env(
        {
            **env_for_testbed(tb),
            "VERIMAIL_DATA_DIR": str(tmp_path),
            "VERIMAIL_SMTP_PROXY": proxy.url_with(wrong),
        }
    )
    out = run_verimail(["verify", "alice@alpha.test", "--json"], env)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert (result["status"], result["sub_status"]) == ("unknown", "egress_failed")
    assert "authentication" in result["reason"]
    assert wrong not in out.stdout + out.stderr and PASSWORD not in out.stdout + out.stderr

    env["VERIMAIL_SMTP_PROXY"] = f"http://verifier:{wrong}@127.0.0.1:{proxy.port}"
    bad = run_verimail(["verify", "alice@alpha.test", "--json"], env)
    assert bad.returncode != 0
    assert "socks5://" in folded(bad.stderr) and wrong not in bad.stdout + bad.stderr


async def test_the_finder_goes_through_the_egress_of_its_domain(
    testbed_factory, tmp_path, testbed_settings, proxy
):
    """The finder's session to a domain leaves through the same egress as verification
    (the rule of its MX hosts), with that egress's sender in the catch-all probe."""
    tb = testbed_factory(
        World.of(
            [HostSpec("mx.people.test", HostBehaviour(mailboxes={"john.smith"}))],
            [DomainSpec("people.test", mx=[(10, "mx.people.test")])],
        )
    )
    path = _egress_file(
        tmp_path,
        f"""
egresses:
  - {{name: direct, url: direct, helo_name: direct.verimail.test}}
  - {{name: proxied, url: "{proxy.url}", helo_name: p.verimail.test, mail_from: f@p.verimail.test}}
routes:
  - {{match: "mx.people.test", use: proxied}}
default: direct
""",
    )
    engine = Engine(testbed_settings(tb, tmp_path, smtp_egress_file=path))
    result = await find_email(engine, "John", "Smith", "people.test", max_probes=5)
    assert result.found and result.email == "john.smith@people.test"
    sessions = tb.host_stats("mx.people.test").sessions
    assert sessions >= 1 and len(proxy.destinations()) == sessions
    probe = tb.host_stats("mx.people.test").rcpts[0]
    assert probe == probe_address("people.test", "f@p.verimail.test")


@pytest.mark.usefixtures("prefect_harness")
async def test_a_job_whose_proxy_is_down_is_not_charged_for_those_rows(
    testbed_factory, tmp_path, testbed_settings
):
    """Issue 47: rows that ended `unknown`/`egress_failed` because the service's own proxy
    was down were charged (36 credits for 36 such rows): the list owner paid for our outage.
    A JSON bulk job through a dead proxy, its retry passes spent: the three rows on a
    domain with a mail server are refunded, the one settled by DNS alone (a domain that does
    not exist) is charged, and the ledger says so."""
    from api_helpers import json_bulk_job, running_app, total_balance

    from verimail.store.billing.ledger import ledger

    tb = testbed_factory(_world())
    gone = SocksProxy()
    gone.start()
    url = gone.url
    gone.remove()  # (nothing listens on its port any more)
    settings = testbed_settings(tb, tmp_path, smtp_proxy=url)
    emails = ["alice@alpha.test", "nobody@alpha.test", "carol@beta.test", "x@no-such.test"]
    async with running_app(settings) as app:
        customer = app.customer(credits=10)
        job = await json_bulk_job(app.client, customer, emails, timeout=120)
        assert job["status"] == "completed", job
        results = {r["email"]: r for r in job["results"]}
        assert {e: results[e]["sub_status"] for e in emails[:3]} == dict.fromkeys(
            emails[:3], "egress_failed"
        )
        assert results["x@no-such.test"]["status"] == "invalid"
        assert total_balance(app.store, customer.account_id) == 10 - 1
        moves = [
            (entry.kind, entry.delta)
            for entry in ledger(app.store.engine, customer.account_id)
            if entry.reference == f"job:{job['job_id']}"
        ]
    assert sorted(moves) == [("refund", 3), ("reserve", -4)], moves
