"""The Email Finder, single lookup: a person's name and company domain in, one address out.

Why one long file: the steps of one lookup (input checks, candidates, probing order, catch-all
and history shortcuts) and their refusals are read in the order they run.

Steps, cheapest first, so that most refusals cost no network traffic at all:

1. the input: the domain is validated and normalised with the syntax module (IDNA, lower
   case; URLs, a leading ``@`` or ``www.`` are trimmed; IP literals and single labels are
   refused) and the name must leave something usable — else :class:`FinderInputError`,
   which the API turns into a 422;
2. the reference lists: disposable domains and free providers are refused (see below);
3. the candidates (``finder_patterns.candidate_addresses``), at most ``max_probes``, role
   inboxes never among them — so the finder can never return ``info@`` for "Info Sales";
   the domain's learned patterns (``patterns``, see ``finder_learned``) first;
4. DNS once (the engine's resolver caches it); no mail host, or only private addresses:
   ``not_found`` without any connection;
5. ONE SMTP session (``domain_session.DomainSession``): the random-address catch-all probe
   first, then the candidates in rank order until the first accepted one. A CSV job passes
   the same session for every person at one domain, so the probe is sent once per domain
   and the people share the connection.

A find records its base pattern through ``patterns`` (pattern and count, never the
address), so the next lookup at the domain tries it first. A policy block, or a 421 before
any candidate was answered, ends the lookup at once (``not_found``, nothing charged): the
other candidates would only be refused too. See docs/finder.md.

Outcomes:

* ``found``: the server rejected the random address and accepted a candidate — a verified
  mailbox. ``confidence = prior × verdict confidence`` (0.95 × 0.97 = 0.92 for
  ``first.last``; the rank's prior, raised by a learned pattern: ``_Lookup.prior``): the
  verdict says the mailbox exists; the prior says how likely it is *this person's*
  (``jsmith`` may as well be Jane Smith's).
* ``catch_all``: the server accepts any address, so no candidate can be told apart; the
  most likely candidate is returned as a guess with ``found = False`` and
  ``confidence = prior × CATCH_ALL_FACTOR`` (at most 0.6), well below
  any verified find. Only the probe is sent: further RCPTs would prove nothing. The same
  status (and formula) is used when a candidate was accepted but the catch-all probe got
  no clear answer (verdict ``likely_valid``): the address is plausible, not verified.
* ``not_found``: everything else, with a ``reason`` that says which — all candidates
  rejected; the server could not be checked (greylisting, blocking, timeouts: the finder
  does not wait out greylisting, a single lookup is interactive — the reason says to try
  later, and ``unchecked`` says what the server did, so that a CSV job can retry it in a
  later pass); DNS error (unknown, not "does not exist"); NXDOMAIN / null MX / no mail
  host; disposable or free-provider domain.

Free providers (gmail.com …) are refused without probing: their mailboxes belong to
individuals, not to a company, so ``john.smith@gmail.com`` being accepted says nothing
about *this* John Smith — a business-email finder would return a stranger's address.
"""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from verimail.engine.core import STOP_RESERVE, Engine, stop_tasks
from verimail.engine.finder_learned import DomainPattern, PatternMemory
from verimail.engine.finder_patterns import (
    Candidate,
    NameParts,
    candidate_addresses,
    normalise_name,
    pattern_confidence,
)
from verimail.engine.smtp.domain_session import DomainSession, SequenceResult
from verimail.engine.smtp.findings import Finding
from verimail.engine.syntax import SyntaxProblem, parse_address
from verimail.engine.verdict import Facts, Verdict, decide
from verimail.schemas.limits import NAME_MAX_LENGTH
from verimail.schemas.outcomes import DomainOutcome, SmtpOutcome, Status, SubStatus

FinderStatus = Literal["found", "not_found", "catch_all"]

CATCH_ALL_FACTOR = 0.6
"""Scales the rank prior of an unverifiable guess, keeping it at or below 0.6."""

# Answers that settle a candidate: the server looked at the mailbox and said no. (A full
# mailbox is there: the lookup stops at it and answers with it.)
_SETTLED = frozenset({SmtpOutcome.NO_MAILBOX, SmtpOutcome.REJECTED_OTHER})

_SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*://", re.IGNORECASE)
_PORT = re.compile(r":\d{1,5}$")


class FinderInputError(ValueError):
    """The request cannot be looked up as given (the API answers 422 with ``detail``)."""

    def __init__(self, detail: str, field: str | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.field = field


class FinderResult(BaseModel):
    """One lookup's answer: SPEC §2.6 without ``credits_used`` (billing is the API's job)."""

    model_config = ConfigDict(frozen=True)

    found: bool = Field(description="True only for a verified address (status `found`).")
    email: str | None = Field(description="The address found, or the best guess on a catch-all.")
    status: FinderStatus
    confidence: float = Field(ge=0.0, le=1.0, description="0 when nothing was found.")
    elapsed_ms: int = Field(ge=0)
    pattern: str | None = Field(description="Local-part pattern of `email`, e.g. `first.last`.")
    alternatives: list[str] = Field(
        description="Candidates probed over SMTP, in the order tried, without `email` itself."
    )
    reason: str = Field(description="A sentence saying why the answer is what it is.")
    domain: str = Field(description="The domain looked up (normalised: lower case, IDNA).")
    verification_status: Status | None = Field(
        None, description="The verification status of `email` (null when there is none)."
    )
    smtp_response: str | None = Field(
        None, description="The mail server's reply about `email`, when it was probed."
    )
    unchecked: SubStatus | None = Field(
        None,
        description="`not_found` because the mail server could not be checked: what it "
        "did, as the verifier's sub-status (`greylisted`, `temp_failure`, `timeout`, "
        "`connection_failed`, `blocked` …); null otherwise. A job retries the lookups the "
        "server put off (greylisted, temporary failure, timeout, connection failed).",
    )


# --- input ------------------------------------------------------------------------------


def normalise_finder_domain(raw: str) -> str:
    """The ASCII, lower-case domain to look up; ``FinderInputError`` when it is not one.

    Lenient about what people paste (``https://www.acme.com/about``, ``@acme.com``), strict
    about what it is: the syntax module decides, so the finder accepts exactly the domains
    the verifier accepts.
    """
    text = raw.translate(_INVISIBLE).strip() if isinstance(raw, str) else ""
    if not text:
        raise FinderInputError(
            "The domain is empty; give a company domain such as example.com.", "domain"
        )
    if text.startswith("@") and text.count("@") == 1:
        text = text[1:]
    elif "@" in text:
        raise FinderInputError(
            "Give the company domain only (such as example.com), not an email address.",
            "domain",
        )
    text = _SCHEME.sub("", text)
    text = re.split(r"[/?#]", text, maxsplit=1)[0]
    if text.count(":") == 1:
        text = _PORT.sub("", text)
    text = text.rstrip(".")
    # (every "www.": normalising twice must give the same domain, as the API and a CSV row
    # both normalise what they are given)
    while text.lower().startswith("www.") and "." in text[4:]:
        text = text[4:]
    parsed = parse_address(f"x@{text}")
    if isinstance(parsed, SyntaxProblem):
        raise FinderInputError(_domain_reason(parsed.reason), "domain")
    return parsed.domain


# Invisible characters a domain copied from a web page carries (names drop them too).
_INVISIBLE = str.maketrans("", "", "\u200b\u2060\ufeff")
_ADDRESS_WORDING = (
    ("The part after the @", "The domain"),
    ("immediately after the @", "at its start"),
    ("after the @", "in the domain"),
    ("An email address", "A domain"),
    ("an email address", "a domain"),
    ("The email address", "The domain"),
    ("the email address", "the domain"),
    ("The address", "The domain"),
)


def _domain_reason(reason: str) -> str:
    """The syntax module speaks of addresses; the finder's caller gave a domain."""
    if reason.startswith("There is nothing after the @"):
        return "The domain is empty; give a company domain such as example.com."
    if reason.startswith("The address is longer"):
        return "The domain is too long."
    for said, meant in _ADDRESS_WORDING:
        reason = reason.replace(said, meant)
    return reason


NameField = Literal["first_name", "last_name"]


def check_name_part(text: str, field: NameField) -> None:
    """``FinderInputError`` when one half of the name is too long or has nothing an address
    could use (e.g. only punctuation); the API and a finder job's rows both check with this."""
    if len(text) > NAME_MAX_LENGTH:
        raise FinderInputError(
            f"The {field.replace('_', ' ')} is longer than {NAME_MAX_LENGTH} characters.", field
        )
    first, last = (text, "x") if field == "first_name" else ("x", text)
    if normalise_name(first, last) is None:
        raise FinderInputError(
            f"The {field.replace('_', ' ')} has no letters or digits that can appear in an "
            "email address.",
            field,
        )


def check_names(first_name: str, last_name: str) -> NameParts:
    """The normalised name; ``FinderInputError`` naming the part that has nothing usable."""
    check_name_part(first_name, "first_name")
    check_name_part(last_name, "last_name")
    parts = normalise_name(first_name, last_name)
    if parts is None:  # pragma: no cover - each part was usable on its own
        raise FinderInputError("The name has nothing that can appear in an email address.")
    return parts


# --- the lookup -------------------------------------------------------------------------


@dataclass(frozen=True)
class _Lookup:
    """What every answer of one lookup shares: the domain and the start time."""

    domain: str
    started: float
    learned: DomainPattern | None = None

    def prior(self, candidate: Candidate) -> float:
        """How likely ``candidate`` is the person's before SMTP: the rank prior, raised by
        what the domain's finds say of its pattern, ``1 - (1 - rank) × (1 - learned)``
        (first.last at rank 0 with 20 finds: 0.95 -> 0.9975; last.f at rank 10 after one
        find: 0.59 -> 0.79, after twenty: 0.98)."""
        prior = pattern_confidence(candidate.rank)
        if self.learned is not None:
            prior = 1 - (1 - prior) * (1 - self.learned.confidence_of(candidate.base_pattern))
        return prior

    def answer(
        self,
        status: FinderStatus,
        reason: str,
        *,
        email: str | None = None,
        pattern: str | None = None,
        confidence: float = 0.0,
        alternatives: list[str] | None = None,
        verification_status: Status | None = None,
        smtp_response: str | None = None,
        unchecked: SubStatus | None = None,
    ) -> FinderResult:
        return FinderResult(
            found=status == "found",
            email=email,
            status=status,
            confidence=confidence,
            elapsed_ms=int((time.perf_counter() - self.started) * 1000),
            pattern=pattern,
            alternatives=alternatives or [],
            reason=reason,
            domain=self.domain,
            verification_status=verification_status,
            smtp_response=smtp_response,
            unchecked=unchecked,
        )


async def find_email(
    engine: Engine,
    first_name: str,
    last_name: str,
    domain: str,
    *,
    max_probes: int,
    session: DomainSession | None = None,
    patterns: PatternMemory | None = None,
) -> FinderResult:
    """Find a person's verified address at ``domain``, probing at most ``max_probes``
    candidates over one SMTP session; see the module docstring for the outcomes.

    ``session``: an open :class:`DomainSession` for this domain to reuse (a CSV job's
    rows); without one, the lookup opens and closes its own. ``patterns``: where the
    domain's learned patterns are read (they are tried first) and a find's pattern is
    recorded; without it the lookup neither uses nor teaches anything.
    """
    if max_probes < 1:
        raise ValueError("max_probes must be >= 1")
    started = time.perf_counter()
    ascii_domain = normalise_finder_domain(domain)
    check_names(first_name, last_name)
    lookup = _Lookup(ascii_domain, started)

    lists = engine.lists
    if typo := lists.typo_of(ascii_domain):
        return lookup.answer(
            "not_found",
            f"The domain {ascii_domain} looks like a typo of {typo}: did you mean {typo}? "
            "No address was looked for.",
        )
    if lists.is_disposable(ascii_domain):
        return lookup.answer(
            "not_found",
            f"The domain {ascii_domain} belongs to a disposable (throwaway) email service, "
            "not a company; no address was looked for.",
        )
    if lists.is_free(ascii_domain):
        return lookup.answer(
            "not_found",
            f"{ascii_domain} is a free email provider: its addresses belong to individuals, "
            "not to a company, so the finder does not guess them. Give the person's company "
            "domain instead.",
        )
    learned = await patterns.load(ascii_domain) if patterns is not None else None
    known = await patterns.known_valid(ascii_domain) if patterns is not None else frozenset()
    lookup = _Lookup(ascii_domain, started, learned)
    candidates = candidate_addresses(
        first_name,
        last_name,
        ascii_domain,
        is_role=lists.is_role,
        limit=max_probes,
        prefer=learned.ranked if learned is not None else (),
        known=known,
    )
    if not candidates:
        return lookup.answer(
            "not_found",
            f"No person-level address at {ascii_domain} can be built from this name (only "
            "role inboxes or over-long addresses); no address was looked for.",
        )

    facts = await engine.resolver.facts(ascii_domain)
    if facts.outcome is not DomainOutcome.OK:
        reason = decide(Facts(domain_outcome=facts.outcome, domain=ascii_domain)).reason
        if facts.outcome is DomainOutcome.DNS_ERROR:
            reason += " Whether the person has an address there is unknown."
        else:
            reason += " No address can exist there."
        return lookup.answer("not_found", reason)
    hosts = engine.prober.allowed_hosts(facts.hosts)
    if not hosts:
        reason = _smtp_verdict(Finding(SmtpOutcome.PRIVATE_ADDRESS), ascii_domain).reason
        return lookup.answer("not_found", reason + " No address could be checked.")

    emails = [c.email for c in candidates]
    if session is not None:
        sequence = await session.probe(hosts, ascii_domain, emails)
    else:
        async with DomainSession(engine.prober) as own:
            sequence = await own.probe(hosts, ascii_domain, emails)
    tried = [c.email for c in candidates if c.email in sequence.findings]

    if sequence.failure is not None:
        reason, unchecked = _unchecked(
            sequence.failure, ascii_domain, stopped=len(tried) < len(candidates)
        )
        return lookup.answer("not_found", reason, alternatives=tried, unchecked=unchecked)
    if sequence.catch_all:
        best = candidates[0]
        return lookup.answer(
            "catch_all",
            f"The mail server for {ascii_domain} accepts mail for any address, so no "
            f"candidate can be verified; {best.email} is the most likely address "
            f"(pattern {best.pattern}), a guess that is not verified.",
            email=best.email,
            pattern=best.pattern,
            confidence=_guess_confidence(lookup, best),
            verification_status=Status.CATCHALL,
        )
    if sequence.accepted is not None:
        accepted = next(c for c in candidates if c.email == sequence.accepted)
        result = _accepted(lookup, sequence, accepted, tried, known=accepted.local in known)
        if result.found and patterns is not None:
            await patterns.record(ascii_domain, accepted.base_pattern)
        return result
    reason, unchecked = _nothing_accepted(sequence, tried, ascii_domain)
    return lookup.answer("not_found", reason, alternatives=tried, unchecked=unchecked)


async def find_email_within(
    timeout: float,
    engine: Engine,
    first_name: str,
    last_name: str,
    domain: str,
    *,
    max_probes: int,
    patterns: PatternMemory | None = None,
) -> FinderResult:
    """:func:`find_email` answered by ``timeout`` seconds (a synchronous call's deadline):
    a lookup still under way then is stopped, its session closed, and the answer is
    ``not_found`` saying the server had not answered in time."""
    started = time.perf_counter()
    lookup = asyncio.ensure_future(
        find_email(engine, first_name, last_name, domain, max_probes=max_probes, patterns=patterns)
    )
    done, _ = await asyncio.wait({lookup}, timeout=max(0.0, timeout - STOP_RESERVE))
    if lookup in done:
        return lookup.result()
    await stop_tasks({lookup})
    ascii_domain = normalise_finder_domain(domain)
    return _Lookup(ascii_domain, started).answer(
        "not_found",
        f"The mail server for {ascii_domain} had not answered when the {timeout:g} s deadline "
        "came, so the candidate addresses could not be checked and none was found; try "
        "again later or with a longer timeout.",
        unchecked=SubStatus.TIMEOUT,
    )


def _accepted(
    lookup: _Lookup,
    sequence: SequenceResult,
    candidate: Candidate,
    tried: list[str],
    *,
    known: bool = False,
) -> FinderResult:
    """An accepted candidate: verified only when the server refused the random address. A
    full mailbox is there too: found, as risky as the verifier calls it."""
    domain = lookup.domain
    finding = sequence.findings[candidate.email]
    others = [e for e in tried if e != candidate.email]
    verdict = decide(
        Facts(
            domain_outcome=DomainOutcome.OK,
            smtp_outcome=finding.outcome,  # (accepted, or a full mailbox)
            smtp_response=finding.reply,
            is_catch_all=sequence.catch_all,
            local=candidate.local,
            domain=domain,
        )
    )
    where = f"pattern {candidate.pattern}, candidate {candidate.rank + 1} by likelihood"
    if lookup.learned is not None and candidate.base_pattern in lookup.learned.counts:
        finds = lookup.learned.counts[candidate.base_pattern]
        where += f", the pattern of {finds} earlier find{'s' if finds != 1 else ''} there"
    if known:
        where += ", an address your account verified as valid before"
    if finding.outcome is SmtpOutcome.MAILBOX_FULL:
        reason = (
            f"The mail server for {domain} says the mailbox {candidate.email} exists "
            f"({where}), but it is full: mail to it bounces until it is emptied."
        )
    elif verdict.status is Status.VALID:
        reason = (
            f"The mail server for {domain} confirmed that {candidate.email} exists and "
            f"refused a made-up address, so it does not accept everything ({where})."
        )
    else:
        return lookup.answer(
            "catch_all",
            f"The mail server for {domain} accepted {candidate.email}, but gave no clear "
            "answer for a made-up address, so it may accept any address; the address is a "
            "plausible guess, not verified.",
            email=candidate.email,
            pattern=candidate.pattern,
            confidence=_guess_confidence(lookup, candidate),
            alternatives=others,
            verification_status=verdict.status,
            smtp_response=finding.reply,
        )
    return lookup.answer(
        "found",
        reason,
        email=candidate.email,
        pattern=candidate.pattern,
        confidence=round(lookup.prior(candidate) * verdict.confidence_score, 2),
        alternatives=others,
        verification_status=verdict.status,
        smtp_response=finding.reply,
    )


def _guess_confidence(lookup: _Lookup, candidate: Candidate) -> float:
    return round(lookup.prior(candidate) * CATCH_ALL_FACTOR, 2)


def _smtp_verdict(finding: Finding, domain: str) -> Verdict:
    """The verdict table's row for an SMTP outcome (one wording across the service)."""
    return decide(
        Facts(
            domain_outcome=DomainOutcome.OK,
            smtp_outcome=finding.outcome,
            smtp_response=finding.reply,
            domain=domain,
        )
    )


def _unchecked(
    finding: Finding, domain: str, *, stopped: bool = False
) -> tuple[str, SubStatus | None]:
    """Why nothing could be checked, and what the server did (as a sub-status); ``stopped``:
    the lookup ended before probing every candidate (a block or a 421 answers them all
    alike; nothing is charged)."""
    verdict = _smtp_verdict(finding, domain)
    rest = " The lookup stopped there instead of probing the other candidates." if stopped else ""
    reason = (
        f"{verdict.reason} So the candidate addresses could not be checked "
        f"and none was found; try again later.{rest}"
    )
    return reason, verdict.sub_status


def _nothing_accepted(
    sequence: SequenceResult, tried: list[str], domain: str
) -> tuple[str, SubStatus | None]:
    """Why no candidate was accepted: all refused, or the server could not be checked (and
    then what it did, as a sub-status)."""
    findings = [sequence.findings[e] for e in tried]
    unsettled = [f for f in findings if f.outcome not in _SETTLED]
    if unsettled:
        return _unchecked(unsettled[0], domain)
    if not findings:
        return (
            f"The mail server for {domain} dropped the connection before any candidate "
            "could be checked, so no address was found; try again later."
        ), SubStatus.CONNECTION_FAILED
    n = len(findings)
    return (
        f"The mail server for {domain} refused all {n} likely address"
        f"{'es' if n != 1 else ''} for this person, so no address was found."
    ), None
