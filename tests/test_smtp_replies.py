"""How replies to RCPT TO are read: real servers' wording, table by table."""

from __future__ import annotations

import pytest

from verimail.engine.smtp.replies import classify_rcpt
from verimail.schemas.outcomes import SmtpOutcome

REPLIES: list[tuple[int, str, SmtpOutcome]] = [
    (250, "2.1.5 Ok", SmtpOutcome.ACCEPTED),
    (550, "5.1.1 <x@y>: Recipient address rejected: User unknown", SmtpOutcome.NO_MAILBOX),
    (
        550,
        "5.1.1 The email account that you tried to reach does not exist.",
        SmtpOutcome.NO_MAILBOX,
    ),
    # Gmail, a disabled account: it will never take mail again.
    (
        550,
        "5.2.1 The email account that you tried to reach is disabled.",
        SmtpOutcome.NO_MAILBOX,
    ),
    # Yahoo has no enhanced code; its text says there is no such account.
    (
        554,
        "delivery error: dd This user doesn't have a yahoo.com account (x@yahoo.com) [0]",
        SmtpOutcome.NO_MAILBOX,
    ),
    (552, "5.2.2 Mailbox full", SmtpOutcome.MAILBOX_FULL),
    (
        452,
        "4.2.2 The email account that you tried to reach is over quota",
        SmtpOutcome.MAILBOX_FULL,
    ),
    # A refusal of our sending IP (a blocklist, the client host), not of the box (issue 34).
    (554, "5.7.1 Client host rejected: listed at a block list", SmtpOutcome.EGRESS_BLOCKED),
    (
        554,
        "5.7.1 Service unavailable; Client host [192.0.2.7] blocked using zen.spamhaus.org; "
        "https://www.spamhaus.org/query/ip/192.0.2.7",
        SmtpOutcome.EGRESS_BLOCKED,
    ),
    (
        550,
        "5.7.1 [192.0.2.7] Our system has detected an unusual rate of unsolicited mail "
        "originating from your IP address.",
        SmtpOutcome.EGRESS_BLOCKED,
    ),
    (550, "5.7.606 Access denied, banned sending IP [192.0.2.7]", SmtpOutcome.EGRESS_BLOCKED),
    (550, "Rejected: 192.0.2.7 listed at bl.spamcop.net", SmtpOutcome.EGRESS_BLOCKED),
    (451, "4.7.1 Client host rejected: cannot find your hostname", SmtpOutcome.EGRESS_BLOCKED),
    # ... but not a mailbox that does not exist, whatever else the text says.
    (550, "5.1.1 user unknown (blocklisted senders are refused too)", SmtpOutcome.NO_MAILBOX),
    (550, "5.7.1 Relay access denied", SmtpOutcome.BLOCKED),
    # Microsoft 365 (directory-based edge blocking): the tenant has no such recipient.
    (
        550,
        "5.4.1 Recipient address rejected: Access denied. AS(201806281) "
        "[BN1NAM02FT022.eop-nam02.prod.protection.outlook.com]",
        SmtpOutcome.NO_MAILBOX,
    ),
    (550, "5.4.1 Relay Access Denied", SmtpOutcome.BLOCKED),  # the domain, not the box
    (554, "5.7.1 <x@y>: Recipient address rejected: Access denied", SmtpOutcome.BLOCKED),
    (553, "5.3.0 Some other refusal", SmtpOutcome.REJECTED_OTHER),
    (450, "4.2.0 Greylisted, try again later", SmtpOutcome.GREYLISTED),
    (451, "4.3.0 Temporary lookup failure", SmtpOutcome.TEMP_FAILURE),
    (451, "4.7.1 Please try again later", SmtpOutcome.GREYLISTED),
    (421, "4.7.0 Too many connections, try again later", SmtpOutcome.TEMP_FAILURE),
    (450, "4.2.1 Mailbox temporarily unavailable", SmtpOutcome.TEMP_FAILURE),
    (452, "4.3.1 Insufficient system storage", SmtpOutcome.TEMP_FAILURE),
    (999, "5.1.1 mystery", SmtpOutcome.PROTOCOL_ERROR),
    # Postfix refuses our MAIL FROM at RCPT TO (smtpd_delay_reject): about us, not the box.
    (
        550,
        "5.1.8 <verify@verimail.localhost>: Sender address rejected: Domain not found",
        SmtpOutcome.BLOCKED,
    ),
    (553, "5.1.7 <verify@x>: Sender address rejected: not logged in", SmtpOutcome.BLOCKED),
    (550, "<x@y>: Sender address rejected: Access denied", SmtpOutcome.BLOCKED),
    # Postfix prefixes every recipient refusal with "Recipient address rejected:"; what
    # follows says whose fault it is.
    (550, "<x@y>: Recipient address rejected: blocked by policy", SmtpOutcome.BLOCKED),
    (550, "<x@y>: Recipient address rejected", SmtpOutcome.NO_MAILBOX),
    (550, "5.1.1 <x@y>: Recipient address rejected: policy", SmtpOutcome.NO_MAILBOX),
    # An IP address in the text is not an enhanced code (only one at the start is).
    (550, "Client [5.1.22.33] rejected: come back another day", SmtpOutcome.REJECTED_OTHER),
    # ... and "no reverse DNS for your IP" is about our IP (issue 46: another egress may pass).
    (550, "Client [5.1.22.33] rejected: no reverse DNS for your IP", SmtpOutcome.EGRESS_BLOCKED),
    (550, "Mailbox 5.1.1.1 is fine", SmtpOutcome.REJECTED_OTHER),
]


@pytest.mark.parametrize(("code", "message", "outcome"), REPLIES)
def test_real_world_replies(code: int, message: str, outcome: SmtpOutcome) -> None:
    assert classify_rcpt(code, message) is outcome
