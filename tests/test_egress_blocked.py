"""Blocked-egress detection (issue 34, point 4): a server that refuses our *sending IP* — a
blocklist named at RCPT TO, a 554 banner, resets before the greeting — makes the address
``unknown``/``egress_blocked``, never ``invalid``; the egress is cooled down for that server
(in this process, and fleet-wide through Redis), and ``/metrics`` counts the results."""

from __future__ import annotations

import pytest
import redis

from verimail.engine import ENGINE_REGISTRY
from verimail.engine.core import Engine
from verimail.engine.smtp.session import GREETING_RESETS
from verimail.flows.summary import summary_rows
from verimail.schemas.outcomes import Status, SubStatus
from verimail.store import jobs as job_store
from verimail.testbed.world import DomainSpec, HostBehaviour, HostSpec, World

REDIS_URL = "redis://127.0.0.1:6379/0"
LOOPBACK = ["127.0.0.0/8"]  # (every client of the testbed: the engine dials from loopback)

HOSTS: dict[str, HostBehaviour] = {
    "listed-rcpt": HostBehaviour(mailboxes={"alice"}, blocklisted_clients=LOOPBACK),
    "listed-banner": HostBehaviour(
        mailboxes={"alice"}, blocklisted_clients=LOOPBACK, blocklist_stage="greeting"
    ),
    "resets": HostBehaviour(mailboxes={"alice"}, hostile="reset_at_greeting"),
    "elsewhere": HostBehaviour(mailboxes={"alice"}, blocklisted_clients=["192.0.2.0/24"]),
    "backup": HostBehaviour(mailboxes={"alice"}),
}


def _world() -> World:
    hosts = [HostSpec(f"mx.{name}.test", behaviour) for name, behaviour in HOSTS.items()]
    domains = [DomainSpec(f"{name}.test", mx=[(10, f"mx.{name}.test")]) for name in HOSTS]
    # A domain whose first MX lists us and whose second does not: the second answers.
    domains.append(
        DomainSpec("fallback.test", mx=[(10, "mx.listed-rcpt.test"), (20, "mx.backup.test")])
    )
    return World.of(hosts, domains)


@pytest.fixture
def engine(testbed_factory, testbed_settings, tmp_path) -> Engine:
    tb = testbed_factory(_world())
    engine = Engine(testbed_settings(tb, tmp_path))
    engine.testbed = tb  # type: ignore[attr-defined]
    return engine


def _blocked_count(egress: str = "direct") -> float:
    value = ENGINE_REGISTRY.get_sample_value("verimail_egress_blocked_total", {"egress": egress})
    return value or 0.0


async def test_a_blocklist_at_rcpt_is_egress_blocked_and_asked_once(engine):
    """Postfix's reject_rbl_client answers every RCPT with a Spamhaus 554: each address is
    unknown/egress_blocked (alice exists, nobody does not: the server said neither), the
    reply is quoted, and the host is asked once — the catch-all probe — not per address.
    Each result is counted for the egress in the metrics."""
    before = _blocked_count()
    batch = await engine.verify_many(["alice@listed-rcpt.test", "nobody@listed-rcpt.test"])
    for result in batch.results:
        assert (result.status, result.sub_status) == (Status.UNKNOWN, SubStatus.EGRESS_BLOCKED)
        assert "blocked using zen.spamhaus.org" in (result.smtp_response or "")
        assert "refused our sending IP" in result.reason and 'egress "direct"' in result.reason
    assert len(engine.testbed.host_stats("mx.listed-rcpt.test").rcpts) == 1
    assert _blocked_count() - before == 2


async def test_a_blocklist_banner_is_egress_blocked(engine):
    """postscreen turns a listed client away with a 554 banner: no EHLO, no RCPT, and
    every address is unknown/egress_blocked with the banner quoted."""
    batch = await engine.verify_many(["alice@listed-banner.test", "bob@listed-banner.test"])
    for result in batch.results:
        assert (result.status, result.sub_status) == (Status.UNKNOWN, SubStatus.EGRESS_BLOCKED)
        assert (result.smtp_response or "").startswith("554 5.7.1")
    stats = engine.testbed.host_stats("mx.listed-banner.test")
    assert (stats.sessions, stats.rcpts) == (1, [])


async def test_repeated_resets_before_the_greeting_are_egress_blocked(engine):
    """A server that takes the connection and resets it before any banner, again and again,
    is turning our IP away: egress_blocked after GREETING_RESETS tries, not more."""
    batch = await engine.verify_many(["alice@resets.test", "bob@resets.test"])
    for result in batch.results:
        assert (result.status, result.sub_status) == (Status.UNKNOWN, SubStatus.EGRESS_BLOCKED)
        assert result.smtp_response is None  # (no reply to quote: none came)
    assert engine.testbed.host_stats("mx.resets.test").sessions == GREETING_RESETS


async def test_a_refused_egress_cools_down_for_that_server(engine):
    """After the refusal, the same server is not dialled through that egress again for
    ``smtp_egress_cooldown``: the next addresses end egress_blocked at once, the refusal
    quoted; another server is asked as usual."""
    await engine.verify_many(["alice@listed-banner.test"])
    sessions = engine.testbed.host_stats("mx.listed-banner.test").sessions
    batch = await engine.verify_many(["carol@listed-banner.test", "alice@backup.test"])
    cooled, other = batch.results
    assert (cooled.status, cooled.sub_status) == (Status.UNKNOWN, SubStatus.EGRESS_BLOCKED)
    assert "blocked using zen.spamhaus.org" in (cooled.smtp_response or "")
    assert engine.testbed.host_stats("mx.listed-banner.test").sessions == sessions
    assert other.status is Status.VALID


async def test_a_client_not_on_the_list_is_answered(engine):
    """The rule is per client: a listener that lists another network answers us."""
    batch = await engine.verify_many(["alice@elsewhere.test", "nobody@elsewhere.test"])
    assert [r.status for r in batch.results] == [Status.VALID, Status.INVALID]


async def test_the_next_mx_host_answers_when_the_first_refuses_our_ip(engine):
    """Another server of the domain may not use that blocklist: it is asked, and its
    answers stand (never egress_blocked for an address a server did answer)."""
    batch = await engine.verify_many(["alice@fallback.test", "nobody@fallback.test"])
    assert [r.status for r in batch.results] == [Status.VALID, Status.INVALID]


@pytest.mark.redis
async def test_a_cool_down_holds_across_processes_through_redis(
    testbed_factory, testbed_settings, tmp_path
):
    """Two engines (two workers of a fleet) share cool-downs through Redis: once the first
    is refused, the second does not dial that server at all."""
    tb = testbed_factory(_world())
    settings = testbed_settings(tb, tmp_path, redis_url=REDIS_URL, smtp_egress_cooldown=60)
    first, second = Engine(settings), Engine(settings)
    client = redis.Redis.from_url(REDIS_URL)
    try:
        await first.verify_many(["alice@listed-banner.test"])
        sessions = tb.host_stats("mx.listed-banner.test").sessions
        batch = await second.verify_many(["bob@listed-banner.test"])
        assert batch.results[0].sub_status is SubStatus.EGRESS_BLOCKED
        assert tb.host_stats("mx.listed-banner.test").sessions == sessions
    finally:
        for key in client.scan_iter("verimail:egress-cooldown:direct:*"):
            client.delete(key)
        client.close()


JOB_EMAILS = [
    "alice@listed-rcpt.test",  # (refused at RCPT)
    "nobody@listed-rcpt.test",
    "carol@listed-banner.test",  # (refused at the greeting)
    "alice@backup.test",
]
TOKEN = "metrics-token-for-the-egress-test-0123456789"


@pytest.mark.usefixtures("prefect_harness")
async def test_a_job_parks_blocked_rows_counts_them_per_egress_and_exports_them(
    testbed_factory, testbed_settings, tmp_path
):
    """In a job, egress_blocked rows are parked for the deferred pass like other temporary
    outcomes; the pass comes while the egress still cools down for that server, so it asks
    nothing of it, and the job completes with the rows unknown/egress_blocked, counted per
    egress in the job JSON, its summary and /metrics."""
    from api_helpers import poll_job, poll_until, running_app
    from prometheus_client.parser import text_string_to_metric_families

    tb = testbed_factory(_world())
    settings = testbed_settings(
        tb,
        tmp_path,
        job_retry_delay=1.0,
        job_retry_passes=1,
        job_retry_max_wait=10.0,
        smtp_egress_cooldown=600,
        metrics_token=TOKEN,
    )
    auth = {"Authorization": f"Bearer {TOKEN}"}

    def blocked(text: str) -> float:
        return sum(
            sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == "verimail_egress_blocked_total"
            and sample.labels.get("egress") == "direct"
        )

    async with running_app(settings) as app:
        before = blocked((await app.client.get("/metrics", headers=auth)).text)
        customer = app.customer(credits=100)
        created = await app.client.post(
            "/api/verify/bulk", json={"emails": JOB_EMAILS}, headers=customer.headers
        )
        assert created.status_code == 200, created.text
        url = f"/api/verify/bulk/{created.json()['job_id']}"
        waiting = await poll_until(
            app.client, url, customer.headers, lambda body: body["phase"] == "waiting_to_retry"
        )
        assert waiting["retry_waiting"] == 3
        sessions = tb.host_stats("mx.listed-rcpt.test").sessions
        banners = tb.host_stats("mx.listed-banner.test").sessions
        done = await poll_job(app.client, url, customer.headers)
        assert done["status"] == "completed", done
        got = {r["email"]: (r["status"], r["sub_status"]) for r in done["results"]}
        assert got["alice@listed-rcpt.test"] == ("unknown", "egress_blocked")
        assert got["nobody@listed-rcpt.test"] == ("unknown", "egress_blocked")
        assert got["carol@listed-banner.test"] == ("unknown", "egress_blocked")
        assert got["alice@backup.test"] == ("valid", "ok")
        assert done["egress_blocked"] == {"direct": 3}
        assert tb.host_stats("mx.listed-rcpt.test").sessions == sessions  # (cooling down)
        assert tb.host_stats("mx.listed-banner.test").sessions == banners
        job = job_store.get_job_any(app.store.engine, done["job_id"])
        summary = {row["item"]: row["value"] for row in summary_rows(settings, job)}
        assert summary["our IP refused (egress direct)"] == "3"
        after = blocked((await app.client.get("/metrics", headers=auth)).text)
    assert after - before >= 3


async def test_a_refused_egress_passes_the_addresses_to_the_next_route(
    testbed_factory, testbed_settings, tmp_path
):
    """Two egresses on the default route: where the server refused the domain's first one
    (cooling down there), the addresses go out through the second and get its answers; a
    route of one egress leaves them egress_blocked. (Both egresses leave from loopback here,
    so the first one's refusal is its cool-down, as a refusal a moment before leaves it.)"""
    tb = testbed_factory(_world())
    routes = tmp_path / "egress.yaml"
    routes.write_text(
        "egresses:\n"
        "  - {name: first, url: direct, helo_name: one.verimail.test}\n"
        "  - {name: second, url: direct, helo_name: two.verimail.test}\n"
        "routes:\n"
        "  - {match: 'mx.listed-banner.test', use: {first: 1}}\n"
        "default: {first: 1, second: 1}\n"
    )
    engine = Engine(testbed_settings(tb, tmp_path, smtp_egress_file=routes))
    prober = engine.prober
    ranked = prober.routes.ranked(("mx.backup.test",), "backup.test")
    assert [e.name for e in ranked] in (["first", "second"], ["second", "first"])
    refusal = "554 5.7.1 Client host [127.0.0.1] blocked using zen.spamhaus.org"
    await prober.cooldown.cool(ranked[0].name, tb.address_of("mx.backup.test"), refusal)

    batch = await engine.verify_many(
        ["alice@backup.test", "nobody@backup.test", "alice@listed-banner.test"]
    )
    alice, nobody, listed = batch.results
    assert (alice.status, nobody.status) == (Status.VALID, Status.INVALID)
    assert (listed.status, listed.sub_status) == (Status.UNKNOWN, SubStatus.EGRESS_BLOCKED)
    assert 'egress "first"' in listed.reason


async def test_a_server_that_lists_the_direct_egress_answers_through_the_proxy(
    testbed_factory, testbed_settings, tmp_path
):
    """A real refusal and a real second route: the server lists 127.0.0.1 (direct sessions)
    and not the SOCKS5 proxy's 127.0.0.2 (pproxy, a subprocess). The direct egress, first on
    the route, is refused once; the addresses then get the server's answers through the
    proxy, and the direct egress cools down there."""
    from bench.socks_proxy import SocksProxy
    from verimail.config import read_egress_file
    from verimail.engine.smtp.egress import Routes

    world = World.of(
        [
            HostSpec(
                "mx.picky.test",
                HostBehaviour(mailboxes={"alice"}, blocklisted_clients=["127.0.0.1/32"]),
            )
        ],
        [DomainSpec("picky.test", mx=[(10, "mx.picky.test")])],
    )
    tb = testbed_factory(world)
    with SocksProxy("127.0.0.2") as proxy:
        url = proxy.url
        routes = tmp_path / "egress.yaml"
        routes.write_text(
            "egresses:\n"
            "  - {name: direct, url: direct, helo_name: one.verimail.test}\n"
            f"  - {{name: clean, url: '{url}', helo_name: two.verimail.test}}\n"
            "default: {direct: 1000, clean: 1}\n"
        )
        ranked = Routes.from_file(read_egress_file(routes)).ranked(("mx.picky.test",), "picky.test")
        assert [e.name for e in ranked] == ["direct", "clean"]
        engine = Engine(testbed_settings(tb, tmp_path, smtp_egress_file=routes))
        batch = await engine.verify_many(["alice@picky.test", "nobody@picky.test"])
        assert [r.status for r in batch.results] == [Status.VALID, Status.INVALID], batch.results
        address = tb.address_of("mx.picky.test")
        assert await engine.prober.cooldown.cooling("direct", address)
        assert await engine.prober.cooldown.cooling("clean", address) is None


async def test_the_finder_stops_on_a_refusal_of_our_ip_and_cools_the_egress_down(engine):
    """A finder lookup whose first candidate meets the blocklist ends there (not found, the
    reason says why), and the next lookup on that server dials nothing while it cools down."""
    from verimail.engine import find_email

    first = await find_email(engine, "Alice", "Smith", "listed-rcpt.test", max_probes=5)
    assert not first.found and "refused our sending IP" in first.reason
    sessions = engine.testbed.host_stats("mx.listed-rcpt.test").sessions
    again = await find_email(engine, "Bob", "Jones", "listed-rcpt.test", max_probes=5)
    assert not again.found
    assert engine.testbed.host_stats("mx.listed-rcpt.test").sessions == sessions
