"""The verdict table: every row, the invariants, and the catch-all score."""

from __future__ import annotations

import dataclasses

import pytest

from verimail.engine import verdict as verdict_module
from verimail.engine.verdict import (
    LIKELY_VALID_THRESHOLD,
    Facts,
    Verdict,
    catch_all_score,
    decide,
    one_line_reply,
)
from verimail.schemas.outcomes import DomainOutcome, SmtpOutcome, Status, SubStatus

DOMAIN = "acme.test"


def facts(**changes: object) -> Facts:
    """A syntactically fine address on a domain with working DNS; SMTP as given."""
    base = Facts(
        syntax_reason=None,
        domain_outcome=DomainOutcome.OK,
        smtp_outcome=SmtpOutcome.ACCEPTED,
        smtp_response=None,
        is_catch_all=False,
        is_disposable=False,
        is_role=False,
        is_free=False,
        local="john.smith",
        domain=DOMAIN,
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


# (row number in the docstring, facts, status, sub_status, confidence or None if scored)
TABLE: list[tuple[int | str, Facts, Status, SubStatus, float | None]] = [
    (
        1,
        facts(syntax_reason="The address has no @ sign.", domain_outcome=None),
        Status.INVALID,
        SubStatus.INVALID_SYNTAX,
        1.0,
    ),
    ("1b", facts(typo_of="gmail.com"), Status.INVALID, SubStatus.POSSIBLE_TYPO, 0.80),
    (
        "1b",  # on the disposable list too (gmial.com is): a typo, never a throwaway service
        facts(typo_of="gmail.com", is_disposable=True, smtp_outcome=SmtpOutcome.ACCEPTED),
        Status.INVALID,
        SubStatus.POSSIBLE_TYPO,
        0.80,
    ),
    (
        "1b",
        facts(typo_of="gmail.com", domain_outcome=DomainOutcome.NXDOMAIN),
        Status.INVALID,
        SubStatus.POSSIBLE_TYPO,
        0.80,
    ),
    (2, facts(is_disposable=True), Status.DISPOSABLE, SubStatus.DISPOSABLE, 0.95),
    (
        2,
        facts(is_disposable=True, smtp_outcome=SmtpOutcome.NO_MAILBOX),
        Status.DISPOSABLE,
        SubStatus.DISPOSABLE,
        0.95,
    ),
    (
        2,
        facts(is_disposable=True, domain_outcome=DomainOutcome.DNS_ERROR),
        Status.DISPOSABLE,
        SubStatus.DISPOSABLE,
        0.95,
    ),
    (
        3,
        facts(domain_outcome=DomainOutcome.NXDOMAIN, smtp_outcome=SmtpOutcome.NOT_ATTEMPTED),
        Status.INVALID,
        SubStatus.NXDOMAIN,
        0.99,
    ),
    (
        4,
        facts(domain_outcome=DomainOutcome.NULL_MX, smtp_outcome=SmtpOutcome.NOT_ATTEMPTED),
        Status.INVALID,
        SubStatus.NULL_MX,
        0.99,
    ),
    (
        5,
        facts(domain_outcome=DomainOutcome.NO_MAIL_HOST, smtp_outcome=SmtpOutcome.NOT_ATTEMPTED),
        Status.INVALID,
        SubStatus.NO_MX,
        0.95,
    ),
    (
        6,
        facts(domain_outcome=DomainOutcome.DNS_ERROR, smtp_outcome=SmtpOutcome.NOT_ATTEMPTED),
        Status.UNKNOWN,
        SubStatus.DNS_ERROR,
        0.20,
    ),
    (
        7,
        facts(domain_outcome=None, smtp_outcome=SmtpOutcome.NOT_ATTEMPTED),
        Status.UNKNOWN,
        SubStatus.NOT_CHECKED,
        0.10,
    ),
    (8, facts(), Status.VALID, SubStatus.OK, 0.97),
    (8, facts(local="info", is_role=True), Status.VALID, SubStatus.ROLE_BASED, 0.95),
    (8, facts(is_free=True), Status.VALID, SubStatus.OK, 0.97),
    (9, facts(is_catch_all=True), Status.LIKELY_VALID, SubStatus.CATCH_ALL, None),
    (
        9,
        facts(is_catch_all=True, local="info", is_role=True),
        Status.LIKELY_VALID,
        SubStatus.CATCH_ALL,
        None,
    ),
    (10, facts(is_catch_all=True, local="xk3j9qpl2"), Status.CATCHALL, SubStatus.CATCH_ALL, None),
    (11, facts(is_catch_all=None), Status.LIKELY_VALID, SubStatus.OK, 0.75),
    (
        11,
        facts(is_catch_all=None, local="sales", is_role=True),
        Status.LIKELY_VALID,
        SubStatus.ROLE_BASED,
        0.75,
    ),
    (
        12,
        facts(smtp_outcome=SmtpOutcome.NO_MAILBOX, smtp_response="550 5.1.1 User unknown"),
        Status.INVALID,
        SubStatus.MAILBOX_NOT_FOUND,
        0.95,
    ),
    (
        12,
        facts(smtp_outcome=SmtpOutcome.NO_MAILBOX, is_catch_all=True),
        Status.INVALID,
        SubStatus.MAILBOX_NOT_FOUND,
        0.95,
    ),
    (
        13,
        facts(smtp_outcome=SmtpOutcome.MAILBOX_FULL, smtp_response="552 5.2.2 Mailbox full"),
        Status.RISKY,
        SubStatus.MAILBOX_FULL,
        0.60,
    ),
    (
        14,
        facts(smtp_outcome=SmtpOutcome.REJECTED_OTHER, smtp_response="554 5.0.0 Rejected"),
        Status.RISKY,
        SubStatus.REJECTED,
        0.50,
    ),
    (
        15,
        facts(smtp_outcome=SmtpOutcome.BLOCKED, smtp_response="554 5.7.1 Blocked by policy"),
        Status.UNKNOWN,
        SubStatus.BLOCKED,
        0.20,
    ),
    (
        "15b",
        facts(
            smtp_outcome=SmtpOutcome.EGRESS_BLOCKED,
            smtp_response="554 5.7.1 Client host [192.0.2.7] blocked using zen.spamhaus.org",
        ),
        Status.UNKNOWN,
        SubStatus.EGRESS_BLOCKED,
        0.20,
    ),
    (
        16,
        facts(smtp_outcome=SmtpOutcome.GREYLISTED, smtp_response="451 4.7.1 Try again later"),
        Status.UNKNOWN,
        SubStatus.GREYLISTED,
        0.30,
    ),
    (
        17,
        facts(smtp_outcome=SmtpOutcome.TEMP_FAILURE, smtp_response="421 4.3.2 Shutting down"),
        Status.UNKNOWN,
        SubStatus.TEMP_FAILURE,
        0.25,
    ),
    (18, facts(smtp_outcome=SmtpOutcome.TIMEOUT), Status.UNKNOWN, SubStatus.TIMEOUT, 0.20),
    (
        19,
        facts(smtp_outcome=SmtpOutcome.CONNECTION_FAILED),
        Status.UNKNOWN,
        SubStatus.CONNECTION_FAILED,
        0.20,
    ),
    (
        20,
        facts(smtp_outcome=SmtpOutcome.PRIVATE_ADDRESS),
        Status.UNKNOWN,
        SubStatus.PRIVATE_ADDRESS,
        0.10,
    ),
    (
        21,
        facts(smtp_outcome=SmtpOutcome.PROTOCOL_ERROR, smtp_response="HTTP/1.1 400 Bad"),
        Status.UNKNOWN,
        SubStatus.PROTOCOL_ERROR,
        0.15,
    ),
    (
        22,
        facts(smtp_outcome=SmtpOutcome.NOT_ATTEMPTED),
        Status.UNKNOWN,
        SubStatus.NOT_CHECKED,
        0.10,
    ),
]


def _id(row: tuple[int | str, Facts, Status, SubStatus, float | None]) -> str:
    return f"row{row[0]}-{row[2].value}-{row[3].value}"


@pytest.mark.parametrize("row", TABLE, ids=[_id(r) for r in TABLE])
def test_decision_table(row: tuple[int | str, Facts, Status, SubStatus, float | None]) -> None:
    _, given, status, sub_status, confidence = row
    result = decide(given)
    assert isinstance(result, Verdict)
    assert result.status is status
    assert result.sub_status is sub_status
    if confidence is not None:
        assert result.confidence_score == pytest.approx(confidence)
    assert result.safe_to_send is (status is Status.VALID)
    assert 0.0 <= result.confidence_score <= 1.0
    assert result.reason.strip()
    assert "\n" not in result.reason
    assert result.reason.endswith((".", "?"))  # ("… did you mean gmail.com?")
    if given.syntax_reason is None:
        assert DOMAIN in result.reason


def test_every_row_of_the_docstring_is_tested() -> None:
    documented = {
        line.split("|")[1].strip()
        for line in (verdict_module.__doc__ or "").splitlines()
        if line.startswith("| ") and line.split("|")[1].strip()[:1].isdigit()
    }
    assert documented == {str(row[0]) for row in TABLE}


def test_a_typo_domain_reason_asks_did_you_mean() -> None:
    result = decide(facts(typo_of="gmail.com", domain="gmial.com", is_disposable=True))
    assert result.reason.endswith("did you mean gmail.com?")
    assert "gmial.com" in result.reason and "disposable" not in result.reason


def test_every_smtp_outcome_is_decided() -> None:
    for outcome in SmtpOutcome:
        result = decide(facts(smtp_outcome=outcome))
        assert 0.0 <= result.confidence_score <= 1.0
        assert DOMAIN in result.reason


def test_every_domain_outcome_is_decided() -> None:
    for outcome in DomainOutcome:
        result = decide(facts(domain_outcome=outcome, smtp_outcome=SmtpOutcome.NOT_ATTEMPTED))
        assert DOMAIN in result.reason


PEOPLE = [("john.smith", False), ("xk3j9qpl2", False), ("info", True)]


def test_exhaustive_invariants() -> None:
    """Over every combination: safe_to_send only for valid; scores in range."""
    seen: set[Status] = set()
    for domain_outcome in [None, *DomainOutcome]:
        for smtp in SmtpOutcome:
            for catch_all in (True, False, None):
                for disposable in (True, False):
                    for local, role in PEOPLE:
                        result = decide(
                            facts(
                                domain_outcome=domain_outcome,
                                smtp_outcome=smtp,
                                is_catch_all=catch_all,
                                is_disposable=disposable,
                                is_role=role,
                                local=local,
                            )
                        )
                        seen.add(result.status)
                        assert result.safe_to_send is (result.status is Status.VALID)
                        assert 0.0 <= result.confidence_score <= 1.0
                        if result.status is Status.UNKNOWN:
                            assert result.confidence_score <= 0.3
                        if disposable:
                            assert result.status is Status.DISPOSABLE
                        if result.catch_all_score is not None:
                            assert result.status in (Status.CATCHALL, Status.LIKELY_VALID)
    assert {Status.VALID, Status.INVALID, Status.DISPOSABLE, Status.UNKNOWN} <= seen
    assert {Status.CATCHALL, Status.LIKELY_VALID, Status.RISKY} <= seen


def test_free_provider_never_changes_status() -> None:
    for smtp in SmtpOutcome:
        for catch_all in (True, False, None):
            plain = decide(facts(smtp_outcome=smtp, is_catch_all=catch_all, local="xk3j9qpl2"))
            free = decide(
                facts(smtp_outcome=smtp, is_catch_all=catch_all, local="xk3j9qpl2", is_free=True)
            )
            assert plain.status is free.status


def test_syntax_reason_is_passed_through() -> None:
    result = decide(
        Facts(syntax_reason="The part before the @ is longer than 64 characters.", local="x")
    )
    assert result.reason == "The part before the @ is longer than 64 characters."
    assert result.catch_all_score is None
    assert not result.safe_to_send


def test_facts_and_verdict_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        facts().local = "x"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        decide(facts()).status = Status.INVALID  # type: ignore[misc]


def test_is_pure() -> None:
    given = facts(is_catch_all=True, local="jane.doe")
    assert decide(given) == decide(given)


# --- reasons ------------------------------------------------------------------------


def test_valid_reason_wording() -> None:
    assert decide(facts()).reason == (
        "The mail server for acme.test confirmed that this mailbox exists."
    )


def test_nxdomain_reason_wording() -> None:
    result = decide(facts(domain_outcome=DomainOutcome.NXDOMAIN))
    assert result.reason == "The domain acme.test does not exist."


# What the provider meant, in plain words before the quoted reply (issue 46).
PLAIN_REASONS = [
    (
        SmtpOutcome.NO_MAILBOX,
        "550 5.2.1 The email account that you tried to reach is disabled.",
        "does not exist or is disabled",
    ),
    (
        SmtpOutcome.MAILBOX_FULL,
        "452 4.2.2 The email account … is over quota.",
        "full (over its storage quota)",
    ),
    (
        SmtpOutcome.EGRESS_BLOCKED,
        "550 5.7.708 Access denied, traffic not accepted from this IP.",
        "refused our sending IP address, not this address",
    ),
    (
        SmtpOutcome.BLOCKED,
        "504 5.5.2 <localhost>: Helo command rejected",
        "a policy of its own (our sender address, our HELO name, relaying",
    ),
    (
        SmtpOutcome.GREYLISTED,
        "450 4.2.0 Greylisted, try again later",
        "greylisting: it defers a sender it has not seen before",
    ),
    (
        SmtpOutcome.TEMP_FAILURE,
        "451 4.7.500 Server busy. Please try again later",
        "busy, rate-limiting, or a temporary fault",
    ),
]


@pytest.mark.parametrize(("outcome", "reply", "words"), PLAIN_REASONS)
def test_the_reason_says_what_the_provider_meant_then_quotes_it(
    outcome: SmtpOutcome, reply: str, words: str
) -> None:
    reason = decide(facts(smtp_outcome=outcome, smtp_response=reply)).reason
    assert words in reason
    assert reason.index(words) < reason.index("The server replied:")


def test_an_egress_refusal_says_other_routes_were_tried_and_names_the_egress() -> None:
    reason = decide(facts(smtp_outcome=SmtpOutcome.EGRESS_BLOCKED, egress="eu-proxy")).reason
    assert 'egress "eu-proxy"' in reason and "every other route" in reason


def test_reason_quotes_the_reply_on_one_line() -> None:
    reply = (
        "550-5.1.1 The email account that you tried to reach does not exist.\r\n"
        "550-5.1.1 Please try double-checking the recipient's email\r\n"
        "550 5.1.1 address for typos or unnecessary spaces."
    )
    result = decide(facts(smtp_outcome=SmtpOutcome.NO_MAILBOX, smtp_response=reply))
    assert "\n" not in result.reason and "\r" not in result.reason
    assert "550-5.1.1 The email account" in result.reason
    assert result.reason.count("5.1.1") == 1
    assert len(one_line_reply(reply)) <= verdict_module.REPLY_MAX_CHARS


def test_reply_is_trimmed() -> None:
    reply = "550 " + "x" * 500
    text = one_line_reply(reply)
    assert len(text) <= verdict_module.REPLY_MAX_CHARS
    assert text.endswith("…")
    result = decide(facts(smtp_outcome=SmtpOutcome.REJECTED_OTHER, smtp_response=reply))
    assert len(result.reason) < 400


def test_reply_control_characters_removed() -> None:
    assert one_line_reply('550 bad\x00 "user"\x1b') == "550 bad 'user'"
    assert one_line_reply(None) == ""
    assert one_line_reply(" \r\n ") == ""


def test_accepted_reply_not_quoted() -> None:
    result = decide(facts(smtp_response="250 2.1.5 Ok"))
    assert "250" not in result.reason


# --- catch-all score ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("local", "is_role"),
    [
        ("info", True),
        ("sales", True),
        ("john.smith", False),
        ("jane_doe", False),
        ("anna-maria.schmidt", False),
        ("j.smith", False),
        ("john.s", False),
        ("josé.garcía", False),
        ("John.Smith+news", False),
    ],
)
def test_catch_all_high(local: str, is_role: bool) -> None:
    assert catch_all_score(local, is_role, False) >= LIKELY_VALID_THRESHOLD


@pytest.mark.parametrize(
    "local",
    ["xk3j9qpl2", "a8f3c2d1e9", "qwrtzpl", "user12345", "x" * 50, "jsmith", "john", "js", ""],
)
def test_catch_all_low(local: str) -> None:
    assert catch_all_score(local, False, False) < LIKELY_VALID_THRESHOLD


def test_catch_all_ordering() -> None:
    def score(local: str, role: bool = False) -> int:
        return catch_all_score(local, role, False)

    assert score("info", True) >= 80
    assert score("john.smith") >= 80
    assert score("xk3j9qpl2") < 80
    assert score("john.smith") > score("john") > score("xk3j9qpl2")
    assert score("jsmith") > score("qwrtzpl")
    assert score("john.smith") > score("john.smith85") > score("john.smith123456")
    assert score("john") > score("john" * 12)


def test_catch_all_score_bounds() -> None:
    for local in ["", "a", "info", "john.smith", "x" * 64, "1" * 64, "用户", '"a b"']:
        for role in (True, False):
            for free in (True, False):
                assert 0 <= catch_all_score(local, role, free) <= 100


def test_catch_all_verdict_uses_score() -> None:
    high = decide(facts(is_catch_all=True, local="john.smith"))
    low = decide(facts(is_catch_all=True, local="xk3j9qpl2"))
    assert high.catch_all_score is not None and high.catch_all_score >= 80
    assert low.catch_all_score is not None and low.catch_all_score < 80
    assert high.confidence_score > low.confidence_score
    assert not high.safe_to_send and not low.safe_to_send
    assert f"{high.catch_all_score}/100" in high.reason
    assert decide(facts()).catch_all_score is None
