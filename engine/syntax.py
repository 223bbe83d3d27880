"""Address syntax: parse and normalise one address without ever touching the network.

RFC 5321/5322 syntax and IDNA 2008 come from ``email-validator`` (with its DNS checks off:
the engine does DNS itself, once per domain). We add what a public verification service
needs on top: octet limits (local part ≤ 64, address ≤ 254) that ``email-validator`` only
enforces in strict mode, no IP-literal or single-label domains, trimming, refusal of
control characters, and reasons a person can read.

Normalisation: the local part is kept exactly as typed (mailbox names may be
case-sensitive, and quoting is the sender's business); the domain is lower-cased and
IDNA-encoded to ASCII, which is what DNS and ``RCPT TO`` without SMTPUTF8 need.

``.test`` domains (RFC 6761) are accepted so the loopback testbed works; the other
special-use names (``localhost``, ``.local``, ``.invalid``, ``.onion``, ``.arpa``) are not.
"""

from __future__ import annotations

import ipaddress
import re
import sys
import unicodedata
from dataclasses import dataclass

from email_validator import EmailNotValidError, validate_email

LOCAL_MAX_OCTETS = 64  # RFC 5321 §4.5.3.1.1
ADDRESS_MAX_OCTETS = 254  # RFC 5321 §4.5.3.1.3 path limit (256) minus the angle brackets

# Values spreadsheets and CSV exports put in an empty cell.
_EMPTY_LOOKING = {"", "none", "null", "nil", "nan", "n/a", "na", "-", "undefined"}


@dataclass(frozen=True, slots=True)
class ParsedAddress:
    """A syntactically valid address, split and normalised."""

    original: str  # exactly as given, before trimming
    email: str  # local part as typed + "@" + ASCII (IDNA) lower-case domain
    local: str  # as typed (quotes kept for quoted local parts)
    domain: str  # ASCII, lower-case (``xn--`` labels for IDNs)
    unicode_domain: str  # the same domain in Unicode, lower-case

    @property
    def smtputf8(self) -> bool:
        """True when the local part is non-ASCII, so ``RCPT TO`` needs SMTPUTF8."""
        return not self.local.isascii()


@dataclass(frozen=True, slots=True)
class SyntaxProblem:
    """Why an input is not a usable address, in words a person understands."""

    original: str
    reason: str


_NO_DOT = "The domain has no dot; a full domain name like example.com is needed."

# email-validator's messages (matched by fragment) rewritten in this service's voice.
# Anything not listed falls back to the library's own sentence with "@-sign" → "@".
_MESSAGES: tuple[tuple[str, str], ...] = (
    ("two periods in a row", "The address has two dots in a row."),
    ("cannot start with a period", "The part before the @ cannot start with a dot."),
    ("period immediately before the @-sign", "The part before the @ cannot end with a dot."),
    ("period immediately after the @-sign", "The domain after the @ cannot start with a dot."),
    ("cannot end with a period", "The domain cannot end with a dot."),
    ("should have a period", _NO_DOT),
    ("not within a valid top-level domain", "The domain does not end in a valid top-level domain."),
    (
        "special-use or reserved name",
        "The domain is a reserved name (such as localhost or .local) that cannot receive email.",
    ),
    ("must have an @-sign", "The address has no @ sign."),
    ("something before the @-sign", "There is nothing before the @ sign."),
    ("something after the @-sign", "There is nothing after the @ sign."),
    ("bracketed IP address", "The domain is an IP address; only domain names are accepted."),
    (
        "angle bracket",
        "The address contains angle brackets; give the bare address without a name.",
    ),
    (
        "display name",
        "The address contains a display name; give the bare address without a name.",
    ),
    (
        "periods cannot be separated by so many characters",
        "A part of the domain between dots is longer than 63 characters.",
    ),
    ("too long after the @-sign", "The domain is longer than 253 characters."),
    ("too long before the @-sign", "The part before the @ is longer than 64 characters."),
    ("email address is too long", "The address is longer than 254 characters."),
    ("after close quote", "The part before the @ has text after its closing quotation mark."),
)


# "... invalid characters ...: X, Y." → which side of the @, and the characters.
_BAD_CHARS = re.compile(r"invalid characters (before|after) the @-sign[^:]*: (.+?)\.?$")
_BAD_CHARS_DOMAIN = re.compile(r"after the @-sign contains invalid characters[^:]*: (.+?)\.?$")


def _friendly(message: str) -> str:
    """email-validator's message in this service's words."""
    match = _BAD_CHARS.search(message)
    if match:
        side = "part before the @" if match.group(1) == "before" else "domain"
        return f"The {side} contains characters that are not allowed: {match.group(2)}."
    match = _BAD_CHARS_DOMAIN.search(message)
    if match:
        return f"The domain contains characters that are not allowed: {match.group(1)}."
    for fragment, sentence in _MESSAGES:
        if fragment in message:
            return sentence
    text = message.replace("the @-sign", "the @").replace("@-sign", "@ sign").strip()
    if not text.endswith("."):
        text += "."
    return text


def _split(address: str) -> tuple[str, str] | None:
    """Split at the @ that ends the local part, honouring a quoted local part."""
    if address.startswith('"'):
        i, n = 1, len(address)
        while i < n:
            if address[i] == "\\":
                i += 2
                continue
            if address[i] == '"':
                break
            i += 1
        rest = address[i + 1 :]
        if i < n and rest.startswith("@"):
            return address[: i + 1], rest[1:]
        # unterminated quote or junk after it: fall through to the plain rule
    if "@" not in address:
        return None
    local, _, domain = address.rpartition("@")
    return local, domain


def _length_problem(local: str) -> str | None:
    size = len(local.encode("utf-8"))
    if size <= LOCAL_MAX_OCTETS:
        return None
    if local.isascii():
        return "The part before the @ is longer than 64 characters."
    return f"The part before the @ is longer than 64 bytes ({size} bytes in UTF-8)."


def parse_address(raw: str | None) -> ParsedAddress | SyntaxProblem:
    """Check and normalise one address; returns a ``SyntaxProblem`` rather than raising,
    because bulk jobs carry bad rows through to the results file."""
    original = raw if isinstance(raw, str) else ("" if raw is None else str(raw))
    text = original.strip()

    def problem(reason: str) -> SyntaxProblem:
        return SyntaxProblem(original=original, reason=reason)

    if text.lower() in _EMPTY_LOOKING:
        return problem("The address is empty.")
    if any(unicodedata.category(c) == "Cc" for c in text):
        return problem("The address contains a line break or another control character.")
    parts = _split(text)
    if parts is None:
        return problem("The address has no @ sign.")
    local, domain = parts
    quoted = local.startswith('"') and local.endswith('"') and len(local) >= 2
    if "@" in domain or (not quoted and "@" in local):
        return problem("The address has more than one @ sign.")
    if any(c.isspace() for c in domain) or (not quoted and any(c.isspace() for c in local)):
        return problem("The address contains a space.")
    if not local:
        return problem("There is nothing before the @ sign.")
    if '"' in local and not quoted:
        return problem(
            "The part before the @ has a quotation mark in the wrong place; "
            "quotes must surround the whole part."
        )
    if not domain:
        return problem("There is nothing after the @ sign.")
    if domain.startswith("[") or _is_ip(domain):
        return problem("The domain is an IP address; only domain names are accepted.")
    too_long = _length_problem(local)
    if too_long:
        return problem(too_long)

    try:
        checked = validate_email(
            text,
            check_deliverability=False,
            allow_quoted_local=True,
            allow_smtputf8=True,
            allow_domain_literal=False,
            allow_display_name=False,
            allow_empty_local=False,
            globally_deliverable=True,
            test_environment=True,  # lets *.test through; the testbed lives there
        )
    except EmailNotValidError as exc:
        return problem(_friendly(str(exc)))

    # One string per domain, shared by its addresses: a list's parses are held until its
    # SMTP work ends, and most of a list's addresses share a few domains.
    ascii_domain = sys.intern((checked.ascii_domain or "").lower())
    if "." not in ascii_domain:  # "test" alone slips through with test_environment
        return problem(_NO_DOT)
    email = f"{local}@{ascii_domain}"
    if len(email.encode("utf-8")) > ADDRESS_MAX_OCTETS:
        return problem("The address is longer than 254 characters.")
    return ParsedAddress(
        original=original,
        email=email,
        local=local,
        domain=ascii_domain,
        unicode_domain=sys.intern((checked.domain or ascii_domain).lower()),
    )


def _is_ip(domain: str) -> bool:
    try:
        ipaddress.ip_address(domain.rstrip("."))
    except ValueError:
        return False
    return True
