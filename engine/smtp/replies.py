"""Reply codes → outcome: how one SMTP reply to ``RCPT TO`` is read.

The table, first matching row wins:

| reply | outcome | why |
|---|---|---|
| 2xx | accepted | the server will take mail for the mailbox |
| 550 5.4.1 "Recipient address rejected: Access denied" | no_mailbox | Microsoft 365: no such box |
| 4xx/5xx naming a blocklist or our IP ("blocked using", Spamhaus, …) | egress_blocked | our IP |
| 5xx with 5.7.x, 5.1.7/5.1.8, sender or block-list text (no 5.1.x) | blocked | refused *us* |
| 552, or 5.2.2 (452 4.2.2 too) | mailbox_full | exists, but mail would bounce now (risky) |
| 550/551/553 with 5.1.x, or unknown-user text | no_mailbox | the mailbox does not exist |
| 550 with 5.2.1 | no_mailbox | the mailbox is disabled: mail to it bounces for good |
| 550/551/553/554, unknown-user text | no_mailbox | the text says so |
| other 5xx | rejected_other | a refusal we cannot read |
| 452 (not 4.2.2) | (too many recipients: the prober opens a new session, never a verdict) |
| 4xx (not 421) saying greylisting ("greylist", "try later", 4.7.1, 4.2.0) | greylisted |
| 421, other 4xx | temp_failure (never called greylisted) |
| anything else | protocol_error |

Both 4xx outcomes are retried later in the run, then end as unknown; a 421 also ends the
session (the prober asks the rest elsewhere).
"""

from __future__ import annotations

import re

from verimail.schemas.outcomes import SmtpOutcome

# At the start of the text only (RFC 2034 §4): "550 Client [5.1.22.33] rejected" holds an
# IP address, not a code.
_ENHANCED = re.compile(r"\s*([245])\.(\d{1,3})\.(\d{1,3})\b")
# Refusals of our MAIL FROM address that Postfix (smtpd_delay_reject) gives at RCPT TO:
# "550 5.1.8 <verify@…>: Sender address rejected: Domain not found". About us, not the box.
_SENDER_TEXT = re.compile(
    r"sender (address )?(rejected|refused|denied|unknown|verify failed)|"
    r"sender domain|sender verification|\bsender .{0,60}\b(not|un)(known|verified|allowed)",
    re.IGNORECASE,
)
_BLOCK_TEXT = re.compile(
    r"block|blacklist|black list|denylist|spamhaus|spamcop|\bspam\b|\brbl\b|\bdnsbl\b|"
    r"reputation|policy|not permitted|access denied|client host|poor reputation|"
    r"relay access denied|relaying denied|rejected due to",
    re.IGNORECASE,
)
# A refusal of our sending IP rather than of anything we said: a DNSBL hit (Postfix's
# reject_rbl_client, postscreen, Exim's dnslists), a client-host check, a reputation block.
# The list ("blocked using", "listed at", "Spamhaus", "Client host rejected") and
# the lists and wordings large providers use. Read before the policy block above: such a
# reply is about the egress, and another egress may get an answer (docs/egress.md).
_EGRESS_TEXT = re.compile(
    r"blocked using|\blisted (at|in|on|by)\b|spamhaus|spamcop|barracuda|\bsorbs\b|"
    r"\bdnsbl\b|\brbl\b|blacklist|black list|blocklist|block list|"
    r"client host (\[[^\]]*\] )?(rejected|blocked|refused)|"
    r"(your|client|sending|sender|source) ip( address)?\b.{0,60}"
    r"(block|list|reputation|refus|reject|ban|unsolicited)|"
    r"unsolicited mail originating from your ip|"
    r"(banned|blocked|blacklisted|listed) (sending |client |source )?ip\b",
    re.IGNORECASE,
)
_UNKNOWN_USER_TEXT = re.compile(
    r"unknown user|user unknown|no such user|no such (mailbox|recipient|address)|"
    r"mailbox (unavailable|not found|does not exist)|does not exist|"
    r"invalid recipient|"
    r"unrouteable|undeliverable address|not a valid mailbox|user not found|"
    r"no mailbox|account (is )?(disabled|closed|inactive)|recipient unknown|"
    r"(doesn't|does not) have an? (\S+ ){0,3}account|account .{0,40}\bis disabled",
    re.IGNORECASE,
)
# Postfix's prefix for any refusal of a recipient, whatever the reason that follows it
# ("Recipient address rejected: User unknown" / ": Access denied"): a mailbox that does not
# exist only when nothing in the text says the refusal is about us.
_REJECTED_TEXT = re.compile(r"recipient (address )?rejected|address rejected", re.IGNORECASE)
# Exchange Online refuses a recipient its tenant has no object for (directory-based edge
# blocking) with "550 5.4.1 Recipient address rejected: Access denied. AS(201806281)". Read
# as "blocked", every unknown address there was unknown and, the catch-all probe unclear,
# every real one only likely valid. ("5.4.1 Relay access denied" is about the domain.)
_NO_SUCH_RECIPIENT_365 = re.compile(r"recipient address rejected: access denied", re.I)
_GREYLIST_TEXT = re.compile(r"grey ?list|gray ?list|try (again )?later|4\.7\.1|4\.2\.0", re.I)


def enhanced_code(message: str) -> tuple[int, int, int] | None:
    """The RFC 3463 enhanced status code in a reply text, e.g. ``(5, 1, 1)``."""
    match = _ENHANCED.match(message)
    if not match:
        return None
    return int(match.group(1)), int(match.group(2)), int(match.group(3))


def refuses_egress(code: int, message: str) -> bool:
    """A 4xx/5xx that refuses our sending IP (a blocklist, the client host) rather than a
    mailbox: the verdict is ``unknown``/``egress_blocked``, and the egress is cooled down
    for that server (:mod:`~verimail.engine.smtp.egress_cooldown`)."""
    return 400 <= code < 600 and bool(_EGRESS_TEXT.search(message))


def classify_rcpt(code: int, message: str) -> SmtpOutcome:
    """Read one reply to ``RCPT TO`` (or ``MAIL FROM``) as an outcome (table above).

    452 and 421 are returned as ``TEMP_FAILURE``; the prober checks those codes itself
    before calling this, because they mean "new session" rather than a verdict.
    """
    enhanced = enhanced_code(message)
    if 200 <= code < 300:
        return SmtpOutcome.ACCEPTED
    if 500 <= code < 600:
        if code == 550 and enhanced == (5, 4, 1) and _NO_SUCH_RECIPIENT_365.search(message):
            return SmtpOutcome.NO_MAILBOX
        if refuses_egress(code, message) and not _UNKNOWN_USER_TEXT.search(message):
            return SmtpOutcome.EGRESS_BLOCKED
        if (
            (enhanced and enhanced[0] == 5 and enhanced[1] == 7)
            or (enhanced and enhanced[1:] in ((1, 7), (1, 8)))  # bad sender mailbox/system
            or _SENDER_TEXT.search(message)
            or (
                _BLOCK_TEXT.search(message)
                and not _UNKNOWN_USER_TEXT.search(message)
                and not (enhanced and enhanced[1] == 1)  # (5.1.x: the code says mailbox)
            )
        ):
            return SmtpOutcome.BLOCKED
        if code == 552 or enhanced == (5, 2, 2):
            return SmtpOutcome.MAILBOX_FULL
        if code in (550, 551, 553) and enhanced and enhanced[1] == 1:
            return SmtpOutcome.NO_MAILBOX
        if code == 550 and enhanced == (5, 2, 1):  # mailbox disabled: mail bounces for good
            return SmtpOutcome.NO_MAILBOX
        if code in (550, 551, 553, 554) and (
            _UNKNOWN_USER_TEXT.search(message) or _REJECTED_TEXT.search(message)
        ):
            return SmtpOutcome.NO_MAILBOX
        return SmtpOutcome.REJECTED_OTHER
    if 400 <= code < 500:
        if enhanced == (4, 2, 2):  # over quota for now (Gmail: 452 4.2.2)
            return SmtpOutcome.MAILBOX_FULL
        if refuses_egress(code, message):  # a temporary block of our IP is still our IP
            return SmtpOutcome.EGRESS_BLOCKED
        # Only a reply that says so is greylisting: a 421 "closing" or a 451 "local
        # problem" is another temporary failure (retried all the same). Calling them
        # greylisted told a user their list waited on greylisting when a server was down.
        if code != 421 and _GREYLIST_TEXT.search(message):
            return SmtpOutcome.GREYLISTED
        return SmtpOutcome.TEMP_FAILURE
    return SmtpOutcome.PROTOCOL_ERROR


def one_line(code: int, message: str, limit: int = 300) -> str:
    """A reply as one readable line (multi-line replies joined, control bytes dropped)."""
    text = " ".join(part.strip() for part in message.splitlines() if part.strip())
    text = "".join(ch for ch in text if ch.isprintable())
    line = f"{code} {text}".strip()
    return line if len(line) <= limit else line[: limit - 1] + "…"


# "try again in 5 minutes", "retry in 300 seconds", "please wait 60 s": a server's own hint.
_RETRY_IN = re.compile(
    r"(?:retry|try again|wait|come back)\D{0,20}?(\d{1,6})\s*(s\b|sec|seconds?|m\b|min|minutes?)",
    re.IGNORECASE,
)


def retry_after_hint(reply: str | None, default: int) -> int:
    """Seconds after which a greylisted recipient is worth asking again: the server's own
    figure when its reply names one, else ``default`` (postgrey waits 300 s by default)."""
    found = _RETRY_IN.search(reply or "")
    if found is None:
        return default
    seconds = int(found.group(1)) * (60 if found.group(2).lower().startswith("m") else 1)
    return max(1, seconds)
