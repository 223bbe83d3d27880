"""The ``Testbed`` life cycle: addresses, settings, side-by-side instances, world swaps, stop."""

from __future__ import annotations

import ipaddress
import json
import os
import selectors
import shlex
import smtplib
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import dns.message
import dns.query
import dns.rcode
import dns.resolver
import pytest
from api_helpers import PATIENCE

import verimail
from verimail.config import Settings
from verimail.testbed.cli import READY_LINE
from verimail.testbed.server import Testbed, default_ports
from verimail.testbed.world import (
    DomainSpec,
    HostBehaviour,
    HostSpec,
    World,
    generate_world,
    load_world,
)

MakeTestbed = Callable[..., Testbed]
DEMO = Path(verimail.__file__).parent / "data" / "worlds" / "demo.yaml"
SENDER = "probe@verimail.test"


def small_world(mailboxes: set[str] | None = None) -> World:
    return World.of(
        [HostSpec("mx.acme.test", HostBehaviour(mailboxes=mailboxes or {"alice"}))],
        [DomainSpec("acme.test", mx=[(10, "mx.acme.test")])],
    )


def mx_of(tb: Testbed, domain: str) -> list[str]:
    ip, port = tb.nameserver
    response = dns.query.udp(dns.message.make_query(domain, "MX"), ip, port=port, timeout=3)
    return [r.exchange.to_text().lower() for rrset in response.answer for r in rrset]


def rcpt_code(tb: Testbed, host: str, address: str) -> int:
    with smtplib.SMTP(tb.address_of(host), tb.smtp_port, timeout=5) as client:
        client.ehlo("probe")
        client.mail(SENDER)
        return client.rcpt(address)[0]


def test_sync_context_manager_addresses_and_settings(tmp_path: Path, testbed_settings) -> None:
    with Testbed(small_world()) as tb:
        ns_ip, ns_port = tb.nameserver
        address = ipaddress.ip_address(tb.address_of("mx.acme.test"))
        assert address in ipaddress.ip_network("127.0.0.0/8")
        assert ns_ip.endswith(".53") and ns_ip.rsplit(".", 1)[0] == str(address).rsplit(".", 1)[0]
        assert (tb.smtp_port, ns_port) == default_ports()
        assert tb.settings_overrides() == {
            "dns_nameservers": [f"{ns_ip}:{ns_port}"],
            "smtp_port": tb.smtp_port,
            "smtp_allow_networks": ["127.0.0.0/8"],
        }
        settings = testbed_settings(tb, tmp_path, smtp_rcpts_per_session=7)
        assert isinstance(settings, Settings)
        assert settings.nameserver_addresses() == [(ns_ip, ns_port)]
        assert settings.smtp_rcpts_per_session == 7 and settings.data_dir == tmp_path
        assert settings.smtp_allow_networks == [ipaddress.ip_network("127.0.0.0/8")]
        assert rcpt_code(tb, "mx.acme.test", "alice@acme.test") == 250
        with pytest.raises(KeyError):
            tb.address_of("nohost.test")


def test_two_testbeds_side_by_side(testbed_factory: MakeTestbed) -> None:
    one = testbed_factory(small_world({"alice"}))
    two = testbed_factory(small_world({"bob"}))
    assert one.nameserver != two.nameserver and one.smtp_port == two.smtp_port
    assert one.address_of("mx.acme.test") != two.address_of("mx.acme.test")
    assert rcpt_code(one, "mx.acme.test", "alice@acme.test") == 250
    assert rcpt_code(two, "mx.acme.test", "alice@acme.test") == 550
    assert mx_of(one, "acme.test") == mx_of(two, "acme.test") == ["mx.acme.test."]
    assert one.host_stats("mx.acme.test").sessions == 1
    assert two.dns_queries[("acme.test", "MX")] == 1


def test_explicit_and_ephemeral_ports(testbed_factory: MakeTestbed) -> None:
    tb = testbed_factory(small_world(), smtp_port=0, dns_port=0)
    assert tb.smtp_port > 0 and tb.nameserver[1] > 0
    assert rcpt_code(tb, "mx.acme.test", "alice@acme.test") == 250
    assert mx_of(tb, "acme.test") == ["mx.acme.test."]
    other = testbed_factory(small_world(), smtp_port=2626, dns_port=5454)
    assert other.smtp_port == 2626 and other.nameserver[1] == 5454
    assert rcpt_code(other, "mx.acme.test", "alice@acme.test") == 250


def test_replace_world_keeps_addresses_and_changes_behaviour(testbed_factory: MakeTestbed) -> None:
    tb = testbed_factory(small_world({"alice", "bob"}))
    address = tb.address_of("mx.acme.test")
    assert rcpt_code(tb, "mx.acme.test", "bob@acme.test") == 250

    changed = small_world({"alice"})
    changed.hosts["mx2.acme.test"] = HostSpec("mx2.acme.test", HostBehaviour(accept_all=True))
    changed.domains["new.test"] = DomainSpec("new.test", mx=[(5, "mx2.acme.test")])
    tb.replace_world(changed)
    assert tb.world is changed
    assert tb.address_of("mx.acme.test") == address
    assert rcpt_code(tb, "mx.acme.test", "bob@acme.test") == 550
    assert mx_of(tb, "new.test") == ["mx2.acme.test."]
    assert rcpt_code(tb, "mx2.acme.test", "anyone@new.test") == 250

    down = small_world()
    down.hosts["mx.acme.test"].behaviour.refuse_connections = True
    tb.replace_world(down)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((address, tb.smtp_port), timeout=3)
    tb.replace_world(small_world({"bob"}))
    assert tb.address_of("mx.acme.test") == address
    assert rcpt_code(tb, "mx.acme.test", "bob@acme.test") == 250
    # Hosts that left the world no longer resolve.
    ip, port = tb.nameserver
    gone = dns.query.udp(dns.message.make_query("mx2.acme.test", "A"), ip, port=port, timeout=3)
    assert gone.rcode() == dns.rcode.NXDOMAIN


def test_stop_closes_every_socket_and_joins_the_thread() -> None:
    world = small_world()
    world.hosts["slow.acme.test"] = HostSpec("slow.acme.test", HostBehaviour(reply_delay=300))
    tb = Testbed(world).start()
    ns_ip, ns_port = tb.nameserver
    smtp_address, slow_address = tb.address_of("mx.acme.test"), tb.address_of("slow.acme.test")
    # A session stuck behind a 300 s banner delay must not hold up the stop (nor wait out
    # the 30 s the stop gives the testbed's thread to end).
    stuck = socket.create_connection((slow_address, tb.smtp_port), timeout=5)
    assert tb.wait_until(lambda tb: tb.host_stats("slow.acme.test").active == 1)
    assert tb.wait_idle(timeout=0) is False
    started = time.perf_counter()
    tb.stop()
    assert time.perf_counter() - started < 25
    assert not [t for t in threading.enumerate() if t.name == "verimail-testbed" and t.is_alive()]
    assert stuck.recv(100) == b""  # closed without a reply
    stuck.close()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((smtp_address, tb.smtp_port), timeout=3)
    for address, port, kind in (
        (ns_ip, ns_port, socket.SOCK_DGRAM),
        (ns_ip, ns_port, socket.SOCK_STREAM),
        (smtp_address, tb.smtp_port, socket.SOCK_STREAM),
    ):
        with socket.socket(socket.AF_INET, kind) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((address, port))  # free again
    tb.stop()  # idempotent


def test_more_than_a_block_of_hosts_spills_into_the_next(testbed_factory: MakeTestbed) -> None:
    hosts = [HostSpec(f"mx{i}.big.test", HostBehaviour(mailboxes={"a"})) for i in range(260)]
    tb = testbed_factory(World.of(hosts))
    addresses = [tb.address_of(h.name) for h in hosts]
    assert len(set(addresses)) == 260
    assert tb.nameserver[0] not in addresses
    blocks = {a.rsplit(".", 1)[0] for a in addresses}
    assert len(blocks) == 2
    assert rcpt_code(tb, "mx259.big.test", "a@big.test") == 250


def test_demo_world_end_to_end(testbed_factory: MakeTestbed) -> None:
    tb = testbed_factory(load_world(DEMO))
    res = dns.resolver.Resolver(configure=False)
    res.nameservers, res.port = [tb.nameserver[0]], tb.nameserver[1]
    first, second = sorted(res.resolve("fallback.test", "MX"), key=lambda r: r.preference)
    first_ip = res.resolve(first.exchange, "A")[0].address
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((first_ip, tb.smtp_port), timeout=3)
    second_ip = res.resolve(second.exchange, "A")[0].address
    assert second_ip == tb.address_of("mx2.fallback.test")
    assert rcpt_code(tb, "mx2.fallback.test", "frank@fallback.test") == 250
    assert rcpt_code(tb, "mx1.acme.test", "info@acme.test") == 250
    assert rcpt_code(tb, "mx1.acme.test", "full.box@acme.test") == 552
    assert rcpt_code(tb, "mx.catchall.test", "zz9@catchall.test") == 250
    assert rcpt_code(tb, "mx.blocked.test", "eve@blocked.test") == 554
    assert rcpt_code(tb, "mx.greylist.test", "dora@greylist.test") == 450
    assert rcpt_code(tb, "mx.greylist.test", "dora@greylist.test") == 250
    implicit_ip = res.resolve("implicit.test", "A")[0].address
    with smtplib.SMTP(implicit_ip, tb.smtp_port, timeout=5) as client:
        assert client.ehlo("probe")[1].startswith(b"mail.implicit.test")
    assert tb.total_stats().data == 0


def test_generated_world_serves_the_expected_outcomes(testbed_factory: MakeTestbed) -> None:
    world, addresses = generate_world(60, 12, 4, seed=3)
    tb = testbed_factory(world)
    expected = {"valid": 250, "catchall": 250, "invalid": 550}
    checked = set()
    for item in addresses:
        if item.expected in checked and len(checked) == 3:
            break
        assert rcpt_code(tb, item.host, item.address) == expected[item.expected]
        checked.add(item.expected)
    assert checked == {"valid", "invalid", "catchall"}


def _read_until_ready(proc: subprocess.Popen[bytes], timeout: float) -> str:
    """Output of ``verimail testbed up`` up to its ready line (select on the raw fd, no sleeps).

    Raw ``os.read`` rather than ``readline``: a buffered reader may hold lines that ``select``
    no longer reports as readable.
    """
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    data = b""
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while b"testbed ready:" not in data or not data.endswith(b"\n"):
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not sel.select(remaining):
                raise AssertionError("testbed did not get ready:\n" + data.decode())
            chunk = os.read(fd, 65536)
            if not chunk:
                raise AssertionError("testbed exited:\n" + data.decode())
            data += chunk
    return data.decode()


def test_cli_up_prints_the_world_and_serves_it() -> None:
    exe = Path(sys.executable).with_name("verimail")
    env = {**os.environ, "COLUMNS": "200"}
    proc = subprocess.Popen(
        [str(exe), "testbed", "up", "--world", str(DEMO), "--smtp-port", "0", "--dns-port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
    )
    try:
        output = _read_until_ready(proc, timeout=PATIENCE)
        ready = next(line for line in output.splitlines() if line.startswith("testbed ready:"))
        fields = dict(part.split("=") for part in ready.removeprefix("testbed ready: ").split())
        assert READY_LINE.split(":")[0] in ready
        ns_ip, ns_port = fields["nameserver"].rsplit(":", 1)
        smtp_port = int(fields["smtp_port"])
        for name in ("mx1.acme.test", "mx.catchall.test", "nullmx.test", "greylist_tries=1"):
            assert name in output
        assert f"{ns_ip} port {ns_port}" in output

        res = dns.resolver.Resolver(configure=False)
        res.nameservers, res.port = [ns_ip], int(ns_port)
        mx = sorted(res.resolve("acme.test", "MX"), key=lambda r: r.preference)
        assert mx[0].exchange.to_text().lower() == "mx1.acme.test."
        mx_ip = res.resolve("mx1.acme.test", "A")[0].address
        assert mx_ip in output  # the printed table shows the address DNS serves
        with smtplib.SMTP(mx_ip, smtp_port, timeout=5) as client:
            client.ehlo("probe")
            client.mail(SENDER)
            assert client.rcpt("alice@acme.test")[0] == 250
        # The printed export line is all another shell needs: verify through it.
        export = next(line for line in output.splitlines() if line.startswith("export "))
        exported = dict(word.split("=", 1) for word in shlex.split(export)[1:])
        assert set(exported) >= {"VERIMAIL_DNS_NAMESERVERS", "VERIMAIL_SMTP_PORT"}
        shell = {k: v for k, v in os.environ.items() if not k.startswith("VERIMAIL_")}
        verify = subprocess.run(
            [str(exe), "verify", "--json", "alice@acme.test", "nobody@acme.test"],
            env={**shell, **exported},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert verify.returncode == 0, verify.stderr
        statuses = [json.loads(line)["status"] for line in verify.stdout.splitlines()]
        assert statuses == ["valid", "invalid"]
    finally:
        proc.terminate()
        rest, _ = proc.communicate(timeout=15)
    assert proc.returncode == 0, rest
    assert b"stopping testbed" in rest
