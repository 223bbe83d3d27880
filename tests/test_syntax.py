"""Address syntax: a table of valid and invalid addresses, and the normalisation rules."""

from __future__ import annotations

import pytest

from verimail.engine.syntax import ParsedAddress, SyntaxProblem, parse_address

LONG_LABEL = "a" * 63

# (input, normalised email, ASCII domain)
VALID: list[tuple[str, str, str]] = [
    ("john@example.com", "john@example.com", "example.com"),
    ("john.doe@example.com", "john.doe@example.com", "example.com"),
    ("John.Doe@Example.COM", "John.Doe@example.com", "example.com"),
    ("JOHN@EXAMPLE.COM", "JOHN@example.com", "example.com"),
    ("a@b.co", "a@b.co", "b.co"),
    ("x@example.io", "x@example.io", "example.io"),
    ("first_last@example.org", "first_last@example.org", "example.org"),
    ("first-last@example.net", "first-last@example.net", "example.net"),
    ("user+tag@example.com", "user+tag@example.com", "example.com"),
    ("user+tag+more@example.com", "user+tag+more@example.com", "example.com"),
    ("user.name+tag@sub.example.co.uk", "user.name+tag@sub.example.co.uk", "sub.example.co.uk"),
    ("123456@example.com", "123456@example.com", "example.com"),
    ("1@example.com", "1@example.com", "example.com"),
    ("_@example.com", "_@example.com", "example.com"),
    ("a-b-c@my-domain.com", "a-b-c@my-domain.com", "my-domain.com"),
    ("o'brien@example.ie", "o'brien@example.ie", "example.ie"),
    ("!#$%&'*+/=?^_`{|}~-@example.com", "!#$%&'*+/=?^_`{|}~-@example.com", "example.com"),
    ("a.b.c.d@example.com", "a.b.c.d@example.com", "example.com"),
    ("info@example.museum", "info@example.museum", "example.museum"),
    ("user@example.technology", "user@example.technology", "example.technology"),
    ("user@mail.sub.example.com", "user@mail.sub.example.com", "mail.sub.example.com"),
    ("user@123.example.com", "user@123.example.com", "123.example.com"),
    ("user@example.c0m", "user@example.c0m", "example.c0m"),
    ("user@xn--bcher-kva.de", "user@xn--bcher-kva.de", "xn--bcher-kva.de"),
    ("user@acme.test", "user@acme.test", "acme.test"),
    ("Postmaster@Example.com", "Postmaster@example.com", "example.com"),
    ("  padded@example.com  ", "padded@example.com", "example.com"),
    ("trailing@example.com\n", "trailing@example.com", "example.com"),
    ("crlf@example.com\r\n", "crlf@example.com", "example.com"),
    ("\ttabbed@example.com\t", "tabbed@example.com", "example.com"),
    ("\u00a0nbsp@example.com\u00a0", "nbsp@example.com", "example.com"),
    # quoted local parts (RFC 5321 quoted-string), kept exactly as typed
    ('"john doe"@example.com', '"john doe"@example.com', "example.com"),
    ('"john..doe"@example.com', '"john..doe"@example.com', "example.com"),
    ('".john"@example.com', '".john"@example.com', "example.com"),
    ('"john."@example.com', '"john."@example.com', "example.com"),
    ('"a@b"@example.com', '"a@b"@example.com', "example.com"),
    ('"a\\"b"@example.com', '"a\\"b"@example.com', "example.com"),
    ('"plain"@example.com', '"plain"@example.com', "example.com"),
    ('"(comment)"@example.com', '"(comment)"@example.com', "example.com"),
    # internationalised local parts (SMTPUTF8) and IDN domains (IDNA 2008)
    ("josé@bücher.de", "josé@xn--bcher-kva.de", "xn--bcher-kva.de"),
    ("user@BÜCHER.de", "user@xn--bcher-kva.de", "xn--bcher-kva.de"),
    ("用户@例子.广告", "用户@xn--fsqu00a.xn--4rr70v", "xn--fsqu00a.xn--4rr70v"),
    ("Pelé@example.com", "Pelé@example.com", "example.com"),
    (
        "δοκιμή@παράδειγμα.δοκιμή",
        "δοκιμή@xn--hxajbheg2az3al.xn--jxalpdlp",
        "xn--hxajbheg2az3al.xn--jxalpdlp",
    ),
    (
        "медведь@с-балалайкой.рф",
        "медведь@xn----8sbaac5cahfb0b0a.xn--p1ai",
        "xn----8sbaac5cahfb0b0a.xn--p1ai",
    ),
    ("संपर्क@डाटामेल.भारत", "संपर्क@xn--c2bd4bq1db8d.xn--h2brj9c", "xn--c2bd4bq1db8d.xn--h2brj9c"),
    ("user@münchen.de", "user@xn--mnchen-3ya.de", "xn--mnchen-3ya.de"),
    ("user@faß.de", "user@xn--fa-hia.de", "xn--fa-hia.de"),
    ("ñandú@example.es", "ñandú@example.es", "example.es"),
    ("user@ｅｘａｍｐｌｅ.com", "user@example.com", "example.com"),
    # length limits, right at the edge
    ("a" * 64 + "@example.com", "a" * 64 + "@example.com", "example.com"),
    ("é" * 32 + "@example.com", "é" * 32 + "@example.com", "example.com"),
    (f"user@{LONG_LABEL}.com", f"user@{LONG_LABEL}.com", f"{LONG_LABEL}.com"),
    (
        "a" * 64 + "@" + f"{LONG_LABEL}.{LONG_LABEL}.{'b' * 57}.com",
        "a" * 64 + "@" + f"{LONG_LABEL}.{LONG_LABEL}.{'b' * 57}.com",
        f"{LONG_LABEL}.{LONG_LABEL}.{'b' * 57}.com",
    ),
]

# (input, a fragment of the reason)
INVALID: list[tuple[str | None, str]] = [
    ("", "empty"),
    ("   ", "empty"),
    ("\n", "empty"),
    (None, "empty"),
    ("None", "empty"),
    ("null", "empty"),
    ("nan", "empty"),
    ("N/A", "empty"),
    ("johnexample.com", "no @"),
    ("john", "no @"),
    ("john.doe.example.com", "no @"),
    ("john@@example.com", "more than one @"),
    ("john@doe@example.com", "more than one @"),
    ("a@b@c@example.com", "more than one @"),
    ("john@example.com@", "more than one @"),
    ("@example.com", "nothing before"),
    ("@", "nothing before"),
    ("john@", "nothing after"),
    ("john doe@example.com", "space"),
    ("john@exa mple.com", "space"),
    ("john @example.com", "space"),
    ("John Doe <john@example.com>", "space"),
    ("<john@example.com>", "angle brackets"),
    ("john\n@example.com", "control character"),
    ("jo\nhn@example.com", "control character"),
    ("john@example.com\nbcc:x@evil.com", "control character"),
    ("john\r@example.com", "control character"),
    ("jo\thn@example.com", "control character"),
    ("jo\x00hn@example.com", "control character"),
    ("jo\x1bhn@example.com", "control character"),
    ("john..doe@example.com", "two dots"),
    ("john@example..com", "two dots"),
    (".john@example.com", "start with a dot"),
    ("john.@example.com", "end with a dot"),
    ("john@.example.com", "start with a dot"),
    ("john@example.com.", "end with a dot"),
    ("a" * 65 + "@example.com", "longer than 64 characters"),
    ("é" * 33 + "@example.com", "longer than 64 bytes"),
    ("用" * 22 + "@example.com", "longer than 64 bytes"),
    ("a" * 64 + "@" + f"{LONG_LABEL}.{LONG_LABEL}.{'b' * 58}.com", "longer than 254"),
    (
        "a@" + f"{LONG_LABEL}.{LONG_LABEL}.{LONG_LABEL}.{'e' * 57}.com",
        "longer than 254",
    ),
    (f"user@{'a' * 64}.com", "longer than 63"),
    ("john@[192.168.0.1]", "IP address"),
    ("john@[IPv6:2001:db8::1]", "IP address"),
    ("john@192.168.0.1", "IP address"),
    ("john@127.0.0.1", "IP address"),
    ("john@::1", "IP address"),
    ("john@localhost", "no dot"),
    ("john@example", "no dot"),
    ("john@com", "no dot"),
    ("john@test", "no dot"),
    ("john@intranet", "no dot"),
    ("john@mail.localhost", "reserved name"),
    ("john@printer.local", "reserved name"),
    ("john@example.invalid", "reserved name"),
    ("john@example.onion", "reserved name"),
    ("john@1.0.0.127.in-addr.arpa", "reserved name"),
    ("john@example.123", "top-level domain"),
    ("john@exam_ple.com", "not allowed"),
    ("john@-example.com", "hyphen"),
    ("john@example-.com", "hyphen"),
    ("john@exa!mple.com", "not allowed"),
    ("jo(hn)@example.com", "not allowed"),
    ("jo,hn@example.com", "not allowed"),
    ("jo;hn@example.com", "not allowed"),
    ("jo[hn]@example.com", "not allowed"),
    ("jo\\hn@example.com", "not allowed"),
    ('jo"hn@example.com', "quotation mark"),
    ('"john@example.com', "quotation mark"),
    ('"john"doe@example.com', "quotation mark"),
    ("jo\u200bhn@example.com", "unsafe"),
    ("john@ab--cd.com", "two dashes"),
]


def test_table_is_large_enough() -> None:
    assert len(VALID) + len(INVALID) >= 100


@pytest.mark.parametrize(("raw", "email", "domain"), VALID)
def test_valid(raw: str, email: str, domain: str) -> None:
    result = parse_address(raw)
    assert isinstance(result, ParsedAddress), result
    assert result.email == email
    assert result.domain == domain
    assert result.original == raw
    assert result.domain.isascii()
    assert result.domain == result.domain.lower()
    assert result.email == f"{result.local}@{result.domain}"


@pytest.mark.parametrize(("raw", "fragment"), INVALID)
def test_invalid(raw: str | None, fragment: str) -> None:
    result = parse_address(raw)  # type: ignore[arg-type]
    assert isinstance(result, SyntaxProblem), result
    assert fragment.lower() in result.reason.lower()
    assert result.reason.endswith(".")
    assert result.reason[0].isupper()
    assert "\n" not in result.reason


def test_local_part_kept_as_typed_domain_lowered() -> None:
    result = parse_address("  Jane.DOE+News@Mail.Example.ORG ")
    assert isinstance(result, ParsedAddress)
    assert result.local == "Jane.DOE+News"
    assert result.domain == "mail.example.org"
    assert result.unicode_domain == "mail.example.org"
    assert result.email == "Jane.DOE+News@mail.example.org"
    assert result.original == "  Jane.DOE+News@Mail.Example.ORG "


def test_idn_domain_both_forms() -> None:
    result = parse_address("josé@Bücher.de")
    assert isinstance(result, ParsedAddress)
    assert result.local == "josé"
    assert result.domain == "xn--bcher-kva.de"
    assert result.unicode_domain == "bücher.de"
    assert result.smtputf8


def test_punycode_input_gives_unicode_form() -> None:
    result = parse_address("a@xn--fsqu00a.xn--4rr70v")
    assert isinstance(result, ParsedAddress)
    assert result.unicode_domain == "例子.广告"
    assert not result.smtputf8


def test_quoted_local_part_kept_with_quotes() -> None:
    result = parse_address('"john doe"@Example.com')
    assert isinstance(result, ParsedAddress)
    assert result.local == '"john doe"'
    assert result.email == '"john doe"@example.com'


def test_role_name_case_kept() -> None:
    # email-validator lower-cases RFC 2142 names; we keep what was typed.
    result = parse_address("POSTMASTER@example.com")
    assert isinstance(result, ParsedAddress)
    assert result.local == "POSTMASTER"


def test_never_uses_dns(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("syntax checks must not touch the network")

    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    assert isinstance(parse_address("user@no-such-domain-anywhere.example"), ParsedAddress)
    assert isinstance(parse_address("user@nonexistent"), SyntaxProblem)
