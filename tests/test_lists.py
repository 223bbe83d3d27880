"""Reference lists: disposable, free, role, typo suggestions, and overrides via Settings."""

from __future__ import annotations

from pathlib import Path

import pytest
from disposable_email_domains import blocklist as disposable_blocklist

from verimail.config import Settings
from verimail.engine.lists import (
    DATA_DIR,
    FREE_PROVIDERS_FILE,
    POPULAR_DOMAINS_FILE,
    ROLE_NAMES_FILE,
    ReferenceLists,
    osa_distance,
)


@pytest.fixture(scope="module")
def lists() -> ReferenceLists:
    return ReferenceLists.from_settings(Settings(_env_file=None))


# --- data files ---------------------------------------------------------------------


@pytest.mark.parametrize("path", [FREE_PROVIDERS_FILE, ROLE_NAMES_FILE, POPULAR_DOMAINS_FILE])
def test_data_files_name_their_sources(path: Path) -> None:
    assert path.parent == DATA_DIR
    lines = path.read_text(encoding="utf-8").splitlines()
    assert lines[0].startswith("#")
    header = " ".join(line for line in lines if line.startswith("#")).lower()
    assert "source" in header


def test_role_list_size() -> None:
    names = [
        line
        for line in ROLE_NAMES_FILE.read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert len(names) >= 80


# --- caching ------------------------------------------------------------------------


def test_from_settings_is_cached_per_values() -> None:
    a = ReferenceLists.from_settings(Settings(_env_file=None, disposable_extra=["x.example"]))
    b = ReferenceLists.from_settings(Settings(_env_file=None, disposable_extra=["X.example"]))
    c = ReferenceLists.from_settings(Settings(_env_file=None))
    assert a is b
    assert a is not c


# --- disposable -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "domain",
    [
        "mailinator.com",
        "MAILINATOR.COM",
        "mailinator.com.",
        "yopmail.com",
        "guerrillamail.com",
        "10minutemail.com",
        "sub.mailinator.com",
        "a.b.c.mailinator.com",
    ],
)
def test_disposable(lists: ReferenceLists, domain: str) -> None:
    assert lists.is_disposable(domain)


@pytest.mark.parametrize(
    "domain",
    ["gmail.com", "example.com", "acme.test", "com", "acme-mailinator.test", "mailinator.com.evil"],
)
def test_not_disposable(lists: ReferenceLists, domain: str) -> None:
    assert not lists.is_disposable(domain)


def test_disposable_extra_and_allow() -> None:
    settings = Settings(
        _env_file=None,
        disposable_extra=["burner.test", "*.wild.test"],
        disposable_allow=["mailinator.com", "keep.yopmail.com"],
    )
    lists = ReferenceLists.from_settings(settings)
    assert lists.is_disposable("burner.test")
    assert lists.is_disposable("inbox.burner.test")
    assert lists.is_disposable("x.wild.test")
    assert not lists.is_disposable("mailinator.com")
    assert not lists.is_disposable("sub.mailinator.com")
    assert lists.is_disposable("yopmail.com")
    assert not lists.is_disposable("keep.yopmail.com")
    assert lists.is_disposable("other.yopmail.com")


def test_disposable_extra_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VERIMAIL_DISPOSABLE_EXTRA", "envburner.test, other-burner.test")
    monkeypatch.setenv("VERIMAIL_DISPOSABLE_ALLOW", "yopmail.com")
    lists = ReferenceLists.from_settings(Settings(_env_file=None))
    assert lists.is_disposable("envburner.test")
    assert lists.is_disposable("other-burner.test")
    assert not lists.is_disposable("yopmail.com")


# --- free providers -----------------------------------------------------------------


@pytest.mark.parametrize(
    "domain",
    [
        "gmail.com",
        "GMail.com",
        "googlemail.com",
        "yahoo.com",
        "yahoo.co.uk",
        "outlook.com",
        "hotmail.com",
        "live.com",
        "msn.com",
        "aol.com",
        "icloud.com",
        "me.com",
        "gmx.de",
        "web.de",
        "mail.ru",
        "yandex.ru",
        "proton.me",
        "protonmail.com",
        "zoho.com",
        "qq.com",
        "163.com",
    ],
)
def test_free(lists: ReferenceLists, domain: str) -> None:
    assert lists.is_free(domain)


@pytest.mark.parametrize("domain", ["acme.test", "example.com", "corp.gmail.com", "gmail.co"])
def test_not_free(lists: ReferenceLists, domain: str) -> None:
    assert not lists.is_free(domain)


def test_free_file_override(tmp_path: Path) -> None:
    path = tmp_path / "free.txt"
    path.write_text("# my list\nFreeMail.test\n\nother.test  # trailing comment\n", "utf-8")
    lists = ReferenceLists.from_settings(Settings(_env_file=None, free_providers_file=path))
    assert lists.is_free("freemail.test")
    assert lists.is_free("other.test")
    assert not lists.is_free("gmail.com")  # the file replaces the shipped list


# --- role names ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "local",
    [
        "info",
        "INFO",
        "Info",
        "sales",
        "support",
        "admin",
        "contact",
        "office",
        "billing",
        "noreply",
        "no-reply",
        "no_reply",
        "No.Reply",
        "postmaster",
        "abuse",
        "webmaster",
        "hr",
        "jobs",
        "careers",
        "marketing",
        "help",
        "team",
        "hello",
        "enquiries",
        "accounts",
        "press",
        "info+newsletter",
        "Sales+EU",
        "support2",
        "info.team",
        "sales-support",
        '"info"',
        # written together (the finder's firstlast pattern for "Sales Team"):
        "salesteam",
        "techsupport",
        "HRTeam",
        "itsupport2",
    ],
)
def test_role(lists: ReferenceLists, local: str) -> None:
    assert lists.is_role(local)


@pytest.mark.parametrize(
    "local",
    [
        "john",
        "john.smith",
        "jsmith",
        "john.sales",
        "information",
        "infos.x",
        "",
        "+info",
        "johnsales",  # a person and a role, written together
        "hiram",  # "hi" + a name
        "allison",
        "iris",
        "prit",  # "pr" + "it": short roles only
        "hiall",
    ],
)
def test_not_role(lists: ReferenceLists, local: str) -> None:
    assert not lists.is_role(local)


def test_role_file_override(tmp_path: Path) -> None:
    path = tmp_path / "roles.txt"
    path.write_text("# roles\nkontakt\nverkauf\n", "utf-8")
    lists = ReferenceLists.from_settings(Settings(_env_file=None, role_names_file=path))
    assert lists.is_role("Kontakt")
    assert lists.is_role("verkauf+de")
    assert not lists.is_role("info")


# --- did you mean ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("gmial.com", "gmail.com"),
        ("gmai.com", "gmail.com"),
        ("gamil.com", "gmail.com"),
        ("gnail.com", "gmail.com"),
        ("gmail.con", "gmail.com"),
        ("gmail.cmo", "gmail.com"),
        ("gmail.co", "gmail.com"),
        ("gmail.comm", "gmail.com"),
        ("GMIAL.COM", "gmail.com"),
        ("hotmial.com", "hotmail.com"),
        ("hotmai.com", "hotmail.com"),
        ("hotmial.con", "hotmail.com"),
        ("hotmail.co", "hotmail.com"),
        ("yaho.com", "yahoo.com"),
        ("yahooo.com", "yahoo.com"),
        ("yahoo.co", "yahoo.com"),
        ("outlok.com", "outlook.com"),
        ("iclod.com", "icloud.com"),
        ("aol.con", "aol.com"),
        ("protonmail.co", "protonmail.com"),
        ("john@gmial.com", "john@gmail.com"),
        ("John.Smith@hotmial.com", "John.Smith@hotmail.com"),
        ("  jane@yaho.com ", "jane@yahoo.com"),
    ],
)
def test_did_you_mean(lists: ReferenceLists, given: str, expected: str) -> None:
    assert lists.did_you_mean(given) == expected


@pytest.mark.parametrize("domain", ["gmial.com", "hotmial.com"])
def test_a_typo_domain_is_never_disposable(lists: ReferenceLists, domain: str) -> None:
    """The bundled disposable list holds these typo domains; they are typos, not services."""
    assert domain in disposable_blocklist  # (else this test proves nothing)
    assert lists.typo_of(domain) is not None
    assert not lists.is_disposable(domain)


@pytest.mark.parametrize(
    "given",
    [
        "gmail.com",
        "john@gmail.com",
        "yahoo.com",
        "hotmail.co.uk",
        "mail.com",  # a real provider one edit from gmail.com
        "email.com",
        "ymail.com",
        "gmx.de",
        "me.com",
        "mac.com",
        "yahoo.fr",
        "live.fr",
        "love.com",  # short names need an exact name match
        "ail.com",
        "acme.test",
        "example.com",
        "company.com",
        "john@acme.test",
        "",
        "john@",
    ],
)
def test_did_you_mean_non_cases(lists: ReferenceLists, given: str) -> None:
    assert lists.did_you_mean(given) is None


@pytest.mark.parametrize(
    ("a", "b", "distance"),
    [
        ("gmail.com", "gmail.com", 0),
        ("gmial.com", "gmail.com", 1),
        ("gmail.cmo", "gmail.com", 1),
        ("gmai.com", "gmail.com", 1),
        ("hotmial.con", "hotmail.com", 2),
        ("abc", "", 3),
        ("ca", "abc", 3),  # OSA, not unrestricted Damerau–Levenshtein
    ],
)
def test_osa_distance(a: str, b: str, distance: int) -> None:
    assert osa_distance(a, b) == distance
    assert osa_distance(b, a) == distance


def test_osa_distance_limit() -> None:
    assert osa_distance("gmail.com", "totally-different.org", 2) == 3
