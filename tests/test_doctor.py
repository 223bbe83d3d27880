"""``verimail doctor`` (issue 34, point 3) in a subprocess against the testbed: the probe
domain's MX on loopback greets (exit 0), or nothing listens on its port 25 / it never greets
(exit 1, and the one sentence saying outbound port 25 is blocked)."""

from __future__ import annotations

import json
import socket

import pytest
from api_helpers import clean_env, env_for_testbed
from cli_helpers import folded, run_verimail

from verimail.testbed.world import DomainSpec, HostBehaviour, HostSpec, World

BLOCKED = (
    "outbound port 25 is blocked from this machine: set VERIMAIL_SMTP_PROXY=socks5://… "
    "(docs/egress.md)."
)
HELO = "mail.verimail.test"


def _world() -> World:
    hosts = {
        "greets": HostBehaviour(),
        "nothing": HostBehaviour(refuse_connections=True),
        "silent": HostBehaviour(hostile="silent"),
        "listed": HostBehaviour(blocklisted_clients=["127.0.0.0/8"], blocklist_stage="greeting"),
    }
    return World.of(
        [HostSpec(f"mx.{name}.test", behaviour) for name, behaviour in hosts.items()],
        [DomainSpec(f"{name}.test", mx=[(10, f"mx.{name}.test")]) for name in hosts]
        + [DomainSpec(HELO, a=["192.0.2.25"])],
    )


@pytest.fixture
def env(testbed_factory):
    tb = testbed_factory(_world())
    return clean_env(
        {
            **env_for_testbed(tb),
            "VERIMAIL_SMTP_HELO_NAME": HELO,
        }
    )


def test_doctor_passes_when_the_probe_domains_mx_greets(env):
    done = run_verimail(["doctor"], {**env, "VERIMAIL_DOCTOR_DOMAIN": "greets.test"})
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert [line.split()[0] for line in lines] == ["ok", "ok", "ok"]
    assert "smtp egress direct" in lines[2] and "mx.greets.test" in lines[2]


@pytest.mark.parametrize("domain", ["nothing.test", "silent.test"])
def test_doctor_says_port_25_is_blocked_and_exits_1(env, domain):
    """Nothing listens on the MX's port 25, or it takes the connection and never greets
    (a firewall that drops, a tarpit): exit 1, and the sentence on what to do."""
    # (1 s: the silent server's greeting never comes, so its wait is certain to end; the
    # servers that do answer keep the suite's timeouts, for a busy machine)
    short = {"VERIMAIL_SMTP_CONNECT_TIMEOUT": "1"}
    done = run_verimail(["doctor"], {**env, **short, "VERIMAIL_DOCTOR_DOMAIN": domain})
    assert done.returncode == 1, done.stdout + done.stderr
    smtp = [line for line in done.stdout.splitlines() if "smtp egress direct" in line]
    assert len(smtp) == 1 and smtp[0].startswith("fail")
    assert BLOCKED in folded(done.stdout)
    assert [line.split()[0] for line in done.stdout.splitlines()[:2]] == ["ok", "ok"]


def test_doctor_names_a_refusal_of_our_ip_and_a_helo_name_that_does_not_resolve(env):
    """A 554 blocklist banner is no blocked port 25: the advice is about the listing. A HELO
    name without an address fails its own line (the SMTP check decides the exit code)."""
    done = run_verimail(
        ["doctor", "--json"],
        {**env, "VERIMAIL_DOCTOR_DOMAIN": "listed.test", "VERIMAIL_SMTP_HELO_NAME": "no.test"},
    )
    assert done.returncode == 1, done.stdout + done.stderr
    report = json.loads(done.stdout)
    by_name = {check["name"]: check for check in report["checks"]}
    assert report["ok"] is False and by_name["dns"]["ok"] is True
    assert by_name["helo"]["ok"] is False and "VERIMAIL_SMTP_HELO_NAME" in by_name["helo"]["advice"]
    smtp = by_name["smtp egress direct"]
    assert smtp["ok"] is False and "blocked using zen.spamhaus.org" in smtp["detail"]
    assert "delist" in smtp["advice"]


TOKEN = "metrics-token-for-the-doctor-test-0123456789"


async def test_health_shows_smtp_egress_without_waiting_and_metrics_export_it(
    testbed_factory, testbed_settings, tmp_path
):
    """The app checks the egress in the background: the first health answer comes while
    the probe domain's server (which never greets) still holds the check, so `smtp_egress`
    is not known yet; once the round ends, health and /metrics say port 25 failed."""
    from api_helpers import poll_until, running_app
    from prometheus_client.parser import text_string_to_metric_families

    tb = testbed_factory(_world())
    settings = testbed_settings(
        tb,
        tmp_path,
        doctor_domain="silent.test",
        doctor_interval=600,
        # the first health answer must come before the silent server's wait ends: 8 s
        # leave room for a busy machine (issue 48)
        smtp_connect_timeout=8,
        metrics_token=TOKEN,
    )
    async with running_app(settings) as api:
        first = await api.client.get("/api/health")
        assert first.status_code == 200
        assert first.json()["smtp_egress"] == {"ok": None, "checked_at": None, "egresses": []}

        body = await poll_until(
            api.client, "/api/health", {}, lambda b: b["smtp_egress"]["ok"] is not None
        )
        (egress,) = body["smtp_egress"]["egresses"]
        assert body["status"] == "healthy" and body["smtp_egress"]["ok"] is False
        assert egress["name"] == "direct" and egress["ok"] is False
        assert egress["advice"] == BLOCKED
        scrape = await api.client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    values = {
        sample.labels.get("egress"): sample.value
        for family in text_string_to_metric_families(scrape.text)
        for sample in family.samples
        if sample.name == "verimail_smtp_egress_ok"
    }
    assert values == {"direct": 0.0}


async def test_health_says_ok_once_port_25_greets_through_the_egress(
    testbed_factory, testbed_settings, tmp_path
):
    from api_helpers import poll_until, running_app

    tb = testbed_factory(_world())
    settings = testbed_settings(tb, tmp_path, doctor_domain="greets.test", doctor_interval=600)
    async with running_app(settings) as api:
        body = await poll_until(
            api.client, "/api/health", {}, lambda b: b["smtp_egress"]["ok"] is not None
        )
    assert body["smtp_egress"]["ok"] is True
    assert body["smtp_egress"]["egresses"][0]["advice"] is None


def test_doctor_checks_port_25_through_the_proxy(env):
    """With VERIMAIL_SMTP_PROXY the SMTP line is the proxy egress's, through a real SOCKS5
    proxy (pproxy): it passes where the server greets through it."""
    from bench.socks_proxy import SocksProxy

    with SocksProxy("127.0.0.2") as proxy:
        url = proxy.url
        done = run_verimail(
            ["doctor"],
            {**env, "VERIMAIL_DOCTOR_DOMAIN": "greets.test", "VERIMAIL_SMTP_PROXY": url},
        )
    assert done.returncode == 0, done.stdout + done.stderr
    (line,) = [line for line in done.stdout.splitlines() if "smtp egress" in line]
    assert line.startswith("ok") and "smtp egress proxy" in line and url in line


def test_a_proxy_that_does_not_answer_fails_with_its_own_sentence_and_no_password(env):
    """Nothing listens where the proxy should be: exit 1, the advice is about the proxy (not
    port 25), and the password of its URL is never printed."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.2", 0))
        port = probe.getsockname()[1]
    url = f"socks5://verifier:pw-Secret-42@127.0.0.2:{port}"
    done = run_verimail(
        ["doctor"], {**env, "VERIMAIL_DOCTOR_DOMAIN": "greets.test", "VERIMAIL_SMTP_PROXY": url}
    )
    assert done.returncode == 1, done.stdout + done.stderr
    text = folded(done.stdout + done.stderr)
    assert "fix or replace the SOCKS5 proxy of egress proxy" in text
    assert "pw-Secret-42" not in text and "port 25 is blocked" not in text


async def test_health_never_shows_a_proxys_password(testbed_factory, testbed_settings, tmp_path):
    """The health's smtp_egress names the proxy egress and what failed, with the password of
    its URL masked."""
    from api_helpers import poll_until, running_app

    with socket.socket() as probe:
        probe.bind(("127.0.0.2", 0))
        port = probe.getsockname()[1]
    tb = testbed_factory(_world())
    settings = testbed_settings(
        tb,
        tmp_path,
        doctor_domain="greets.test",
        doctor_interval=600,
        smtp_proxy=f"socks5://verifier:pw-Secret-42@127.0.0.2:{port}",
    )
    async with running_app(settings) as api:
        body = await poll_until(
            api.client, "/api/health", {}, lambda b: b["smtp_egress"]["ok"] is not None
        )
        raw = (await api.client.get("/api/health")).text
    (egress,) = body["smtp_egress"]["egresses"]
    assert egress["name"] == "proxy" and egress["ok"] is False
    assert "SOCKS5 proxy" in egress["advice"] and "pw-Secret-42" not in raw


def test_doctor_on_the_demo_world_checks_that_world_and_passes(testbed_factory):
    """Issue 44.7: pointed at the testbed (its `export` line only), the doctor failed on
    gmail.com and on the default HELO name until VERIMAIL_DOCTOR_DOMAIN was set. It now
    says it talks to the testbed and probes the demo world's acme.test."""
    from verimail.testbed.cli import DEFAULT_WORLD
    from verimail.testbed.world import load_world

    tb = testbed_factory(load_world(DEFAULT_WORLD))
    done = run_verimail(["doctor"], clean_env(env_for_testbed(tb)))
    assert done.returncode == 0, done.stdout + done.stderr
    said = folded(done.stdout)
    assert "the DNS is the testbed's, on loopback: probing acme.test" in said, said
    lines = done.stdout.splitlines()[1:]
    assert [line.split()[0] for line in lines] == ["ok", "ok", "ok"], lines
    assert "mx1.acme.test" in lines[2]


def test_the_default_helo_name_fails_with_the_exact_setting_to_make(env):
    """The default HELO name resolves nowhere: the advice names the value to set (this
    machine's name when it resolves; here, the testbed's DNS knows no such name, what a
    name needs and an example)."""
    env = {k: v for k, v in env.items() if k != "VERIMAIL_SMTP_HELO_NAME"}
    done = run_verimail(["doctor", "--json"], {**env, "VERIMAIL_DOCTOR_DOMAIN": "greets.test"})
    assert done.returncode == 0, done.stdout + done.stderr  # (the SMTP check passed)
    helo = {c["name"]: c for c in json.loads(done.stdout)["checks"]}["helo"]
    assert helo["ok"] is False and "verimail.localhost" in helo["detail"]
    name = socket.getfqdn()
    assert f"this machine's own name ({name}) does not resolve either" in helo["advice"]
    assert "VERIMAIL_SMTP_HELO_NAME=mail.example.com" in helo["advice"]
