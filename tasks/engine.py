"""The verification engine: addresses in, SPEC §2.2 results out.

Three steps, so that flows can spread the middle one over Prefect tasks:

1. ``prepare`` — syntax, reference lists, DNS once per unique domain (concurrently,
   cached), and grouping of the domains that need SMTP by the mail hosts serving them;
2. ``run_groups`` — the SMTP prober over any subset of those groups;
3. ``finish`` — the verdict for every submitted address, in input order.

``verify_many`` runs all three; ``verify`` is the same code with one address. The engine
knows nothing of HTTP, accounts or Prefect's server.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from verimail import API_VERSION
from verimail.config import Settings
from verimail.schemas.outcomes import DomainOutcome, SmtpOutcome
from verimail.schemas.results import VerificationResult
from verimail.tasks.dns_facts import DnsStats, DomainFacts, DomainResolver, MailHost
from verimail.tasks.lists import ReferenceLists
from verimail.tasks.smtp_probe import Finding, GroupResult, HostGroup, Prober, SmtpStats
from verimail.tasks.syntax import ParsedAddress, SyntaxProblem, parse_address
from verimail.tasks.verdict import Facts, decide

DNS_CONCURRENCY = 64  # domains resolved at once


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

    inputs: list[str]  # as submitted, in order
    parsed: dict[str, ParsedAddress | SyntaxProblem]  # by submitted string
    facts: dict[str, DomainFacts]  # by ASCII domain
    groups: list[HostGroup]
    decided: dict[str, Finding]  # SMTP findings known without a session (by address)
    started: float
    stats: EngineStats
    findings: dict[str, Finding] = field(default_factory=dict)  # grows as groups finish
    catch_all: dict[str, bool | None] = field(default_factory=dict)
    results: dict[str, VerificationResult] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.findings.update(self.decided)

    def emails_of(self, group: HostGroup) -> list[str]:
        """The submitted strings whose SMTP work is in ``group``."""
        wanted = {e for rcpts in group.domains.values() for e in rcpts}
        return [
            raw
            for raw, item in self.parsed.items()
            if isinstance(item, ParsedAddress) and item.email in wanted
        ]

    def decided_inputs(self) -> list[str]:
        """The submitted strings that need no SMTP (syntax, DNS, lists decided them)."""
        pending = {e for g in self.groups for rcpts in g.domains.values() for e in rcpts}
        return [
            raw
            for raw, item in self.parsed.items()
            if not (isinstance(item, ParsedAddress) and item.email in pending)
        ]

    @property
    def smtp_addresses(self) -> int:
        return sum(len(r) for g in self.groups for r in g.domains.values())


@dataclass
class BatchResult:
    results: list[VerificationResult]  # one per submitted address, in input order
    stats: EngineStats


class Engine:
    """One per process (or per event loop user); holds the resolver and the prober."""

    def __init__(self, settings: Settings, lists: ReferenceLists | None = None) -> None:
        self.settings = settings
        self.lists = lists or ReferenceLists.from_settings(settings)
        self.resolver = DomainResolver(settings)
        self.prober = Prober(settings)

    async def verify(self, address: str) -> VerificationResult:
        """Verify one address (the single endpoint)."""
        return (await self.verify_many([address])).results[0]

    async def verify_many(
        self,
        addresses: Iterable[str],
        on_progress: Callable[[int], None] | None = None,
    ) -> BatchResult:
        """Verify a list: dedupe, group by mail host, run groups concurrently.

        ``on_progress(n)`` is called with the number of unique addresses finished so far.
        """
        prepared = await self.prepare(addresses)
        done = len(prepared.parsed) - prepared.smtp_addresses
        if on_progress:
            on_progress(done)

        async def one(group: HostGroup) -> GroupResult:
            nonlocal done
            result = await self.prober.run_group(group)
            done += sum(len(r) for r in group.domains.values())
            if on_progress:
                on_progress(done)
            return result

        results = await asyncio.gather(*(one(g) for g in prepared.groups))
        return BatchResult(self.finish(prepared, results), prepared.stats)

    async def prepare(self, addresses: Iterable[str]) -> Prepared:
        """Syntax, lists and DNS for every unique address; SMTP work grouped by host."""
        started = time.perf_counter()
        inputs = [a if isinstance(a, str) else "" for a in addresses]
        stats = EngineStats(addresses=len(inputs))
        parsed: dict[str, ParsedAddress | SyntaxProblem] = {}
        for raw in inputs:
            if raw not in parsed:
                parsed[raw] = parse_address(raw)
        by_email: dict[str, ParsedAddress] = {}
        for item in parsed.values():
            if isinstance(item, ParsedAddress):
                by_email.setdefault(item.email, item)
        stats.unique_addresses = len(by_email)
        domains = sorted({p.domain for p in by_email.values()})
        stats.domains = len(domains)

        dns_stats = DnsStats()
        gate = asyncio.Semaphore(DNS_CONCURRENCY)

        async def resolve(domain: str) -> DomainFacts:
            async with gate:
                return await self.resolver.facts(domain, dns_stats)

        facts = dict(
            zip(domains, await asyncio.gather(*(resolve(d) for d in domains)), strict=True)
        )
        stats.dns_queries = dns_stats.queries
        stats.mx_queries = dns_stats.by_type.get("MX", 0)

        decided: dict[str, Finding] = {}
        groups: dict[tuple[str, ...], HostGroup] = {}
        allowed: dict[str, tuple[MailHost, ...]] = {}  # by domain: addresses parsed once
        for email, item in by_email.items():
            fact = facts[item.domain]
            if fact.outcome is not DomainOutcome.OK:
                continue
            if self.lists.is_disposable(item.domain):
                continue  # a throwaway domain is "disposable" whatever its server says
            hosts = allowed.get(item.domain)
            if hosts is None:
                hosts = allowed[item.domain] = self.prober.allowed_hosts(fact.hosts)
            if not hosts:
                names = ", ".join(h.name for h in fact.hosts)
                decided[email] = Finding(
                    SmtpOutcome.PRIVATE_ADDRESS,
                    f"{names} resolves only to private or reserved addresses; not contacted",
                )
                continue
            key = tuple(h.name for h in hosts)
            group = groups.get(key)
            if group is None:
                group = groups[key] = HostGroup(hosts=hosts, domains={})
            group.domains.setdefault(item.domain, []).append(email)
        return Prepared(inputs, parsed, facts, list(groups.values()), decided, started, stats)

    async def run_groups(self, groups: Sequence[HostGroup]) -> list[GroupResult]:
        """SMTP for a subset of the prepared groups (a flow task's share)."""
        return list(await asyncio.gather(*(self.prober.run_group(g) for g in groups)))

    def absorb(self, prepared: Prepared, result: GroupResult) -> None:
        """Take one group's SMTP findings into ``prepared`` (flows do this per task)."""
        prepared.findings.update(result.findings)
        prepared.catch_all.update(result.catch_all)
        prepared.stats.smtp.add(result.stats)

    def result_for(self, prepared: Prepared, raw: str) -> VerificationResult:
        """The verdict for one submitted string, from what ``prepared`` knows now."""
        cached = prepared.results.get(raw)
        if cached is None:
            elapsed_ms = int((time.perf_counter() - prepared.started) * 1000)
            cached = prepared.results[raw] = self._result(
                raw,
                prepared.parsed[raw],
                prepared.facts,
                prepared.findings,
                prepared.catch_all,
                elapsed_ms,
            )
        return cached

    def finish(
        self, prepared: Prepared, group_results: Iterable[GroupResult]
    ) -> list[VerificationResult]:
        """Verdicts for every submitted address, in input order."""
        for result in group_results:
            self.absorb(prepared, result)
        prepared.stats.elapsed_ms = int((time.perf_counter() - prepared.started) * 1000)
        return [self.result_for(prepared, raw) for raw in prepared.inputs]

    def _result(
        self,
        raw: str,
        item: ParsedAddress | SyntaxProblem,
        facts: dict[str, DomainFacts],
        findings: dict[str, Finding],
        catch_all: dict[str, bool | None],
        elapsed_ms: int,
    ) -> VerificationResult:
        """One SPEC §2.2 record: the facts gathered, then the verdict on them."""
        if isinstance(item, SyntaxProblem):
            domain = raw.strip().rpartition("@")[2].strip().lower() if "@" in raw else ""
            gathered = Facts(syntax_reason=item.reason, domain=domain)
            email, mx_records, suggestion = raw.strip(), [], None
        else:
            fact = facts[item.domain]
            finding = findings.get(item.email, Finding(SmtpOutcome.NOT_ATTEMPTED))
            gathered = Facts(
                domain_outcome=fact.outcome,
                smtp_outcome=finding.outcome,
                smtp_response=finding.response,
                is_catch_all=catch_all.get(item.domain),
                is_disposable=self.lists.is_disposable(item.domain),
                is_role=self.lists.is_role(item.local),
                is_free=self.lists.is_free(item.domain),
                local=item.local,
                domain=item.domain,
            )
            email, mx_records = item.email, list(fact.mx_records)
            suggestion = self.lists.did_you_mean(item.email)
        verdict = decide(gathered)
        return VerificationResult(
            email=email,
            safe_to_send=verdict.safe_to_send,
            status=verdict.status,
            confidence_score=verdict.confidence_score,
            reason=verdict.reason,
            domain=gathered.domain,
            is_disposable=gathered.is_disposable,
            is_role_based=gathered.is_role,
            is_free=gathered.is_free,
            is_catch_all=bool(gathered.is_catch_all),
            mx_records=mx_records,
            smtp_response=gathered.smtp_response,
            verification_time_ms=elapsed_ms,
            api_version=API_VERSION,
            sub_status=verdict.sub_status,
            did_you_mean=suggestion,
            catch_all_score=verdict.catch_all_score,
        )
