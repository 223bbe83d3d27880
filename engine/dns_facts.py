"""Domain facts: where mail for a domain goes, resolved once and cached for the TTL.

Rules:

- MX records by preference; an RFC 7505 null MX (``0 .``) means the domain takes no mail.
- No MX but an A/AAAA record: the domain itself is the mail host (RFC 5321 §5.1).
- NXDOMAIN: the domain does not exist (invalid). SERVFAIL or a timeout: unknown, never
  invalid — a flaky nameserver must not make good addresses look bad.
- MX targets with no address are skipped; none left means no mail host (invalid).

The cache is process-wide and shared by every caller and event loop; concurrent lookups
of one name inside a loop share a single query. It holds at most ``MAX_CACHE_ENTRIES``
answers: a long-running process fed millions of distinct (say, random) domains sweeps
expired answers out and then forgets the oldest, instead of growing without limit.
"""

from __future__ import annotations

import asyncio
import threading
import time
import weakref
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import dns.asyncresolver
import dns.exception
import dns.nameserver
import dns.rdatatype
import dns.resolver

from verimail.config import Settings
from verimail.engine import metrics
from verimail.schemas.outcomes import DomainOutcome

MAX_MX_HOSTS = 10  # a domain with thousands of MX records gets its best ten tried
MAX_MX_LOOKUPS = 50  # MX names looked up at most, ten at a time, while none has an address
MIN_TTL, MAX_TTL = 5.0, 86_400.0  # a 0 TTL still serves one job; a huge one expires daily
NEGATIVE_TTL = 60.0  # NXDOMAIN / no-data answers at most (their SOA may say less)
ERROR_TTL = 0.0  # SERVFAIL and timeouts are never cached: the next call asks again
MAX_CACHE_ENTRIES = 200_000  # (name, type) answers kept; a few hundred bytes each


@dataclass(frozen=True)
class MailHost:
    """One MX target with its addresses (IPv4 first)."""

    name: str
    preference: int
    addresses: tuple[str, ...]


@dataclass(frozen=True)
class DomainFacts:
    """What DNS says about a domain's mail routing."""

    domain: str
    outcome: DomainOutcome
    mx_records: tuple[str, ...] = ()  # MX target names by preference, as published
    hosts: tuple[MailHost, ...] = ()  # targets that have addresses, by preference
    implicit_mx: bool = False
    detail: str = ""  # why, for reasons and logs


@dataclass
class DnsStats:
    """Queries a caller caused (cache hits are not queries)."""

    queries: int = 0
    by_type: dict[str, int] = field(default_factory=dict)

    def count(self, rdtype: str) -> None:
        self.queries += 1
        self.by_type[rdtype] = self.by_type.get(rdtype, 0) + 1


@dataclass(frozen=True)
class _Lookup:
    """A cached answer to one (name, type) query."""

    status: str  # "ok" | "nxdomain" | "nodata" | "error"
    records: tuple[Any, ...] = ()
    detail: str = ""


_CACHE: dict[tuple[Any, ...], tuple[float, _Lookup]] = {}
_CACHE_LOCK = threading.Lock()
_INFLIGHT: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple, asyncio.Future]] = (
    weakref.WeakKeyDictionary()
)


def _store(key: tuple[Any, ...], expires: float, result: _Lookup) -> None:
    """Cache one answer, keeping the cache within ``MAX_CACHE_ENTRIES``."""
    with _CACHE_LOCK:
        if key not in _CACHE and len(_CACHE) >= MAX_CACHE_ENTRIES:
            now = time.monotonic()
            for old in [k for k, (deadline, _) in _CACHE.items() if deadline <= now]:
                del _CACHE[old]
            # Still full of live answers: forget the oldest tenth (dicts keep insertion order).
            excess = len(_CACHE) - MAX_CACHE_ENTRIES + max(1, MAX_CACHE_ENTRIES // 10)
            for old in list(_CACHE)[: max(excess, 0)]:
                del _CACHE[old]
        _CACHE[key] = (expires, result)


def clear_cache() -> None:
    """Forget every cached answer (tests that change the DNS world between runs)."""
    with _CACHE_LOCK:
        _CACHE.clear()


def _make_resolver(settings: Settings) -> dns.asyncresolver.Resolver:
    if settings.dns_nameservers:
        resolver = dns.asyncresolver.Resolver(configure=False)
        resolver.nameservers = [
            dns.nameserver.Do53Nameserver(host, port)
            for host, port in settings.nameserver_addresses()
        ]
    else:
        resolver = dns.asyncresolver.Resolver()
    resolver.lifetime = settings.dns_timeout
    # Each server gets its share of the budget: with the whole of it, a first server that
    # drops queries used it all up and the next one was never asked.
    resolver.timeout = settings.dns_timeout / max(1, len(resolver.nameservers))
    resolver.retry_servfail = False
    resolver.cache = None
    return resolver


def _clamped(ttl: float) -> float:
    return min(max(ttl, MIN_TTL), MAX_TTL)


def _negative_ttl(nxdomain: dns.resolver.NXDOMAIN) -> float:
    """How long an NXDOMAIN may be cached: the zone's SOA says (RFC 2308), at most
    :data:`NEGATIVE_TTL`; a domain registered a moment ago is then seen soon."""
    ttl = NEGATIVE_TTL
    for response in nxdomain.responses().values():
        try:
            ttl = min(ttl, float(response.resolve_chaining().minimum_ttl))
        except Exception:  # a malformed response keeps the default
            continue
    return _clamped(ttl)


def _settled(inflight: dict[tuple, asyncio.Future], key: tuple, task: asyncio.Future) -> None:
    """A shared lookup ended: later callers ask again (or hit the cache). Its error is
    marked retrieved, since every caller may have left already."""
    if inflight.get(key) is task:
        del inflight[key]
    if not task.cancelled():
        task.exception()


class DomainResolver:
    """Resolves domain facts with the shared cache; one per settings object is enough."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._resolver = _make_resolver(settings)
        self._scope = tuple(settings.dns_nameservers)  # answers differ per nameserver set

    async def facts(self, domain: str, stats: DnsStats | None = None) -> DomainFacts:
        """The mail routing of ``domain`` (ASCII, lower-case)."""
        mx = await self._lookup(domain, "MX", stats)
        if mx.status == "nxdomain":
            return DomainFacts(domain, DomainOutcome.NXDOMAIN, detail=mx.detail)
        if mx.status == "error":
            return DomainFacts(domain, DomainOutcome.DNS_ERROR, detail=mx.detail)
        if mx.status == "nodata" or not mx.records:
            return await self._implicit_mx(domain, stats)

        records = sorted(mx.records, key=lambda r: (r[0], r[1]))
        real = [(pref, name) for pref, name in records if name not in ("", ".")]
        names = tuple(name or "." for _, name in records)
        if not real:
            return DomainFacts(
                domain,
                DomainOutcome.NULL_MX,
                mx_records=names,
                detail="The domain publishes a null MX record: it accepts no mail.",
            )
        # The best MAX_MX_HOSTS targets are looked up; only when none of them has an
        # address are the next ones (a working host at preference 50 behind ten dead ones
        # is still a mail host), up to MAX_MX_LOOKUPS names in all.
        errors = False
        looked = 0
        hosts: tuple[MailHost, ...] = ()
        while not hosts and looked < min(len(real), MAX_MX_LOOKUPS):
            batch = real[looked : looked + MAX_MX_HOSTS]
            looked += len(batch)
            found = await asyncio.gather(*(self._host(name, pref, stats) for pref, name in batch))
            hosts = tuple(host for host, _ in found if host.addresses)
            errors = errors or any(err for _, err in found)
        mx_names = tuple(name for _, name in real[: max(looked, MAX_MX_HOSTS)])
        if hosts:
            return DomainFacts(domain, DomainOutcome.OK, mx_records=mx_names, hosts=hosts)
        if looked < len(real):
            return DomainFacts(
                domain,
                DomainOutcome.DNS_ERROR,
                mx_records=mx_names,
                detail=f"None of the first {looked} of the domain's {len(real)} MX hosts has "
                "an address; the others were not looked up.",
            )
        if errors:
            return DomainFacts(
                domain,
                DomainOutcome.DNS_ERROR,
                mx_records=mx_names,
                detail="The addresses of the domain's mail servers could not be looked up.",
            )
        return DomainFacts(
            domain,
            DomainOutcome.NO_MAIL_HOST,
            mx_records=mx_names,
            detail="None of the domain's MX hosts has an address.",
        )

    async def addresses(self, name: str) -> tuple[tuple[str, ...], bool]:
        """``name``'s addresses (A, then AAAA) and whether a lookup failed, with the resolver
        and cache the mail hosts use: for names that are no mail domain (a webhook's host,
        ``verimail doctor``'s HELO name)."""
        host, failed = await self._host(name.lower().rstrip("."), 0, None)
        return host.addresses, failed

    async def _implicit_mx(self, domain: str, stats: DnsStats | None) -> DomainFacts:
        host, error = await self._host(domain, 0, stats)
        if host.addresses:
            return DomainFacts(domain, DomainOutcome.OK, hosts=(host,), implicit_mx=True)
        if error:
            return DomainFacts(
                domain, DomainOutcome.DNS_ERROR, detail="The domain's address lookup failed."
            )
        return DomainFacts(
            domain,
            DomainOutcome.NO_MAIL_HOST,
            detail="The domain has neither MX records nor an address.",
        )

    async def _host(
        self, name: str, preference: int, stats: DnsStats | None
    ) -> tuple[MailHost, bool]:
        """A host's addresses (A then AAAA) and whether a lookup failed."""
        a, aaaa = await asyncio.gather(
            self._lookup(name, "A", stats), self._lookup(name, "AAAA", stats)
        )
        addresses = tuple(dict.fromkeys(a.records + aaaa.records))
        failed = a.status == "error" or aaaa.status == "error"
        return MailHost(name, preference, addresses), failed

    async def _lookup(self, name: str, rdtype: str, stats: DnsStats | None) -> _Lookup:
        key = (self._scope, name.lower().rstrip("."), rdtype)
        now = time.monotonic()
        with _CACHE_LOCK:
            hit = _CACHE.get(key)
        if hit and hit[0] > now:
            return hit[1]
        loop = asyncio.get_running_loop()
        inflight = _INFLIGHT.setdefault(loop, {})
        pending = inflight.get(key)
        if pending is None:
            # The query is a task of its own that every caller awaits through a shield:
            # a caller that is cancelled (a request that timed out) leaves the others
            # their answer instead of handing them its cancellation.
            if stats is not None:
                stats.count(rdtype)
            pending = inflight[key] = loop.create_task(self._fetch(key, rdtype))
            pending.add_done_callback(partial(_settled, inflight, key))
        return await asyncio.shield(pending)

    async def _fetch(self, key: tuple, rdtype: str) -> _Lookup:
        result, ttl = await self._query(key[1], rdtype)
        metrics.DNS_QUERIES.labels(type=rdtype, outcome=result.status).inc()
        if ttl > 0:
            _store(key, time.monotonic() + ttl, result)
        return result

    async def _query(self, name: str, rdtype: str) -> tuple[_Lookup, float]:
        try:
            answer = await self._resolver.resolve(
                name, rdtype, raise_on_no_answer=False, search=False
            )
        except dns.resolver.NXDOMAIN as nxdomain:
            missing = _Lookup("nxdomain", detail="The domain does not exist (NXDOMAIN).")
            return missing, _negative_ttl(nxdomain)
        except dns.resolver.NoNameservers:
            return _Lookup("error", detail="The domain's nameservers failed (SERVFAIL)."), ERROR_TTL
        except dns.exception.Timeout:
            return _Lookup("error", detail="The DNS lookup timed out."), ERROR_TTL
        except dns.exception.DNSException as exc:
            return _Lookup("error", detail=f"The DNS lookup failed: {type(exc).__name__}."), 0.0
        # (the smallest TTL along the CNAME chain; for no data, the zone's SOA: RFC 2308)
        ttl = float(answer.chaining_result.minimum_ttl)
        if answer.rrset is None:
            return _Lookup("nodata"), _clamped(min(ttl, NEGATIVE_TTL))
        ttl = _clamped(ttl)
        if rdtype == "MX":
            records = tuple(
                (int(r.preference), r.exchange.to_text(omit_final_dot=True).lower())
                for r in answer.rrset
            )
        else:
            records = tuple(r.to_text() for r in answer.rrset)
        return _Lookup("ok", records), ttl
