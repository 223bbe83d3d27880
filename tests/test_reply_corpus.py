"""The reply table read against the providers' published replies (issue 46).

``tests/data/smtp_replies.yaml`` holds replies as Gmail, Microsoft, Yahoo, Apple, the mail
gateways and the common MTAs publish or ship them, each with its source and the outcome a
sender should act on (docs/smtp-prober.md, "Reading a reply"). Every line is read the way
the prober reads a reply to ``RCPT TO``: a 452 asking for a new transaction first
(:func:`asks_new_session`, on a session that already has recipients), then
:func:`classify_rcpt`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from verimail.engine.smtp.replies import asks_new_session, classify_rcpt
from verimail.schemas.outcomes import SmtpOutcome

CORPUS = Path(__file__).parent / "data" / "smtp_replies.yaml"
TOO_MANY = "too_many_recipients"
OUTCOMES = {
    SmtpOutcome.NO_MAILBOX,
    SmtpOutcome.MAILBOX_FULL,
    SmtpOutcome.EGRESS_BLOCKED,
    SmtpOutcome.BLOCKED,
    SmtpOutcome.TEMP_FAILURE,
    SmtpOutcome.GREYLISTED,
    SmtpOutcome.REJECTED_OTHER,
}
"""What a line may expect, besides :data:`TOO_MANY`."""

# The references the issue names: each gives the corpus lines of its own.
REQUIRED_SOURCES = {
    "gmail",
    "microsoft",
    "yahoo",
    "apple",
    "proofpoint",
    "mimecast",
    "barracuda",
    "cisco",
    "postfix",
    "exim",
    "sendmail",
    "qmail",
    "exchange",
    "zimbra",
}

_REPLY = re.compile(r"^(\d{3})[ -](.*)$")


def _corpus() -> dict[str, Any]:
    with CORPUS.open(encoding="utf-8") as fh:
        data: dict[str, Any] = yaml.safe_load(fh)
    return data


CORPUS_DATA = _corpus()
LINES: list[dict[str, str]] = CORPUS_DATA["replies"]


def read(reply: str) -> str:
    """What the prober makes of ``reply`` to the second RCPT of a session."""
    match = _REPLY.match(reply)
    assert match, f"not a reply line: {reply!r}"
    code, message = int(match.group(1)), match.group(2)
    if asks_new_session(code, message):
        return TOO_MANY
    return classify_rcpt(code, message).value


def test_the_corpus_covers_every_reference_the_issue_names() -> None:
    """At least 150 lines, each from a listed source with a known outcome, and every
    reference of the issue among the sources."""
    sources = CORPUS_DATA["sources"]
    assert len(LINES) >= 150
    assert {line["source"] for line in LINES} >= REQUIRED_SOURCES
    allowed = {o.value for o in OUTCOMES} | {TOO_MANY}
    for line in LINES:
        assert line["source"] in sources, line
        assert line["outcome"] in allowed, line
    replies = [line["reply"] for line in LINES]
    assert len(set(zip(replies, [line["source"] for line in LINES], strict=True))) == len(replies)


@pytest.mark.parametrize(
    "line", LINES, ids=[f"{line['source']}:{line['reply'][:60]}" for line in LINES]
)
def test_every_reply_is_read_as_its_source_means(line: dict[str, str]) -> None:
    assert read(line["reply"]) == line["outcome"], line
