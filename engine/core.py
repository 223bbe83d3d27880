"""The verification engine: addresses in, SPEC §2.2 results out.

Why one long file: the steps below share what a run prepared (facts, groups, findings) and
the one loop every caller settles addresses through.

Three steps, so that flows can spread the middle one over Prefect tasks:

1. ``prepare`` — syntax, reference lists, DNS once per unique domain (concurrently,
   cached), and grouping of the domains that need SMTP by the mail servers (IP addresses)
   their MX hosts lead to;
2. ``run_groups`` — the SMTP prober over any subset of those groups (a share of the work);
3. ``as_settled`` — the shares run at once, and as each ends its findings are absorbed and
   its addresses settled (``verdict`` per submitted string), then forgotten.

``stream`` runs all three, a share per host group, and hands each result over as soon as it
is known; the flows' verify pass (``tasks/pipeline.py``) runs the same steps with a Prefect
task per share of several groups; ``verify_many`` collects the stream in input order and
``verify`` does one address. The engine knows nothing of HTTP, accounts or Prefect's server.
"""

from __future__ import annotations

import asyncio
import threading
import time
from asyncio import FIRST_COMPLETED
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from verimail import API_VERSION
from verimail.config import Settings
from verimail.engine import metrics
from verimail.engine.dns_facts import DnsStats, DomainFacts, DomainResolver, MailHost
from verimail.engine.lists import ReferenceLists
from verimail.engine.prepared import EngineStats, Prepared, SmtpShare
from verimail.engine.smtp.findings import Finding, GroupResult, HostGroup, group_key
from verimail.engine.smtp.prober import Prober
from verimail.engine.smtp.replies import retry_after_hint
from verimail.engine.syntax import ParsedAddress, SyntaxProblem, parse_address
from verimail.engine.verdict import Facts, decide
from verimail.schemas.outcomes import DomainOutcome, SmtpOutcome, SubStatus
from verimail.schemas.results import VerificationResult

DNS_CONCURRENCY = 64  # domains resolved at once
STOP_RESERVE = 0.4
"""Seconds before a call's deadline at which its work is stopped: room to hang up (see
:func:`stop_tasks`) and build the answer, so the answer is never later than the deadline."""
STOP_GRACE = 0.15
"""Seconds the stopped work gets to say QUIT before its connections are cut outright."""


async def _as_list(run: Awaitable[GroupResult]) -> list[GroupResult]:
    return [await run]


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

    def close(self) -> None:
        """Stop what outlives a call: the SMTP slot leases' Redis client and renewer thread,
        the shared lessons' client (idempotent; the engine is not used afterwards)."""
        self.prober.slots.close()
        self.prober.learned.close()

    async def verify(
        self,
        address: str,
        *,
        timeout: float | None = None,
        greylist_retries: int | None = None,
    ) -> VerificationResult:
        """Verify one address (the single endpoint)."""
        outcome = await self.verify_many(
            [address], timeout=timeout, greylist_retries=greylist_retries
        )
        return outcome.results[0]

    async def verify_many(
        self,
        addresses: Iterable[str],
        on_progress: Callable[[int], None] | None = None,
        *,
        timeout: float | None = None,
        greylist_retries: int | None = None,
    ) -> BatchResult:
        """Verify a list: dedupe, group by mail host, run groups concurrently.

        ``on_progress(n)`` is called with the number of distinct submitted strings
        finished so far.
        Holds every result until the end (they come back in input order); a caller that can
        take them as they come uses :meth:`stream` and keeps memory to the work list.
        """
        inputs = [a if isinstance(a, str) else "" for a in addresses]
        stats = EngineStats()
        results: dict[str, VerificationResult] = {}
        async for raw, result in self.stream(
            inputs,
            on_progress,
            stats=stats,
            timeout=timeout,
            greylist_retries=greylist_retries,
        ):
            results[raw] = result
        return BatchResult([results[raw] for raw in inputs], stats)

    async def stream(
        self,
        addresses: Iterable[str],
        on_progress: Callable[[int], None] | None = None,
        *,
        stats: EngineStats | None = None,
        timeout: float | None = None,
        greylist_retries: int | None = None,
    ) -> AsyncIterator[tuple[str, VerificationResult]]:
        """Each distinct submitted string once, with its result, as soon as it is known: the
        ones syntax, lists and DNS decided first, then each host group's as its SMTP ends.

        A result is forgotten once handed over, with its parse, its SMTP finding and its
        group's domain facts, so memory holds the work still to do, never the results
        (``verify_many`` on 200,000 addresses held ~3.5 KiB per address). ``addresses``
        may be a generator: it is read once. ``stats``, when given, is filled in.

        ``timeout`` (seconds) is a synchronous caller's deadline: DNS and SMTP still under
        way :data:`STOP_RESERVE` before it are stopped (sessions closed, see :func:`stop_tasks`)
        and their addresses answered with what is known — ``unknown``/``timeout`` when the
        server had not answered. ``greylist_retries`` overrides the setting (0: greylisting
        is answered at once, with ``retry_after``).
        """
        started = time.perf_counter()
        until = None if timeout is None else started + max(0.0, timeout - STOP_RESERVE)
        prepared = await self.prepare(addresses, stats=stats, until=until)
        prepared.timeout = timeout
        done = 0

        def progress(n: int) -> None:
            nonlocal done
            done += n
            if on_progress:
                on_progress(done)

        decided = prepared.decided_inputs()
        for item in self.settle(prepared, decided):
            yield item
        progress(len(decided))
        shares = []
        for group in prepared.groups:
            partial = GroupResult()
            run = self.prober.run_group(group, result=partial, greylist_retries=greylist_retries)
            shares.append(SmtpShare([group], _as_list(run), [partial]))
        prepared.groups = []
        async for settled in self.as_settled(prepared, shares, until=until):
            n = 0
            for item in settled:
                n += 1
                yield item
            progress(n)
        prepared.stats.elapsed_ms = int((time.perf_counter() - prepared.started) * 1000)

    async def as_settled(
        self,
        prepared: Prepared,
        shares: Iterable[SmtpShare],
        *,
        until: float | None = None,
    ) -> AsyncIterator[Iterator[tuple[str, VerificationResult]]]:
        """Run ``shares`` of ``prepared``'s SMTP work at once and hand over each share's
        results as soon as it ends: its findings absorbed, then its groups settled (and
        forgotten) as the caller takes each result from the iterator it is handed — which
        it does before asking for the next share's, so memory holds one result at a time.
        The one loop behind :meth:`stream` (a share per host group) and the flows' verify
        pass (a share per Prefect task of several groups).

        ``until`` (a ``perf_counter`` time): shares still at work then are stopped (see
        :func:`stop_tasks`) and settled with what they learnt, the recipients the server
        had not answered given a ``timeout`` finding. A share's task is dropped as soon as
        it is handled: a finished one holds its groups and findings, which would otherwise
        stay alive until the last share ends; cancelling the caller stops them all (their
        sessions hang up first)."""
        running: dict[asyncio.Future[list[GroupResult]], SmtpShare] = {}
        for share in shares:
            running[asyncio.ensure_future(share.run)] = share
        pending: set[asyncio.Future[list[GroupResult]]] = set(running)
        try:
            while pending:
                left = None if until is None else until - time.perf_counter()
                if left is not None and left <= 0:
                    break
                finished, pending = await asyncio.wait(
                    pending, timeout=left, return_when=FIRST_COMPLETED
                )
                for task in finished:
                    share = running.pop(task)
                    for result in task.result():
                        self.absorb(prepared, result)
                    yield self._settle_share(prepared, share)
                del finished
            if pending:  # the deadline: stop, then answer with what is known
                await stop_tasks(pending)
                for task in pending:
                    share = running.pop(task)
                    for result in share.partial:
                        self.absorb(prepared, result)
                    for group in share.groups:
                        _unanswered(prepared, group, prepared.timeout or 0.0)
                    yield self._settle_share(prepared, share)
                pending = set()
        finally:
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    def _settle_share(
        self, prepared: Prepared, share: SmtpShare
    ) -> Iterator[tuple[str, VerificationResult]]:
        for group in share.groups:
            yield from self.settle(prepared, prepared.emails_of(group), group)

    async def prepare(
        self,
        addresses: Iterable[str],
        *,
        stats: EngineStats | None = None,
        until: float | None = None,
    ) -> Prepared:
        """Syntax, lists and DNS for every unique address; SMTP work grouped by host.

        Keeps the distinct submitted strings, not the list (``addresses`` is read once).
        Lookups still under way at ``until`` (a ``perf_counter`` time) are stopped, and
        their domains count as a DNS error."""
        started = time.perf_counter()
        stats = stats if stats is not None else EngineStats()
        parsed: dict[str, ParsedAddress | SyntaxProblem] = {}
        for given in addresses:
            raw = given if isinstance(given, str) else ""
            stats.addresses += 1
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
        facts, late_domains = await self._resolve(domains, dns_stats, until)
        stats.dns_queries = dns_stats.queries
        stats.mx_queries = dns_stats.by_type.get("MX", 0)

        decided: dict[str, Finding] = {}
        groups: dict[tuple[object, ...], HostGroup] = {}
        allowed: dict[str, tuple[MailHost, ...] | None] = {}  # by domain: work out once
        for email, item in by_email.items():
            if item.domain not in allowed:
                allowed[item.domain] = self._smtp_hosts(facts[item.domain], item.domain)
            hosts = allowed[item.domain]
            if hosts is None:
                continue  # (decided without SMTP)
            if not hosts:
                names = ", ".join(h.name for h in facts[item.domain].hosts)
                decided[email] = Finding(
                    SmtpOutcome.PRIVATE_ADDRESS,
                    f"{names} resolves only to private or reserved addresses; not contacted",
                )
                continue
            key = group_key(hosts, self.settings.smtp_sessions_by_server)
            group = groups.get(key)
            if group is None:
                group = groups[key] = HostGroup(hosts=hosts, domains={})
            group.domains.setdefault(item.domain, []).append(email)
        prepared = Prepared(parsed, facts, list(groups.values()), decided, started, stats)
        prepared.late.update(late_domains)
        return prepared

    async def mail_groups(self, domains: Sequence[str]) -> list[list[str]]:
        """``domains`` grouped as the prober would share sessions among them: the domains
        served by the same mail servers together; a domain that needs no SMTP (no mail
        host, a disposable or typo domain, only private addresses) alone. What a big job's
        shards are packed from (DNS once per domain, no address parsed)."""
        facts, _ = await self._resolve(sorted(set(domains)), DnsStats(), None)
        groups: dict[tuple[object, ...], list[str]] = {}
        for domain in domains:
            hosts = self._smtp_hosts(facts[domain], domain)
            by_server = self.settings.smtp_sessions_by_server
            key = group_key(hosts, by_server) if hosts else ("", domain)
            groups.setdefault(key, []).append(domain)
        return list(groups.values())

    async def _resolve(
        self, domains: Sequence[str], dns_stats: DnsStats, until: float | None
    ) -> tuple[dict[str, DomainFacts], set[str]]:
        """Each domain's facts, resolved concurrently (cached for their TTL); lookups
        still under way at ``until`` (a ``perf_counter`` time) are stopped and their
        domains count as a DNS error (returned too, as late)."""
        facts: dict[str, DomainFacts] = {}
        late_domains: set[str] = set()
        todo = iter(domains)

        async def resolver() -> None:
            # DNS_CONCURRENCY workers share one iterator: a task per domain (20,000 of them
            # for a 200,000-address list) cost memory and bought no more concurrency.
            for domain in todo:
                facts[domain] = await self.resolver.facts(domain, dns_stats)

        workers = [
            asyncio.ensure_future(resolver()) for _ in range(min(DNS_CONCURRENCY, len(domains)))
        ]
        if workers:
            left = None if until is None else max(0.0, until - time.perf_counter())
            done, late = await asyncio.wait(workers, timeout=left)
            if late:
                await stop_tasks(late)
            for worker in done:
                worker.result()  # (a resolver bug is raised, not hidden)
            for domain in domains:
                if domain not in facts:
                    facts[domain] = DomainFacts(domain, DomainOutcome.DNS_ERROR)
                    late_domains.add(domain)
        return facts, late_domains

    def _smtp_hosts(self, fact: DomainFacts, domain: str) -> tuple[MailHost, ...] | None:
        """The mail hosts to ask about ``domain``'s addresses, those we may connect to
        (empty: only private or reserved addresses); None when no SMTP is needed — the
        domain has no mail host, or is a disposable or typo domain (decided whatever its
        server says)."""
        if fact.outcome is not DomainOutcome.OK:
            return None
        if self.lists.is_disposable(domain) or self.lists.typo_of(domain):
            return None
        return self.prober.allowed_hosts(fact.hosts)

    async def run_groups(
        self, groups: Sequence[HostGroup], *, greylist_retries: int | None = None
    ) -> list[GroupResult]:
        """SMTP for a subset of the prepared groups (a flow task's share); see
        :meth:`stream` for ``greylist_retries``."""
        runs = (self.prober.run_group(g, greylist_retries=greylist_retries) for g in groups)
        return list(await asyncio.gather(*runs))

    def absorb(self, prepared: Prepared, result: GroupResult) -> None:
        """Take one group's SMTP findings into ``prepared`` (flows do this per task)."""
        prepared.findings.update(result.findings)
        prepared.catch_all.update(result.catch_all)
        prepared.stats.smtp.add(result.stats)

    def settle(
        self, prepared: Prepared, raws: list[str], group: HostGroup | None = None
    ) -> Iterator[tuple[str, VerificationResult]]:
        """Each of ``raws`` with its verdict (all of ``group``'s, once its findings are
        absorbed); once all are handed over, they and ``group``'s domain facts are forgotten.
        What :meth:`stream` and the bulk flow hand over: neither keeps a result it gave."""
        for raw in raws:
            yield raw, self.verdict(prepared, raw)
        prepared.forget(raws, group)

    def verdict(self, prepared: Prepared, raw: str) -> VerificationResult:
        """A fresh SPEC §2.2 record for one submitted string (not kept)."""
        elapsed_ms = int((time.perf_counter() - prepared.started) * 1000)
        item = prepared.parsed[raw]
        result = self._result(
            raw, item, prepared.facts, prepared.findings, prepared.catch_all, elapsed_ms
        )
        late = prepared.late
        if isinstance(item, ParsedAddress) and (item.email in late or item.domain in late):
            result.reason += (
                f" No answer had come when the call's {prepared.timeout:g} s deadline "
                "passed; a longer timeout, or a bulk job, may settle it."
            )
        return result

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
            # (the flags of the domain still hold: john doe@mailinator.com is disposable)
            gathered = Facts(
                syntax_reason=item.reason,
                domain=domain,
                is_disposable=bool(domain) and self.lists.is_disposable(domain),
                is_free=bool(domain) and self.lists.is_free(domain),
            )
            email, mx_records, suggestion = raw.strip(), [], None
        else:
            fact = facts[item.domain]
            finding = findings.get(item.email, Finding(SmtpOutcome.NOT_ATTEMPTED))
            gathered = Facts(
                domain_outcome=fact.outcome,
                smtp_outcome=finding.outcome,
                smtp_response=finding.reply,
                smtp_note=finding.response if finding.reply is None else None,
                is_catch_all=catch_all.get(item.domain),
                is_disposable=self.lists.is_disposable(item.domain),
                is_role=self.lists.is_role(item.local),
                is_free=self.lists.is_free(item.domain),
                typo_of=self.lists.typo_of(item.domain),
                local=item.local,
                domain=item.domain,
                egress=finding.egress,
            )
            email, mx_records = item.email, list(fact.mx_records)
            suggestion = self.lists.did_you_mean(item.email)
        verdict = decide(gathered)
        metrics.verified(verdict.status.value, verdict.sub_status.value, findings.get(email))
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
            retry_after=(
                retry_after_hint(gathered.smtp_response, self.settings.greylist_retry_after)
                if verdict.sub_status is SubStatus.GREYLISTED
                else None
            ),
        )


async def stop_tasks(tasks: set[asyncio.Future[Any]]) -> None:
    """Cancel ``tasks`` and wait until they have ended: sessions get :data:`STOP_GRACE` to
    say QUIT; the ones still at it (a tarpit answers QUIT slowly too) are cancelled again,
    which cuts their connections at once. Nothing outlives the call."""
    for task in tasks:
        task.cancel()
    _, left = await asyncio.wait(tasks, timeout=STOP_GRACE)
    for _ in range(3):  # (each round cuts what the last one left: a few are plenty)
        if not left:
            break
        for task in left:
            task.cancel()
        _, left = await asyncio.wait(left, timeout=STOP_GRACE)
    for task in tasks:
        if not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]


def _unanswered(prepared: Prepared, group: HostGroup, timeout: float) -> None:
    """Give every recipient of ``group`` the server did not answer before the deadline a
    ``timeout`` finding (answers it did give, a 450 among them, are kept)."""
    host = group.hosts[0].name if group.hosts else None
    late = Finding(SmtpOutcome.TIMEOUT, f"no answer before the {timeout:g} s deadline", host)
    for rcpts in group.domains.values():
        for email in rcpts:
            if email not in prepared.findings:
                prepared.findings[email] = late
                prepared.late.add(email)


_SHARED_LOCK = threading.Lock()
_SHARED: dict[str, Engine] = {}


def shared_engine(settings: Settings) -> Engine:
    """The one engine of this process for ``settings``: concurrent runs (flow runs in the API
    process, or in one worker) share its resolver cache and per-host politeness limits."""
    key = settings.model_dump_json()
    with _SHARED_LOCK:
        engine = _SHARED.get(key)
        if engine is None:
            engine = _SHARED[key] = Engine(settings)
        return engine


def forget_engine(settings: Settings) -> None:
    """Close and drop the shared engine of ``settings`` (tests that change their world)."""
    with _SHARED_LOCK:
        engine = _SHARED.pop(settings.model_dump_json(), None)
    if engine is not None:
        engine.close()
