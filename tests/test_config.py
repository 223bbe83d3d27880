"""Settings: environment parsing, comma-separated lists, and the allow-list guard."""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from verimail.config import Settings, current_settings, using_settings

README = Path(__file__).resolve().parent.parent / "README.md"


def test_lists_from_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("VERIMAIL_DNS_NAMESERVERS", "127.0.1.53:5353, [::1]:53,10.0.0.1")
    monkeypatch.setenv("VERIMAIL_SMTP_ALLOW_NETWORKS", "127.0.0.0/8")
    monkeypatch.setenv("VERIMAIL_DATA_DIR", str(tmp_path))
    settings = Settings()
    assert settings.nameserver_addresses() == [
        ("127.0.1.53", 5353),
        ("::1", 53),
        ("10.0.0.1", 53),
    ]
    assert settings.smtp_allow_networks == [ipaddress.ip_network("127.0.0.0/8")]
    assert settings.database_url == f"sqlite:///{tmp_path / 'verimail.db'}"


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ("127.0.0.1:abc", "the port must be a number 1-65535"),
        ("127.0.0.1:99999", "the port must be a number 1-65535"),
        ("127.0.0.1:0", "the port must be a number 1-65535"),
        ("dns.example:53", "'dns.example' is not an IP address"),
        ("[::1]x", "write [address]:port"),
    ],
)
def test_a_nameserver_that_cannot_be_used_is_refused_when_read(tmp_path, entry, problem):
    """A bad port was a traceback at the first lookup (or a failed send per query, and every
    address "unknown"); a name is not a nameserver dnspython can use."""
    with pytest.raises(ValidationError, match=re.escape(problem)) as caught:
        Settings(data_dir=tmp_path, dns_nameservers=["127.0.0.2", entry])
    assert repr(entry) in str(caught.value)
    assert Settings(data_dir=tmp_path, dns_nameservers=["2001:db8::1"]).nameserver_addresses() == [
        ("2001:db8::1", 53)
    ]


@pytest.mark.parametrize("blanket", ["0.0.0.0/0", "::/0"])
def test_blanket_allow_is_refused(blanket):
    with pytest.raises(ValidationError, match="every address"):
        Settings(smtp_allow_networks=[blanket])


def test_using_settings_overrides_only_inside(tmp_path):
    special = Settings(data_dir=tmp_path, finder_charge=20)
    with using_settings(special):
        assert current_settings() is special
    assert current_settings() is not special


def test_every_setting_is_documented_in_the_readme():
    # (the README or the reference files under docs/ that it points to)
    docs = sorted((README.parent / "docs").glob("*.md"))
    text = "\n".join(p.read_text(encoding="utf-8") for p in [README, *docs])
    documented = set(re.findall(r"`(VERIMAIL_[A-Z_]+)`", text))
    missing = {f"VERIMAIL_{name.upper()}" for name in Settings.model_fields} - documented
    assert not missing, f"README settings table lacks {sorted(missing)}"
