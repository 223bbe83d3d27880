"""The facts the engine gathers, as small enums shared by the prober and the verdict.

Kept apart from the API models so the verdict table can be read against them.
"""

from __future__ import annotations

import re
from enum import StrEnum

DIRECT_EGRESS = "direct"
"""The egress name of SMTP sessions that go out from the machine's own address (no proxy)."""

_EGRESS_IN_REASON = re.compile(r'\(egress "([^"]+)"')


def egress_in_reason(reason: str | None) -> str | None:
    """The egress an ``egress_blocked`` result's reason names (``… (egress "direct": …``):
    the results files keep the reason, so a job counts its blocked results per egress from
    them, whichever pass, shard or process made them."""
    found = _EGRESS_IN_REASON.search(reason or "")
    return found.group(1) if found else None


class Status(StrEnum):
    """The overall verdict about an address."""

    VALID = "valid"
    INVALID = "invalid"
    DISPOSABLE = "disposable"
    CATCHALL = "catchall"
    UNKNOWN = "unknown"
    LIKELY_VALID = "likely_valid"
    RISKY = "risky"


class DomainOutcome(StrEnum):
    """What DNS said about the domain's mail routing."""

    OK = "ok"  # at least one MX (or implicit-MX) host with an address
    NXDOMAIN = "nxdomain"  # the domain does not exist
    NULL_MX = "null_mx"  # RFC 7505 "0 ." : accepts no mail
    NO_MAIL_HOST = "no_mail_host"  # no MX and no A/AAAA, or MX targets without addresses
    DNS_ERROR = "dns_error"  # SERVFAIL / timeout: unknown, never invalid


class SmtpOutcome(StrEnum):
    """What the mail host said (or did) about one recipient."""

    ACCEPTED = "accepted"  # 2xx to RCPT TO
    NO_MAILBOX = "no_mailbox"  # 550/551/553 with 5.1.x or unknown-user text
    MAILBOX_FULL = "mailbox_full"  # 552 / 5.2.2
    BLOCKED = "blocked"  # 5.7.x or policy text: we were refused, says nothing of the box
    EGRESS_BLOCKED = "egress_blocked"  # our sending IP refused (a blocklist, a 554 banner)
    REJECTED_OTHER = "rejected_other"  # another permanent 5xx we cannot read as "no mailbox"
    GREYLISTED = "greylisted"  # 4xx still after the retry budget
    TEMP_FAILURE = "temp_failure"  # other 4xx / 421 after retries
    TIMEOUT = "timeout"  # a connect or command timed out
    CONNECTION_FAILED = "connection_failed"  # refused / reset / dropped on every MX host
    PRIVATE_ADDRESS = "private_address"  # MX resolved into a network we may not connect to
    EGRESS_FAILED = "egress_failed"  # our SOCKS5 proxy failed: unreachable, auth, refused
    PROTOCOL_ERROR = "protocol_error"  # the server spoke something that is not SMTP
    NOT_ATTEMPTED = "not_attempted"  # SMTP not tried (syntax or DNS already decided)


class SubStatus(StrEnum):
    """A finer reason than ``status``; one per result."""

    OK = "ok"
    ROLE_BASED = "role_based"
    INVALID_SYNTAX = "invalid_syntax"
    NXDOMAIN = "nxdomain"
    NO_MX = "no_mx"
    NULL_MX = "null_mx"
    MAILBOX_NOT_FOUND = "mailbox_not_found"
    MAILBOX_FULL = "mailbox_full"
    DISPOSABLE = "disposable"
    POSSIBLE_TYPO = "possible_typo"  # the domain is one edit from a major provider's
    CATCH_ALL = "catch_all"
    GREYLISTED = "greylisted"
    BLOCKED = "blocked"
    EGRESS_BLOCKED = "egress_blocked"  # the server refused our sending IP, not the address
    TEMP_FAILURE = "temp_failure"
    TIMEOUT = "timeout"
    CONNECTION_FAILED = "connection_failed"
    PRIVATE_ADDRESS = "private_address"
    EGRESS_FAILED = "egress_failed"  # our way out (a SOCKS5 proxy) failed, not the server
    DNS_ERROR = "dns_error"
    REJECTED = "rejected"
    PROTOCOL_ERROR = "protocol_error"
    NOT_CHECKED = "not_checked"  # DNS or SMTP was not attempted, so nothing was verified
