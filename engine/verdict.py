"""The verdict: turn the gathered facts about one address into status, score and reason.

A pure function of ``Facts`` (no I/O, no clock, no settings), so every row of the table
below is one unit test and the table can be read against the code. The rows are checked
top to bottom; the first that matches decides.

| # | Facts (first match wins) | status | sub_status | confidence_score |
|---|---|---|---|---|
| 1 | syntax problem | invalid | invalid_syntax | 1.00 |
| 1b | domain one edit from a major provider's (whatever else) | invalid | possible_typo | 0.80 |
| 2 | domain on the disposable list (whatever SMTP said) | disposable | disposable | 0.95 |
| 3 | DNS: NXDOMAIN | invalid | nxdomain | 0.99 |
| 4 | DNS: null MX (RFC 7505) | invalid | null_mx | 0.99 |
| 5 | DNS: no MX and no A/AAAA | invalid | no_mx | 0.95 |
| 6 | DNS: SERVFAIL / timeout | unknown | dns_error | 0.20 |
| 7 | DNS not looked up | unknown | not_checked | 0.10 |
| 8 | SMTP accepted, not catch-all | valid | ok (role_based for a role) | 0.97 (role 0.95) |
| 9 | SMTP accepted, catch-all, score ≥ 80 | likely_valid | catch_all | 0.25 + 0.65·s/100 |
| 10 | SMTP accepted, catch-all, score < 80 | catchall | catch_all | 0.25 + 0.65·s/100 |
| 11 | SMTP accepted, catch-all unknown | likely_valid | ok (role_based for a role) | 0.75 |
| 12 | SMTP: no such mailbox, or a disabled one | invalid | mailbox_not_found | 0.95 |
| 13 | SMTP: mailbox full (over quota) | risky | mailbox_full | 0.60 |
| 14 | SMTP: other permanent rejection | risky | rejected | 0.50 |
| 15 | SMTP: we were blocked (5.7.x, policy, sender, HELO, relaying) | unknown | blocked | 0.20 |
| 15b | SMTP: our sending IP refused (blocklist, no PTR) | unknown | egress_blocked | 0.20 |
| 16 | SMTP: still greylisted after retries | unknown | greylisted | 0.30 |
| 17 | SMTP: other temporary failure | unknown | temp_failure | 0.25 |
| 18 | SMTP: timeout | unknown | timeout | 0.20 |
| 19 | SMTP: no MX host would connect | unknown | connection_failed | 0.20 |
| 20 | SMTP: MX in a private network we may not reach | unknown | private_address | 0.10 |
| 21 | SMTP: server did not speak SMTP | unknown | protocol_error | 0.15 |
| 22 | SMTP not attempted | unknown | not_checked | 0.10 |

Notes:

* ``safe_to_send`` is true only for ``valid``.
* ``s`` is the catch-all score (0–100): rows 9 and 10 give 0.77–0.90 and 0.25–0.76.
* ``confidence_score`` is how much weight the evidence carries: near 1 when DNS or the
  mail server answered definitely, at most 0.30 when the result is ``unknown``.
* Role addresses that the server confirms stay ``valid`` (they exist and take mail); the
  ``role_based`` sub-status and ``is_role_based`` flag let callers filter them.
* Free providers never change the status.
* Row 1b — ``gmial.com`` is one edit from ``gmail.com``: mail to it does not reach the
  person who typed it, whatever its server says (typo domains are often parked, accept
  everything, or sit on throwaway lists), so it is ``invalid`` with the ``possible_typo``
  sub-status and a reason ending "did you mean gmail.com?" (``did_you_mean`` holds the
  corrected address). It comes before row 2: a typo is never a throwaway service.
* Row 11 — the server accepted the mailbox but the random-address probe gave no answer,
  so we cannot tell a real mailbox from a server that accepts everything: not ``valid``
  (which promises a low bounce risk) but ``likely_valid``.
* Row 14 — a permanent 5xx that is neither "no such user", "mailbox full" nor a block of
  us: sending now would bounce, so the address is not unknown-and-retryable, yet the
  server never said the mailbox is missing, so it is not ``invalid`` either: ``risky``.
* A catch-all flag does not change rows 12–22: a rejection outweighs the flag.
* ``catch_all_score`` (0–100) is set only in rows 9 and 10; see ``catch_all_score``.

The reason is a sentence naming the domain and what the provider meant in plain words
("refused our sending IP address …; every other route … was tried too"), not only the
code; for SMTP rejections and deferrals it then quotes the server's reply, collapsed to
one line and cut to 120 characters.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NamedTuple

from verimail.schemas.outcomes import (
    DIRECT_EGRESS,
    DomainOutcome,
    SmtpOutcome,
    Status,
    SubStatus,
)

LIKELY_VALID_THRESHOLD = 80  # catch-all score at or above which the address is likely valid
REPLY_MAX_CHARS = 120


@dataclass(frozen=True, slots=True, kw_only=True)
class Facts:
    """Everything the engine learned about one address; the verdict's only input."""

    syntax_reason: str | None = None  # None: the syntax is fine
    domain_outcome: DomainOutcome | None = None  # None: DNS not looked up (e.g. bad syntax)
    smtp_outcome: SmtpOutcome = SmtpOutcome.NOT_ATTEMPTED
    smtp_response: str | None = None  # last reply about this recipient, as received
    smtp_note: str | None = None  # our sentence on why no server was asked (egress_failed)
    is_catch_all: bool | None = None  # None: the catch-all probe was inconclusive
    is_disposable: bool = False
    is_role: bool = False
    is_free: bool = False
    typo_of: str | None = None  # the major provider's domain this one is likely a typo of
    local: str = ""
    domain: str = ""
    egress: str = DIRECT_EGRESS  # the egress SMTP went through (named when it was refused)


@dataclass(frozen=True, slots=True)
class Verdict:
    """The decision about one address."""

    status: Status
    sub_status: SubStatus
    safe_to_send: bool
    confidence_score: float
    reason: str
    catch_all_score: int | None = None


class _Row(NamedTuple):
    status: Status
    sub_status: SubStatus
    confidence: float
    reason: str  # str.format template: {domain}, {local}
    quote_reply: bool = False  # append the server's reply to the reason


_DNS_ROWS: dict[DomainOutcome, _Row] = {
    DomainOutcome.NXDOMAIN: _Row(
        Status.INVALID, SubStatus.NXDOMAIN, 0.99, "The domain {domain} does not exist."
    ),
    DomainOutcome.NULL_MX: _Row(
        Status.INVALID,
        SubStatus.NULL_MX,
        0.99,
        "The domain {domain} declares that it accepts no email (null MX record).",
    ),
    DomainOutcome.NO_MAIL_HOST: _Row(
        Status.INVALID,
        SubStatus.NO_MX,
        0.95,
        "The domain {domain} has no mail server: no MX record with an address, and no "
        "address of its own to deliver to.",
    ),
    DomainOutcome.DNS_ERROR: _Row(
        Status.UNKNOWN,
        SubStatus.DNS_ERROR,
        0.20,
        "The DNS lookup for {domain} failed, so its mail servers are unknown; try again later.",
    ),
}

_NOT_LOOKED_UP = _Row(
    Status.UNKNOWN,
    SubStatus.NOT_CHECKED,
    0.10,
    "The domain {domain} was not looked up, so the address was not verified.",
)

_SMTP_ROWS: dict[SmtpOutcome, _Row] = {
    SmtpOutcome.NO_MAILBOX: _Row(
        Status.INVALID,
        SubStatus.MAILBOX_NOT_FOUND,
        0.95,
        "The mail server for {domain} says this mailbox does not exist or is disabled; "
        "mail to it bounces for good.",
        True,
    ),
    SmtpOutcome.MAILBOX_FULL: _Row(
        Status.RISKY,
        SubStatus.MAILBOX_FULL,
        0.60,
        "The mailbox exists but is full (over its storage quota) on the mail server for "
        "{domain}; mail to it bounces until it is emptied.",
        True,
    ),
    SmtpOutcome.REJECTED_OTHER: _Row(
        Status.RISKY,
        SubStatus.REJECTED,
        0.50,
        "The mail server for {domain} permanently refused this address without saying "
        "the mailbox does not exist.",
        True,
    ),
    SmtpOutcome.BLOCKED: _Row(
        Status.UNKNOWN,
        SubStatus.BLOCKED,
        0.20,
        "The mail server for {domain} refused our checker by a policy of its own (our "
        "sender address, our HELO name, relaying, or a rule about senders), so the mailbox "
        "could not be verified; it says nothing of the address.",
        True,
    ),
    SmtpOutcome.EGRESS_BLOCKED: _Row(
        Status.UNKNOWN,
        SubStatus.EGRESS_BLOCKED,
        0.20,
        "The mail server for {domain} refused our sending IP address, not this address "
        '(egress "{egress}": a blocklist, no reverse DNS name, or the provider\'s own '
        "reputation rules); every other route configured for that server was tried too, so "
        "the mailbox could not be verified.",
        True,
    ),
    SmtpOutcome.GREYLISTED: _Row(
        Status.UNKNOWN,
        SubStatus.GREYLISTED,
        0.30,
        "The mail server for {domain} asked us to try again later (greylisting: it defers "
        "a sender it has not seen before); a retry after `retry_after` seconds usually "
        "settles it.",
        True,
    ),
    SmtpOutcome.TEMP_FAILURE: _Row(
        Status.UNKNOWN,
        SubStatus.TEMP_FAILURE,
        0.25,
        "The mail server for {domain} put us off for now (busy, rate-limiting, or a "
        "temporary fault of its own); try again later.",
        True,
    ),
    SmtpOutcome.TIMEOUT: _Row(
        Status.UNKNOWN,
        SubStatus.TIMEOUT,
        0.20,
        "The mail server for {domain} did not answer in time.",
    ),
    SmtpOutcome.CONNECTION_FAILED: _Row(
        Status.UNKNOWN,
        SubStatus.CONNECTION_FAILED,
        0.20,
        "None of the mail servers for {domain} accepted a connection.",
    ),
    SmtpOutcome.PRIVATE_ADDRESS: _Row(
        Status.UNKNOWN,
        SubStatus.PRIVATE_ADDRESS,
        0.10,
        "The mail servers for {domain} point into a private or internal network, "
        "which we do not connect to.",
    ),
    SmtpOutcome.EGRESS_FAILED: _Row(
        Status.UNKNOWN,
        SubStatus.EGRESS_FAILED,
        0.10,
        "The mail server for {domain} was not asked, because our way out to it failed: {note}",
    ),
    SmtpOutcome.PROTOCOL_ERROR: _Row(
        Status.UNKNOWN,
        SubStatus.PROTOCOL_ERROR,
        0.15,
        "The mail server for {domain} did not answer in valid SMTP.",
        True,
    ),
    SmtpOutcome.NOT_ATTEMPTED: _Row(
        Status.UNKNOWN,
        SubStatus.NOT_CHECKED,
        0.10,
        "The domain {domain} accepts mail, but the mailbox was not checked with its mail server.",
    ),
}

_VALID = _Row(
    Status.VALID,
    SubStatus.OK,
    0.97,
    "The mail server for {domain} confirmed that this mailbox exists.",
)
_VALID_ROLE = _Row(
    Status.VALID,
    SubStatus.ROLE_BASED,
    0.95,
    "The mail server for {domain} confirmed that this mailbox exists; it is a role "
    "address, usually read by a team rather than one person.",
)
_ACCEPTED_UNSURE = _Row(
    Status.LIKELY_VALID,
    SubStatus.OK,
    0.75,
    "The mail server for {domain} accepted this mailbox, but we could not tell whether "
    "it accepts every address.",
)


def decide(facts: Facts) -> Verdict:
    """The verdict for one address; see the module docstring for the table."""
    if facts.syntax_reason is not None:
        reason = facts.syntax_reason.strip() or "The address is not a valid email address."
        return Verdict(Status.INVALID, SubStatus.INVALID_SYNTAX, False, 1.0, reason)
    if facts.typo_of:
        text = (
            f"The domain {{domain}} looks like a typo of {facts.typo_of}, so mail would not "
            f"reach the person who typed it: did you mean {facts.typo_of}?"
        )
        return _verdict(_Row(Status.INVALID, SubStatus.POSSIBLE_TYPO, 0.80, text), facts)
    if facts.is_disposable:
        return _verdict(
            _Row(
                Status.DISPOSABLE,
                SubStatus.DISPOSABLE,
                0.95,
                "The domain {domain} belongs to a disposable (throwaway) email service.",
            ),
            facts,
        )
    if facts.domain_outcome is None:
        return _verdict(_NOT_LOOKED_UP, facts)
    if facts.domain_outcome is not DomainOutcome.OK:
        return _verdict(_DNS_ROWS[facts.domain_outcome], facts)
    if facts.smtp_outcome is not SmtpOutcome.ACCEPTED:
        return _verdict(_SMTP_ROWS[facts.smtp_outcome], facts)
    if facts.is_catch_all is False:
        return _verdict(_VALID_ROLE if facts.is_role else _VALID, facts)
    if facts.is_catch_all is None:
        row = _ACCEPTED_UNSURE
        if facts.is_role:
            row = row._replace(sub_status=SubStatus.ROLE_BASED)
        return _verdict(row, facts)
    return _catch_all_verdict(facts)


def _catch_all_verdict(facts: Facts) -> Verdict:
    score = catch_all_score(facts.local, facts.is_role, facts.is_free)
    confidence = round(0.25 + 0.65 * score / 100, 2)
    if score >= LIKELY_VALID_THRESHOLD:
        status = Status.LIKELY_VALID
        text = (
            "The mail server for {domain} accepts mail for any address, so this mailbox "
            "cannot be confirmed, but the address looks like a real one "
            f"(catch-all score {score}/100)."
        )
    else:
        status = Status.CATCHALL
        text = (
            "The mail server for {domain} accepts mail for any address, so this mailbox "
            f"cannot be confirmed (catch-all score {score}/100)."
        )
    row = _Row(status, SubStatus.CATCH_ALL, confidence, text)
    return _verdict(row, facts, score)


def _verdict(row: _Row, facts: Facts, score: int | None = None) -> Verdict:
    reason = row.reason.format(
        domain=facts.domain or "this domain",
        local=facts.local,
        note=facts.smtp_note or "no reason was given.",
        egress=facts.egress,
    )
    if row.quote_reply:
        reply = one_line_reply(facts.smtp_response)
        if reply:
            reason += f' The server replied: "{reply}".'
    return Verdict(
        status=row.status,
        sub_status=row.sub_status,
        safe_to_send=row.status is Status.VALID,
        confidence_score=row.confidence,
        reason=reason,
        catch_all_score=score,
    )


_CONTINUATION = re.compile(r"^\d{3}[ -](?:[245]\.\d{1,3}\.\d{1,3}\s+)?")


def one_line_reply(reply: str | None, limit: int = REPLY_MAX_CHARS) -> str:
    """An SMTP reply fit for a sentence: one line, printable, at most ``limit`` chars.

    Continuation lines of a multi-line reply lose their repeated ``550-5.1.1`` prefix.
    """
    if not reply:
        return ""
    lines = [line.strip() for line in reply.splitlines() if line.strip()]
    if not lines:
        return ""
    parts = [lines[0]] + [_CONTINUATION.sub("", line) for line in lines[1:]]
    text = " ".join(" ".join(parts).split())
    text = "".join(c for c in text if c.isprintable()).replace('"', "'")
    if len(text) > limit:
        text = text[: limit - 1].rstrip() + "…"
    return text


# --- catch-all score ----------------------------------------------------------------

_SEPARATORS = re.compile(r"[._\-\s]")
_VOWELS = set("aeiouy")


def _wordlike(token: str) -> bool:
    """Could this token be (part of) a name? Initials (up to three letters) and
    pronounceable words (a vowel, no run of five consonants) can; a leading initial is
    allowed (``jsmith``). Non-Latin scripts get the benefit of the doubt."""
    if not token.isalpha():
        return False
    if len(token) <= 3 or not token.isascii():
        return True
    return _pronounceable(token) or _pronounceable(token[1:])


def _pronounceable(word: str) -> bool:
    run = longest = 0
    for c in word:
        run = 0 if c in _VOWELS else run + 1
        longest = max(longest, run)
    return longest <= 4 and any(c in _VOWELS for c in word)


def _shape_score(tokens: list[str]) -> int:
    """Score the letters: person-like patterns high, random strings low."""
    if not tokens:
        return 10
    if any(not t.isalpha() for t in tokens):
        return 20  # digits mixed into the name: generated ids, hashes
    if not all(_wordlike(t) for t in tokens):
        return 25
    lengths = [len(t) for t in tokens]
    if len(tokens) == 2:
        if min(lengths) >= 2:
            return 88  # first.last, first_last
        return 82  # j.smith, john.s
    if len(tokens) == 3:
        return 80  # first.middle.last, j.r.smith
    if len(tokens) > 3:
        return 55
    size = lengths[0]
    if size <= 3:
        return 60  # initials: js, jds
    if size <= 12:
        return 72  # first, flast, firstlast
    if size <= 20:
        return 60
    return 40


def catch_all_score(local: str, is_role: bool, is_free: bool = False) -> int:
    """0–100: how likely an address on a catch-all domain really is a mailbox.

    Role names score 90 (shared inboxes usually exist). Otherwise the shape of the local
    part decides: ``first.last`` 88, ``j.smith`` 82, ``first.middle.last`` 80, a single
    pronounceable name (``john``, ``jsmith``) 72, initials (``js``) 60, unpronounceable
    letters 25, letters and digits mixed 20. Then: 1–2 trailing digits −8, a year (19xx/20xx)
    −12, other digit runs −30; over 30 characters −15, over 40 −30; a free provider +5
    (they accept every recipient at RCPT yet host most plausible handles).
    ``>= 80`` means ``likely_valid``.
    """
    text = local.strip()
    if len(text) >= 2 and text.startswith('"') and text.endswith('"'):
        text = text[1:-1]
    text = text.casefold().split("+", 1)[0]
    if not text:
        return 0
    if is_role:
        return 90
    core = text.rstrip("0123456789")
    digits = text[len(core) :]
    score = _shape_score([t for t in _SEPARATORS.split(core) if t])
    if digits:
        if len(digits) <= 2:
            score -= 8
        elif len(digits) == 4 and digits[:2] in ("19", "20"):
            score -= 12
        else:
            score -= 30
    if len(text) > 40:
        score -= 30
    elif len(text) > 30:
        score -= 15
    if is_free:
        score += 5
    return max(0, min(100, score))
