"""Can this installation verify over SMTP at all? The facts ``verimail doctor`` prints, and
``GET /api/health`` (``smtp_egress``) and ``/metrics`` show: the DNS resolver answers, the
HELO name resolves, and port 25 of a probe domain's mail server greets us through each
egress (``VERIMAIL_DOCTOR_DOMAIN``, default ``gmail.com``).

Most cloud machines cannot open outbound port 25; a verifier there answers every address
``unknown`` and nothing says why. Each failed check carries one sentence on what to do.
The checks are here, not in the CLI, so the API can run them in the background and show
the same facts (:class:`EgressMonitor`): a health answer never waits on SMTP.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import asdict, dataclass
from datetime import UTC, datetime

from verimail.config import Settings
from verimail.engine.dns_facts import DomainResolver, MailHost
from verimail.engine.netguard import connect_allowed
from verimail.engine.smtp.egress import Egress, configured_egresses
from verimail.engine.smtp.egress_kinds import kind_of
from verimail.engine.smtp.findings import SmtpStats
from verimail.engine.smtp.session import NoSession, connect
from verimail.schemas.outcomes import DomainOutcome, SmtpOutcome

log = logging.getLogger("verimail.engine.smtp.egress_check")

GREETING_TIMEOUT = 10.0
"""Seconds a mail server has to greet us through an egress (less if the settings say so)."""
EGRESS_DOC = "docs/egress.md"


@dataclass(frozen=True)
class Check:
    """One fact: what was checked, whether it holds, what was found, and what to do."""

    name: str  # "dns", "helo", or "smtp egress <name>"
    ok: bool
    detail: str
    advice: str | None = None  # one sentence, on failure
    egress: str | None = None  # for an SMTP check: the egress's name

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


async def check_resolver(settings: Settings, resolver: DomainResolver) -> Check:
    """The DNS resolver answers (the probe domain's MX lookup comes back at all)."""
    where = ", ".join(settings.dns_nameservers) or "the system resolver"
    facts = await resolver.facts(settings.doctor_domain)
    if facts.outcome is DomainOutcome.DNS_ERROR:
        return Check(
            "dns",
            False,
            f"{where} did not answer for {settings.doctor_domain}: {facts.detail}",
            "set VERIMAIL_DNS_NAMESERVERS to a resolver that answers (docs/settings.md).",
        )
    return Check("dns", True, f"{where} answers ({settings.doctor_domain}: {facts.outcome})")


async def check_helo(settings: Settings, resolver: DomainResolver, name: str) -> Check:
    """The HELO name resolves to an address: servers that check it refuse a name that
    does not (Postfix's reject_unknown_helo_hostname)."""
    addresses, failed = await resolver.addresses(name)
    if addresses:
        return Check("helo", True, f"{name} resolves to {', '.join(addresses[:3])}")
    why = "the lookup failed" if failed else "it has no A or AAAA record"
    return Check(
        "helo",
        False,
        f"the HELO name {name} does not resolve ({why})",
        "set VERIMAIL_SMTP_HELO_NAME to this machine's public name, with an A record and "
        f"a matching reverse DNS ({EGRESS_DOC}).",
    )


def _target(settings: Settings, hosts: tuple[MailHost, ...]) -> tuple[MailHost, str] | None:
    """The best MX host and its first address we may connect to."""
    for host in hosts:
        for address in host.addresses:
            if connect_allowed(address, settings.smtp_allow_networks):
                return host, address
    return None


async def check_egress(settings: Settings, resolver: DomainResolver, egress: Egress) -> Check:
    """Port 25 of the probe domain's best MX host greets us through ``egress`` in time."""
    name = f"smtp egress {egress.name}"
    domain = settings.doctor_domain
    facts = await resolver.facts(domain)
    target = _target(settings, facts.hosts) if facts.outcome is DomainOutcome.OK else None
    if target is None:
        return Check(
            name,
            False,
            f"{domain} has no mail host to try ({facts.detail or facts.outcome})",
            "set VERIMAIL_DOCTOR_DOMAIN to a domain that receives mail.",
            egress.name,
        )
    host, address = target
    timeout = min(settings.smtp_connect_timeout, GREETING_TIMEOUT)
    quick = settings.model_copy(update={"smtp_connect_timeout": timeout})
    where = f"{host.name} ({address}) port {settings.smtp_port}"
    try:
        smtp = await connect(quick, host, address, SmtpStats(), egress)
    except NoSession as failed:
        return _failed(name, egress, where, failed.finding.outcome, failed.finding.response)
    with contextlib.suppress(Exception):
        await asyncio.wait_for(smtp.quit(), 2)
    smtp.close()
    return Check(name, True, f"{where} greeted us via {egress.shown}", None, egress.name)


def _failed(name: str, egress: Egress, where: str, outcome: SmtpOutcome, said: str | None) -> Check:
    """A failed egress check, with the one sentence on what to do."""
    via = egress.shown
    kind = kind_of(egress)
    if outcome is SmtpOutcome.EGRESS_FAILED:
        advice = kind.failed_advice(egress, EGRESS_DOC)
    elif outcome is SmtpOutcome.EGRESS_BLOCKED:
        advice = (
            f"the server refuses this egress's IP address: ask the blocklist named to delist "
            f"it, or send through another egress ({EGRESS_DOC}#when-a-server-refuses-our-ip)."
        )
    elif outcome in (SmtpOutcome.TIMEOUT, SmtpOutcome.CONNECTION_FAILED):
        advice = kind.unreachable_advice(egress, EGRESS_DOC)
    else:
        advice = f"the server did not greet us normally; try again later ({EGRESS_DOC})."
    detail = f"{where} via {via}: {said or outcome.value}"
    return Check(name, False, detail, advice, egress.name)


async def run_checks(settings: Settings) -> list[Check]:
    """Every check, in the order ``verimail doctor`` prints them."""
    resolver = DomainResolver(settings)
    checks = [await check_resolver(settings, resolver)]
    egresses = configured_egresses(settings)
    for helo in dict.fromkeys(e.helo_name for e in egresses):
        checks.append(await check_helo(settings, resolver, helo))
    checks += await asyncio.gather(*(check_egress(settings, resolver, e) for e in egresses))
    return checks


def smtp_checks(checks: list[Check]) -> list[Check]:
    return [check for check in checks if check.egress is not None]


class EgressMonitor:
    """The API's view of the egress checks: run in the background every
    ``doctor_interval`` seconds, read from memory by health and metrics (never awaited
    there: an SMTP check may take its full greeting timeout)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.checks: list[Check] = []
        self.checked_at: str | None = None  # when the last round ended (ISO 8601, UTC)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None

    async def refresh(self) -> None:
        """One round of the SMTP checks (the DNS and HELO facts are doctor's)."""
        try:
            resolver = DomainResolver(self.settings)
            egresses = configured_egresses(self.settings)
            self.checks = list(
                await asyncio.gather(*(check_egress(self.settings, resolver, e) for e in egresses))
            )
        except Exception as exc:  # (a view: health goes on answering)
            log.warning("SMTP egress check failed: %s", exc)
        self.checked_at = datetime.now(UTC).isoformat()

    async def _loop(self) -> None:
        while True:
            await self.refresh()
            await asyncio.sleep(self.settings.doctor_interval)

    def summary(self) -> dict[str, object]:
        """``smtp_egress`` of the health answer: ``ok`` null until the first round ends."""
        if self.checked_at is None:
            return {"ok": None, "checked_at": None, "egresses": []}
        return {
            "ok": all(check.ok for check in self.checks),
            "checked_at": self.checked_at,
            "egresses": [
                {"name": c.egress, "ok": c.ok, "detail": c.detail, "advice": c.advice}
                for c in self.checks
            ],
        }
