"""Reply codes → outcome: how one SMTP reply to ``RCPT TO`` is read.

The rule where a reply's code and its text disagree: **read it by what a sender should do
next** (docs/smtp-prober.md, "Reading a reply"). A code says how long a refusal lasts; the
text says whose it is. So Gmail's ``550 5.2.1 … receiving mail at a rate …`` is a rate
limit (retry later), not a disabled mailbox; Yahoo's ``552 … mailbox not found`` is no such
mailbox, not a full one; Microsoft's ``451 4.7.500 Server busy. Please try again later`` is a
busy server, not greylisting. The corpus ``tests/data/smtp_replies.yaml`` (the providers'
published texts and the stock texts of the common MTAs) holds the table to that rule.

The table, first matching row wins (in brackets: what a sender does next):

| reply | outcome |
|---|---|
| 2xx | accepted [send] |
| 550 5.4.1 "Recipient address rejected: Access denied" (Microsoft 365) | no_mailbox [drop] |
| refusing our IP: a blocklist, no PTR, "from this IP", the IP's reputation | egress_blocked |
| | [another egress; leave that server alone a while] |
| a mailbox's rate limit ("receiving mail too quickly", "… at a rate"), any code | temp_failure |
| 5xx: 5.7.x, 5.1.7/5.1.8, sender, HELO, relaying, policy text (no 5.1.x) | blocked [fix us] |
| 5xx saying the mailbox does not exist or is disabled (a 552 too) | no_mailbox [drop] |
| 5xx over quota (5.2.2, the words, a 552 not about size) | mailbox_full [hold] |
| 550/551/553/554 with 5.1.x; 550 with 5.2.1 (disabled) | no_mailbox [drop] |
| 550/551/553/554 with Postfix's bare "Recipient address rejected" | no_mailbox [drop] |
| other 5xx | rejected_other [hold] |
| 452 4.5.3, "too many", a bare 452: :func:`asks_new_session` | (a new session) |
| 4xx over quota (4.2.2, or the words) | mailbox_full [hold] |
| 4xx (not 421) saying greylisting (Mimecast's "internal resource …" too) | greylisted |
| 4xx about our sender or HELO name | temp_failure [retry] |
| 4xx of a busy or broken server ("busy", "resources", "local problem") | temp_failure |
| 4xx (not 421) saying only "try (again) later", 4.7.1, 4.2.0 | greylisted [retry] |
| 421, other 4xx | temp_failure [retry] |
| anything else | protocol_error |

Both 4xx outcomes are retried later in the run, then end as unknown; a 421 also ends the
session (the prober asks the rest elsewhere).
"""

from __future__ import annotations

import re

from verimail.schemas.outcomes import SmtpOutcome

# At the start of the text only (RFC 2034 §4): "550 Client [5.1.22.33] rejected" holds an
# IP address, not a code.
_ENHANCED = re.compile(r"\s*#?([245])\.(\d{1,3})\.(\d{1,3})\b")
# qmail and Cisco put theirs at the end, after a hash: "… by that name. (#5.1.1)".
_TRAILING_ENHANCED = re.compile(r"\(#([245])\.(\d{1,3})\.(\d{1,3})\b[^()]*\)\s*\.?\s*$")
# Refusals of our MAIL FROM address that Postfix (smtpd_delay_reject) gives at RCPT TO:
# "550 5.1.8 <verify@…>: Sender address rejected: Domain not found". About us, not the box.
_SENDER_TEXT = re.compile(
    r"sender (address )?(rejected|refused|denied|unknown|verify failed)|"
    r"sender domain|sender verification|\bsender .{0,60}\b(not|un)(known|verified|allowed)|"
    r"envelope sender|sender is unauthenticated|unauthenticated (e-?mail|sender)",
    re.IGNORECASE,
)
# Refusals of our HELO name (Postfix's reject_non_fqdn_helo_hostname, "Helo command
# rejected") and of relaying (the server does not take mail for that domain): about us or
# the domain's routing, never the mailbox.
_HELO_OR_RELAY_TEXT = re.compile(
    r"\b(e?hlo|helo)\b.{0,40}\b(rejected|refused|invalid|denied)|"
    r"relay(ing)? (access )?(denied|not permitted|not allowed|prohibited)|unable to relay|"
    r"relay not permitted|we do not relay|allowed rcpthosts|administrative(ly)? "
    r"(prohibition|denied|prohibited)",
    re.IGNORECASE,
)
_BLOCK_TEXT = re.compile(
    r"block|blacklist|black list|denylist|spamhaus|spamcop|\bspam\b|\brbl\b|\bdnsbl\b|"
    r"reputation|policy|not permitted|access denied|client host|poor reputation|"
    r"relay access denied|relaying denied|rejected due to",
    re.IGNORECASE,
)
_IP = r"[\[(]?\d{1,3}(?:\.\d{1,3}){3}[\])]?"
# A refusal of our sending IP rather than of anything we said: a DNSBL hit (Postfix's
# reject_rbl_client, postscreen, Exim's dnslists), a client-host check, a reputation block,
# a missing PTR (Gmail's 5.7.25), a provider's own list (Microsoft's 5.7.606-649 and 5.7.708,
# Outlook.com's "messages from <ip> weren't sent", Yahoo's "Messages from <ip> temporarily
# deferred" and "Connections will not be accepted from <ip>", Proofpoint's ipcheck link,
# Cisco's "sending MTA's poor reputation"). Read before the policy block above: such a
# reply is about the egress, and another egress may get an answer (docs/egress.md).
_EGRESS_TEXT = re.compile(
    r"blocked using|\blisted (at|in|on|by)\b|spamhaus|spamcop|barracuda|\bsorbs\b|"
    r"\bdnsbl\b|\brbl\b|blacklist|black list|blocklist|block list|"
    r"client host (\[[^\]]*\] )?(rejected|blocked|refused)|"
    r"(your|client|sending|sender|source) ip( address)?\b.{0,60}"
    r"(block|list|reputation|refus|reject|ban|unsolicited)|"
    r"unsolicited mail originating from your ip|"
    r"(banned|blocked|blacklisted|listed) (sending |client |source )?ip\b|"
    r"banned sender\s*\[|\bip reputation\b|sending mta'?s poor reputation|"
    r"ip address sending this message|\bptr (record|resource record)|missing ptr|"
    r"reverse (dns|hostname)|not accepted from this ip|ip not in (whitelist|allowlist)|"
    r"\bthe ip (address )?(you'?re|you are) using\b|ipcheck\.proofpoint|"
    rf"(mail|messages?|connections?) from {_IP}.{{0,40}}?"
    r"(refused|rejected|deferred|weren't sent|were not sent|not accepted|blocked)|"
    rf"connections (will )?not (be )?accepted from {_IP}|"
    r"^\s*5\.3\.2 service currently unavailable|^\s*sender address blocked",
    re.IGNORECASE,
)
# Spamhaus's DBL lists domains (in a message's links, or our sender's), not IP addresses:
# another egress would be refused the same.
_DOMAIN_LIST_TEXT = re.compile(r"\bdbl\b", re.IGNORECASE)
_UNKNOWN_USER_TEXT = re.compile(
    r"unknown user|user unknown|no such user|no such (mailbox|recipient|address)|"
    r"mailbox (unavailable|not found|does not exist)|does not exist|doesn't exist|"
    r"invalid recipient|recipient not found|recipientnotfound|recipnotfound|"
    r"unrout(e)?able|undeliverable address|not a valid mailbox|user not found|"
    r"no mailbox|account (is )?(disabled|closed|inactive)|recipient unknown|"
    r"(doesn't|does not) have an? (\S+ ){0,3}account|account .{0,40}\bis disabled|"
    r"mailbox (is |has been )?(disabled|inactive|deactivated|closed)",
    re.IGNORECASE,
)
# Over quota, in the words the MTAs use; never the server's own disk ("insufficient system
# storage" is 452 4.3.1, a temporary failure of the server).
_FULL_TEXT = re.compile(
    r"over ?quota|quota (exceeded|full)|exceeded (its|his|her|their|the) (storage|quota)|"
    r"mailbox (is )?full|full mailbox|exceeded storage allocation|mailbox size limit|"
    r"quotaexceeded",
    re.IGNORECASE,
)
# The message is too big: a 552 (or 5.2.3, 5.3.4) about size, not a full mailbox.
_SIZE_TEXT = re.compile(
    r"message size|size limit|too (big|large)|larger than|databytes", re.IGNORECASE
)
# A mailbox's own rate limit (Gmail's 450 and 550 5.2.1 "receiving mail at a rate that
# prevents additional messages"): the box exists, mail later will go through.
_RATE_TEXT = re.compile(r"receiving (e-?)?mail (too quickly|at a rate)", re.IGNORECASE)
# Postfix's prefix for any refusal of a recipient, whatever the reason that follows it
# ("Recipient address rejected: User unknown" / ": Access denied"): a mailbox that does not
# exist only when nothing in the text says the refusal is about us.
_REJECTED_TEXT = re.compile(r"recipient (address )?rejected|address rejected", re.IGNORECASE)
# Exchange Online refuses a recipient its tenant has no object for (directory-based edge
# blocking) with "550 5.4.1 Recipient address rejected: Access denied. AS(201806281)". Read
# as "blocked", every unknown address there was unknown and, the catch-all probe unclear,
# every real one only likely valid. ("5.4.1 Relay access denied" is about the domain.)
_NO_SUCH_RECIPIENT_365 = re.compile(r"recipient address rejected: access denied", re.I)
# Greylisting said in words (postgrey, milter-greylist, Exim's greylistd), and Mimecast's
# reply its own reference calls greylisting.
_SAYS_GREYLIST = re.compile(
    r"grey ?list|gray ?list|internal resource temporarily unavailable", re.IGNORECASE
)
# A busy or broken server: retried as a temporary failure even when it adds "try again
# later" (Microsoft's "451 4.7.500 Server busy", Yahoo's "Resources temporarily
# unavailable", Exim's "Temporary local problem - please try later").
_BUSY_TEXT = re.compile(
    r"busy|overload|resources? (temporarily )?(unavailable|not available)|insufficient|"
    r"local (problem|error)|system problem|server error|internal error|lookup failure|"
    r"service (temporarily |currently )?(unavailable|not available)|too many|"
    r"temporarily rejected|temporar(il)?y (system |domain )?(failure|problem)|deferred",
    re.IGNORECASE,
)
_GREYLIST_TEXT = re.compile(r"try (again )?later|4\.7\.1|4\.2\.0", re.I)


def enhanced_code(message: str) -> tuple[int, int, int] | None:
    """The RFC 3463 enhanced status code in a reply text, e.g. ``(5, 1, 1)``: at its start
    (``5.1.1 …``, Cisco's ``#5.1.0 …``) or, as qmail writes it, at its end (``… (#5.1.1)``)."""
    match = _ENHANCED.match(message) or _TRAILING_ENHANCED.search(message)
    if not match:
        return None
    return int(match.group(1)), int(match.group(2)), int(match.group(3))


def refuses_egress(code: int, message: str) -> bool:
    """A 4xx/5xx that refuses our sending IP (a blocklist, the client host, no PTR, the
    IP's reputation) rather than a mailbox: the verdict is ``unknown``/``egress_blocked``,
    and the egress is cooled down for that server
    (:mod:`~verimail.engine.smtp.egress_cooldown`)."""
    return (
        400 <= code < 600
        and bool(_EGRESS_TEXT.search(message))
        and not _DOMAIN_LIST_TEXT.search(message)
    )


def over_quota(message: str) -> bool:
    """The text says the mailbox is over its quota (whatever the code)."""
    return bool(_FULL_TEXT.search(message))


def asks_new_session(code: int, message: str) -> bool:
    """A 452 that means "too many recipients in this transaction" (4.5.3, "too many", or
    a bare 452): the prober asks the rest in a new session. Not a full mailbox (``452
    4.2.2 … over quota``) nor a server's own temporary failure (``452 4.3.1 Insufficient
    system storage``, Yahoo's ``452 temporary domain failure``)."""
    if code != 452:
        return False
    enhanced = enhanced_code(message)
    if enhanced == (4, 5, 3) or "too many" in message.lower():
        return True
    return enhanced is None and not (over_quota(message) or _BUSY_TEXT.search(message))


def classify_rcpt(code: int, message: str) -> SmtpOutcome:
    """Read one reply to ``RCPT TO`` (or ``MAIL FROM``) as an outcome (table above).

    452 and 421 are returned as ``TEMP_FAILURE`` (or what their text says); the prober
    checks those codes itself before calling this, because they mean "new session" rather
    than a verdict.
    """
    if 200 <= code < 300:
        return SmtpOutcome.ACCEPTED
    if 500 <= code < 600:
        return _permanent(code, message)
    if 400 <= code < 500:
        return _temporary(code, message)
    return SmtpOutcome.PROTOCOL_ERROR


def _permanent(code: int, message: str) -> SmtpOutcome:
    enhanced = enhanced_code(message)
    unknown_user = bool(_UNKNOWN_USER_TEXT.search(message))
    if code == 550 and enhanced == (5, 4, 1) and _NO_SUCH_RECIPIENT_365.search(message):
        return SmtpOutcome.NO_MAILBOX
    if refuses_egress(code, message) and not unknown_user:
        return SmtpOutcome.EGRESS_BLOCKED
    if _RATE_TEXT.search(message):  # the box exists and takes mail again later
        return SmtpOutcome.TEMP_FAILURE
    if (
        (enhanced and enhanced[0] == 5 and enhanced[1] == 7)
        or (enhanced and enhanced[1:] in ((1, 7), (1, 8)))  # bad sender mailbox/system
        or _SENDER_TEXT.search(message)
        or _HELO_OR_RELAY_TEXT.search(message)
        or (
            _BLOCK_TEXT.search(message)
            and not unknown_user
            and not (enhanced and enhanced[1] == 1)  # (5.1.x: the code says mailbox)
        )
    ):
        return SmtpOutcome.BLOCKED
    full = over_quota(message)
    if unknown_user and not full:
        return SmtpOutcome.NO_MAILBOX  # (Yahoo's "552 … mailbox not found" too)
    if full or enhanced == (5, 2, 2):
        return SmtpOutcome.MAILBOX_FULL
    if code == 552 and enhanced is None and not _SIZE_TEXT.search(message):
        return SmtpOutcome.MAILBOX_FULL  # (RFC 5321: "exceeded storage allocation")
    if code in (550, 551, 553, 554) and enhanced and enhanced[1] == 1:
        return SmtpOutcome.NO_MAILBOX
    if code == 550 and enhanced == (5, 2, 1):  # mailbox disabled: mail bounces for good
        return SmtpOutcome.NO_MAILBOX
    if code in (550, 551, 553, 554) and _REJECTED_TEXT.search(message):
        return SmtpOutcome.NO_MAILBOX
    return SmtpOutcome.REJECTED_OTHER


def _temporary(code: int, message: str) -> SmtpOutcome:
    if enhanced_code(message) == (4, 2, 2) or over_quota(message):  # full for now
        return SmtpOutcome.MAILBOX_FULL
    if refuses_egress(code, message):  # a temporary block of our IP is still our IP
        return SmtpOutcome.EGRESS_BLOCKED
    # Only a reply that says so is greylisting: a 421 "closing", a 451 "local problem" or
    # a provider's "server busy" is another temporary failure (retried all the same).
    # Calling them greylisted told a user their list waited on greylisting when a server
    # was down or busy.
    if code == 421:
        return SmtpOutcome.TEMP_FAILURE
    if _SAYS_GREYLIST.search(message):
        return SmtpOutcome.GREYLISTED
    if _SENDER_TEXT.search(message) or _HELO_OR_RELAY_TEXT.search(message):
        return SmtpOutcome.TEMP_FAILURE  # (about us, for now: "450 4.7.1 Helo command rejected")
    if _BUSY_TEXT.search(message) or _RATE_TEXT.search(message):
        return SmtpOutcome.TEMP_FAILURE
    if _GREYLIST_TEXT.search(message):
        return SmtpOutcome.GREYLISTED
    return SmtpOutcome.TEMP_FAILURE


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
