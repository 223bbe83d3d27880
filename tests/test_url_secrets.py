"""A password in a URL is never shown, whatever characters it holds (issue 47, point 1): a
password typed as is with ``#``, ``/``, ``?``, ``@``, ``:`` or ``%`` in the proxy, the egress
file, the database or Redis URL. Swept through what a person reads: ``verimail serve``'s
log, ``/api/health``, ``/metrics``, ``verimail doctor`` and the errors of bad settings."""

from __future__ import annotations

import socket
from pathlib import Path

import httpx
import pytest
from api_helpers import env_for_testbed, poll_until, serve_processes
from cli_helpers import folded, run_verimail
from sqlalchemy.engine import make_url

from verimail.config import Settings, proxy_parts
from verimail.testbed.world import DomainSpec, HostBehaviour, HostSpec, World
from verimail.url_secrets import UNREADABLE, redact

RESERVED = "#/?@:%"
PASSWORDS = [f"Leak{c}{i}x-{c}pw" for i, c in enumerate(RESERVED)]
"""One password per reserved character (twice in each, so a cut at the first is caught)."""
TOKEN = "metrics-token-for-the-url-secrets-test-0123"


def _dead_port() -> int:
    """A port on 127.0.0.2 nothing listens on: a proxy that is down."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.2", 0))
        return int(probe.getsockname()[1])


@pytest.mark.parametrize("password", PASSWORDS)
@pytest.mark.parametrize(
    "template",
    [
        "socks5://verifier:{}@127.0.0.1:1080",
        "postgresql://verimail:{}@db.example.com:5432/verimail",
        "redis://:{}@127.0.0.1:6379/0",
    ],
)
def test_redaction_hides_the_whole_password_and_keeps_the_host(template, password):
    shown = redact(template.format(password))
    assert shown == template.format("***")


def test_a_url_that_cannot_be_read_is_not_echoed():
    with pytest.raises(ValueError, match="write socks5://") as refused:
        proxy_parts("verifier:Leak#1@127.0.0.1:1080")
    assert "Leak" not in str(refused.value) and UNREADABLE in str(refused.value)


@pytest.mark.parametrize("password", PASSWORDS)
def test_the_proxy_and_the_stores_log_in_with_the_password_as_typed(tmp_path, password):
    assert proxy_parts(f"socks5://verifier:{password}@127.0.0.1:1080") == (
        "127.0.0.1",
        1080,
        "verifier",
        _decoded(password),
    )
    settings = Settings(
        data_dir=tmp_path,
        database_url=f"postgresql://verimail:{password}@127.0.0.1:5432/test",
        redis_url=f"redis://:{password}@127.0.0.1:6379/0",
    )
    database = make_url(str(settings.database_url))
    assert (database.host, database.password) == ("127.0.0.1", _decoded(password))
    assert password not in redact(str(settings.database_url)) + redact(str(settings.redis_url))


def _decoded(password: str) -> str:
    """The password as the service logs in with it (``%`` before hex digits is an escape)."""
    from urllib.parse import unquote

    return unquote(password)


def _world() -> World:
    return World.of(
        [HostSpec("mx.greets.test", HostBehaviour())],
        [DomainSpec("greets.test", mx=[(10, "mx.greets.test")])],
    )


def _egress_file(tmp_path: Path, scheme: str, port: int) -> Path:
    """An egress per password, each a proxy at ``port`` (down)."""
    lines = ["egresses:"]
    for i, password in enumerate(PASSWORDS):
        url = f"{scheme}://verifier:{password}@127.0.0.2:{port}".replace("'", "''")
        lines.append(f"  - {{name: p{i}, url: '{url}', helo_name: mail.verimail.test}}")
    path = tmp_path / f"egresses-{scheme}.yaml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


async def test_no_password_in_serves_log_health_metrics_doctor_or_errors(testbed_factory, tmp_path):
    """A `verimail serve` whose egresses are six proxies (down), one per reserved character:
    health and /metrics name each egress and its failure with the password masked, and
    neither they, the server's log, `verimail doctor` nor the refusal of a bad egress file
    or database URL hold any of the passwords."""
    tb = testbed_factory(_world())
    port = _dead_port()
    env = {
        **env_for_testbed(tb),
        "VERIMAIL_DATA_DIR": str(tmp_path / "data"),
        "VERIMAIL_DOCTOR_DOMAIN": "greets.test",
        "VERIMAIL_DOCTOR_INTERVAL": "600",
        "VERIMAIL_METRICS_TOKEN": TOKEN,
        "VERIMAIL_SMTP_HELO_NAME": "mail.verimail.test",
        "VERIMAIL_SMTP_EGRESS_FILE": str(_egress_file(tmp_path, "socks5", port)),
    }
    seen: list[str] = []
    with serve_processes(1, env, tmp_path) as (server,):
        async with httpx.AsyncClient(base_url=server.base_url, timeout=10) as client:
            await poll_until(
                client, "/api/health", {}, lambda b: b["smtp_egress"]["ok"] is not None
            )
            body = await client.get("/api/health")
            metrics = await client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
        seen += [body.text, metrics.text]
    seen.append(server.log())
    egresses = body.json()["smtp_egress"]["egresses"]
    assert [e["name"] for e in egresses] == [f"p{i}" for i in range(len(PASSWORDS))]
    assert all(f"verifier:***@127.0.0.2:{port}" in e["detail"] for e in egresses), egresses
    assert 'verimail_smtp_egress_ok{egress="p5"} 0.0' in metrics.text

    doctor = run_verimail(["doctor"], {**env, "VERIMAIL_DOCTOR_INTERVAL": "0"})
    assert doctor.returncode == 1, doctor.stdout + doctor.stderr
    assert "verifier:***@" in folded(doctor.stdout)
    seen += [doctor.stdout, doctor.stderr]

    # The issue's own case: a "#" in VERIMAIL_SMTP_PROXY.
    proxy = run_verimail(
        ["doctor"],
        {
            **{k: v for k, v in env.items() if k != "VERIMAIL_SMTP_EGRESS_FILE"},
            "VERIMAIL_SMTP_PROXY": f"socks5://u:{PASSWORDS[0]}@127.0.0.2:{port}",
        },
    )
    assert proxy.returncode == 1 and "u:***@127.0.0.2" in folded(proxy.stdout)
    seen += [proxy.stdout, proxy.stderr]

    bad_file = {**env, "VERIMAIL_SMTP_EGRESS_FILE": str(_egress_file(tmp_path, "http", port))}
    refused = run_verimail(["doctor"], bad_file)
    assert refused.returncode == 2 and "write socks5://" in folded(refused.stderr)
    seen += [refused.stdout, refused.stderr]

    for password in PASSWORDS:  # (an unreachable database: its refusal names the URL)
        url = f"postgresql://verimail:{password}@127.0.0.1:1/verimail"
        db = run_verimail(["accounts", "list"], {**env, "VERIMAIL_DATABASE_URL": url})
        assert db.returncode == 1 and "verimail:***@127.0.0.1:1" in folded(db.stderr)
        seen += [db.stdout, db.stderr]

    everything = "\n".join(seen)
    leaked = [p for p in PASSWORDS if p in everything or p.split("x-")[1] in everything]
    assert not leaked, leaked
