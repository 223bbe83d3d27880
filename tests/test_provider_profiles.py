"""The large providers' profiles of the testbed (``data/worlds/providers.yaml``, issue 46),
verified end to end: through the engine, the ``verimail verify`` command in a subprocess,
and the API, each with the statuses docs/statuses.md lists for them.

A Gmail-like server (452 4.5.3 past three recipients a transaction, 450 4.2.1 rate replies,
a 421 4.7.0 server throttling our IP), a Microsoft 365 tenant (5.4.1 for unknown
recipients), a Microsoft server refusing the direct egress with its own text (so the second
route, a SOCKS5 proxy on 127.0.0.2, is tried and answers), a Yahoo-like server with its own
texts, and a gateway that accepts every recipient.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from api_helpers import clean_env, env_for_testbed, running_app
from cli_helpers import run_verimail

import verimail
from bench.socks_proxy import SocksProxy
from verimail.config import read_egress_file
from verimail.engine import Engine
from verimail.engine.smtp.egress import Routes
from verimail.testbed.server import Testbed
from verimail.testbed.world import load_world

PROVIDERS = Path(verimail.__file__).parent / "data" / "worlds" / "providers.yaml"
GMAIL = "gmail-smtp-in.l.google.test"
PICKY = "picky-test.mail.protection.outlook.test"

EXPECTED: dict[str, tuple[str, str]] = {
    "alice@gmail.test": ("valid", "ok"),
    "bob@gmail.test": ("valid", "ok"),
    "carol@gmail.test": ("valid", "ok"),
    "dave@gmail.test": ("valid", "ok"),
    "erin@gmail.test": ("valid", "ok"),
    "nobody@gmail.test": ("invalid", "mailbox_not_found"),
    "disabled@gmail.test": ("invalid", "mailbox_not_found"),
    "full@gmail.test": ("risky", "mailbox_full"),
    "busy@gmail.test": ("unknown", "temp_failure"),
    "alice@gmail-throttled.test": ("unknown", "egress_blocked"),
    "alice@m365.test": ("valid", "ok"),
    "nobody@m365.test": ("invalid", "mailbox_not_found"),
    "alice@yahoo.test": ("valid", "ok"),
    "nobody@yahoo.test": ("invalid", "mailbox_not_found"),
    "disabled@yahoo.test": ("invalid", "mailbox_not_found"),
    "gone@yahoo.test": ("invalid", "mailbox_not_found"),
    "full@yahoo.test": ("risky", "mailbox_full"),
    "john.smith@gateway.test": ("likely_valid", "catch_all"),
    "xq7zk2@gateway.test": ("catchall", "catch_all"),
}
"""What each profile's replies become (docs/statuses.md, "What the providers' replies
become"), with a second egress route for ``picky365.test``."""

THROUGH_SECOND_ROUTE = {
    "alice@picky365.test": ("valid", "ok"),
    "nobody@picky365.test": ("invalid", "mailbox_not_found"),
}
DIRECT_ONLY = {
    "alice@picky365.test": ("unknown", "egress_blocked"),
    "nobody@picky365.test": ("unknown", "egress_blocked"),
}
# What the reason says in plain words, by sub-status (not only the code).
PLAIN_WORDS = {
    "mailbox_not_found": "does not exist or is disabled",
    "mailbox_full": "over its storage quota",
    "temp_failure": "busy, rate-limiting",
    "egress_blocked": "refused our sending IP address",
}


@pytest.fixture
def tb(testbed_factory) -> Testbed:  # type: ignore[no-untyped-def]
    return testbed_factory(load_world(PROVIDERS))


@pytest.fixture
def proxy() -> Iterator[SocksProxy]:
    """A SOCKS5 proxy (pproxy) leaving from 127.0.0.2, which the picky server does not list."""
    with SocksProxy("127.0.0.2") as running:
        yield running


def _routes(tmp_path: Path, proxy: SocksProxy) -> Path:
    """Direct first for every domain, the proxy second: the picky server refuses direct."""
    path = tmp_path / "egress.yaml"
    path.write_text(
        "egresses:\n"
        "  - {name: direct, url: direct, helo_name: one.verimail.test}\n"
        f"  - {{name: clean, url: '{proxy.url}', helo_name: two.verimail.test}}\n"
        "default: {direct: 1000, clean: 1}\n"
    )
    ranked = Routes.from_file(read_egress_file(path)).ranked((PICKY,), "picky365.test")
    assert [e.name for e in ranked] == ["direct", "clean"]
    return path


def _check(got: dict[str, tuple[str, str, str]], expected: dict[str, tuple[str, str]]) -> None:
    """Every address has its expected (status, sub_status), and its reason the plain words."""
    assert {email: got[email][:2] for email in expected} == expected
    for email, (_status, sub_status, reason) in got.items():
        words = PLAIN_WORDS.get(sub_status)
        assert words is None or words in reason, (email, reason)


async def test_each_profile_through_the_engine_with_a_second_route(
    tb, testbed_settings, tmp_path, proxy
):
    """The engine reads each provider's replies as the provider means them; Gmail's 452
    4.5.3 splits the run into sessions of three recipients; the Microsoft server refusing
    the direct egress answers through the proxy, and direct cools down there."""
    settings = testbed_settings(tb, tmp_path, smtp_egress_file=_routes(tmp_path, proxy))
    engine = Engine(settings)
    emails = [*EXPECTED, *THROUGH_SECOND_ROUTE]
    batch = await engine.verify_many(emails)
    got = {r.email: (r.status.value, r.sub_status.value, r.reason) for r in batch.results}
    _check(got, {**EXPECTED, **THROUGH_SECOND_ROUTE})
    assert "Your message has too many recipients" not in str(got)
    gmail = tb.host_stats(GMAIL)
    assert gmail.sessions >= 3  # (nine recipients, the probe, at most three a session)
    assert await engine.prober.cooldown.cooling("direct", tb.address_of(PICKY))
    assert await engine.prober.cooldown.cooling("clean", tb.address_of(PICKY)) is None
    throttled = got["alice@gmail-throttled.test"]
    assert "unusual rate of unsolicited mail" in throttled[2]


def test_each_profile_through_the_cli(tb, tmp_path, proxy):
    """``verimail verify --json`` as a user runs it: the same statuses, with the second
    route from an egress file, and without one the picky server's refusal of our IP."""
    env = clean_env(
        {
            **env_for_testbed(tb),
            "VERIMAIL_DATA_DIR": str(tmp_path),
            "VERIMAIL_SMTP_GREYLIST_DELAY": "0.05",
        }
    )
    emails = [*EXPECTED, *THROUGH_SECOND_ROUTE]
    routed = {**env, "VERIMAIL_SMTP_EGRESS_FILE": str(_routes(tmp_path, proxy))}
    for run_env, expected in ((routed, THROUGH_SECOND_ROUTE), (env, DIRECT_ONLY)):
        out = run_verimail(["verify", *emails, "--json"], run_env, timeout=120)
        assert out.returncode == 0, out.stderr
        lines = [json.loads(line) for line in out.stdout.splitlines()]
        got = {r["email"]: (r["status"], r["sub_status"], r["reason"]) for r in lines}
        _check(got, {**EXPECTED, **expected})


async def test_each_profile_through_the_api(tb, testbed_settings, tmp_path, proxy):
    """``POST /api/verify/batch`` with the same world and routes: the same statuses, each
    reason in plain words, the provider's reply in ``smtp_response``."""
    settings = testbed_settings(tb, tmp_path, smtp_egress_file=_routes(tmp_path, proxy))
    emails = [*EXPECTED, *THROUGH_SECOND_ROUTE]
    async with running_app(settings) as app:
        customer = app.customer(credits=100)
        response = await app.client.post(
            "/api/verify/batch", json={"emails": emails}, headers=customer.headers
        )
    assert response.status_code == 200, response.text
    results = response.json()["results"]
    got = {r["email"]: (r["status"], r["sub_status"], r["reason"]) for r in results}
    _check(got, {**EXPECTED, **THROUGH_SECOND_ROUTE})
    replies = {r["email"]: r["smtp_response"] or "" for r in results}
    assert "This mailbox is disabled (554.30)" in replies["disabled@yahoo.test"]
    assert replies["gone@yahoo.test"].startswith("552 1 Requested mail action aborted")
    assert replies["nobody@m365.test"].startswith("550 5.4.1")
