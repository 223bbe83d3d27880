"""What an engine call knows between its steps: the addresses prepared (parses, domain
facts, the SMTP work grouped by mail host), the findings as shares of that work end, and
the call's figures. ``engine/core.py`` fills it in; the flows' verify pass hands it between
Prefect tasks.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Iterable, Mapping
from dataclasses import dataclass, field

from verimail.engine.dns_facts import DomainFacts
from verimail.engine.smtp.findings import Finding, GroupResult, HostGroup, SmtpStats
from verimail.engine.syntax import ParsedAddress, SyntaxProblem


@dataclass
class EngineStats:
    """What one call cost: the figures the benchmarks and ``--stats`` report."""

    addresses: int = 0
    unique_addresses: int = 0
    domains: int = 0
    dns_queries: int = 0
    mx_queries: int = 0
    smtp: SmtpStats = field(default_factory=SmtpStats)
    elapsed_ms: int = 0

    def as_dict(self) -> dict[str, int]:
        return {
            "addresses": self.addresses,
            "unique_addresses": self.unique_addresses,
            "domains": self.domains,
            "dns_queries": self.dns_queries,
            "mx_queries": self.mx_queries,
            "sessions": self.smtp.sessions,
            "rcpts": self.smtp.rcpts,
            "mail_from": self.smtp.mail_from,
            "catch_all_probes": self.smtp.catch_all_probes,
            "retries": self.smtp.retries,
            "elapsed_ms": self.elapsed_ms,
        }


@dataclass
class Prepared:
    """Everything known before SMTP, and the SMTP work still to do."""

    parsed: dict[str, ParsedAddress | SyntaxProblem]  # by submitted string
    facts: dict[str, DomainFacts]  # by ASCII domain
    groups: list[HostGroup]
    decided: dict[str, Finding]  # SMTP findings known without a session (by address)
    started: float
    stats: EngineStats
    findings: dict[str, Finding] = field(default_factory=dict)  # grows as groups finish
    catch_all: dict[str, bool | None] = field(default_factory=dict)
    # email -> the submitted string(s) parsed to it (a list only when there are several)
    _raws: dict[str, str | list[str]] | None = field(default=None, repr=False)
    # domain -> pieces of it (split_groups) still to settle besides the last one
    _pieces: Counter[str] = field(default_factory=Counter, repr=False)
    # a synchronous call's deadline (seconds), and the domains/addresses it cut short
    timeout: float | None = None
    late: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.findings.update(self.decided)

    def emails_of(self, group: HostGroup) -> list[str]:
        """The submitted strings whose SMTP work is in ``group``.

        Through an index built once: scanning every parse per group was quadratic (2,000
        groups × 200,000 addresses)."""
        if self._raws is None:
            self._raws = index = {}
            for raw, item in self.parsed.items():
                if isinstance(item, ParsedAddress):
                    known = index.setdefault(item.email, raw)
                    if known is not raw:
                        index[item.email] = [*([known] if isinstance(known, str) else known), raw]
        found: list[str] = []
        for rcpts in group.domains.values():
            for email in rcpts:
                raws = self._raws.get(email, ())
                if isinstance(raws, str):
                    found.append(raws)
                else:
                    found.extend(raws)
        return found

    def split_groups(self, limit: int) -> None:
        """Cut each host group of more than ``limit`` recipients into pieces of at most
        that many, in order; a domain may span pieces, and each piece probes its domains for
        catch-all itself. A list on one big mail host then settles (and shows progress)
        piece by piece instead of all at the end; a split domain's facts are kept until its
        last piece is settled (:meth:`forget`)."""
        kept: list[HostGroup] = []
        for group in self.groups:
            if sum(len(rcpts) for rcpts in group.domains.values()) <= limit:
                kept.append(group)
                continue
            pieces: list[dict[str, list[str]]] = [{}]
            room = limit
            for domain, rcpts in group.domains.items():
                if not rcpts:  # (only its catch-all probe: it goes with the current piece)
                    pieces[-1].setdefault(domain, [])
                start = 0
                while start < len(rcpts):
                    if room == 0:
                        pieces.append({})
                        room = limit
                    take = rcpts[start : start + room]
                    pieces[-1].setdefault(domain, []).extend(take)
                    start += len(take)
                    room -= len(take)
            for piece in pieces:
                kept.append(group.part(piece))
            spans = Counter(domain for piece in pieces for domain in piece)
            self._pieces.update({domain: n - 1 for domain, n in spans.items() if n > 1})
        self.groups = kept

    def pin_egresses(self, egresses: Mapping[str, str]) -> None:
        """Send each domain of ``egresses`` out through the egress named (a deferred retry
        pass: the egress of the first try, recorded with the parked rows)."""
        for group in self.groups:
            group.egresses.update({d: egresses[d] for d in group.domains if d in egresses})

    def decided_inputs(self) -> list[str]:
        """The submitted strings that need no SMTP (syntax, DNS, lists decided them)."""
        pending = {e for g in self.groups for rcpts in g.domains.values() for e in rcpts}
        return [
            raw
            for raw, item in self.parsed.items()
            if not (isinstance(item, ParsedAddress) and item.email in pending)
        ]

    def forget(self, raws: Iterable[str], group: HostGroup | None = None) -> None:
        """Drop what :meth:`Engine.stream` no longer needs once ``raws`` are handed over:
        their parses and findings, and the domain facts of ``group``, which is done."""
        for raw in raws:
            item = self.parsed.pop(raw, None)
            if isinstance(item, ParsedAddress):
                self.findings.pop(item.email, None)
                if self._raws is not None:
                    self._raws.pop(item.email, None)
        if group is not None:
            for domain in group.domains:
                if self._pieces[domain]:  # another piece of it is still to settle
                    self._pieces[domain] -= 1
                    continue
                self.catch_all.pop(domain, None)
                self.facts.pop(domain, None)

    @property
    def smtp_addresses(self) -> int:
        return sum(len(r) for g in self.groups for r in g.domains.values())


@dataclass
class SmtpShare:
    """A share of a prepared call's SMTP work, running as one awaitable (a host group's
    prober run, or a Prefect task over several groups): its groups, what it returns, and —
    for a call stopped at its deadline — the results it fills in as answers come."""

    groups: list[HostGroup]
    run: Awaitable[list[GroupResult]]
    partial: list[GroupResult] = field(default_factory=list)
