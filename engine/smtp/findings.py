"""What the SMTP prober hands out: a finding per recipient, the result and traffic of a
host group's run, and the host groups it is given (domains that share their mail servers)."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

from verimail.engine.dns_facts import MailHost
from verimail.schemas.outcomes import DIRECT_EGRESS as DIRECT
from verimail.schemas.outcomes import SmtpOutcome

_REPLY = re.compile(r"[2-5][0-9][0-9](?: |$)")  # as one_line writes a reply


def probe_address(domain: str, sender: str) -> str:
    """The made-up address that decides catch-all: random-looking, but the same for a
    (sender, domain) pair, so the retry of a greylisted probe asks about the same
    greylist triplet (a fresh random one would be greylisted anew at every try)."""
    digest = hashlib.sha256(f"verimail-probe\0{sender}\0{domain}".encode()).hexdigest()
    return f"vm-probe-{digest[:12]}@{domain}"


@dataclass(frozen=True)
class Finding:
    """What the mail host said about one recipient."""

    outcome: SmtpOutcome
    response: str | None = None  # the reply ("550 5.1.1 …"), or what happened instead
    host: str | None = None
    egress: str = DIRECT  # the egress it came through (set where it matters: a refusal)

    @property
    def reply(self) -> str | None:
        """``response`` when it is an SMTP reply, None when there was none (a timeout, a
        lost connection, a private MX not contacted): SPEC §2.2's ``smtp_response`` is null
        then, and our own wording (with the MX's address in it) is not passed off as the
        server's."""
        return self.response if self.response and _REPLY.match(self.response) else None


@dataclass
class HostGroup:
    """Domains whose MX hosts lead to the same servers, with the recipients to check on
    each; ``hosts`` are the first domain's (the names dialled)."""

    hosts: tuple[MailHost, ...]
    domains: dict[str, list[str]]  # domain -> recipient addresses (normalised, unique)
    probe_catch_all: bool = True
    # domain -> the egress it must leave through: a deferred retry's, that of its first try
    egresses: dict[str, str] = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, ...]:
        return tuple(h.name for h in self.hosts)

    def part(self, domains: dict[str, list[str]]) -> HostGroup:
        """The same hosts with only ``domains`` (those leaving through one egress)."""
        pins = {d: e for d, e in self.egresses.items() if d in domains}
        return HostGroup(self.hosts, domains, self.probe_catch_all, pins)

    @property
    def size(self) -> int:
        return sum(len(v) for v in self.domains.values()) + (
            len(self.domains) if self.probe_catch_all else 0
        )


def group_key(hosts: tuple[MailHost, ...], by_server: bool = True) -> tuple[object, ...]:
    """What the domains of one host group share: the servers their mail hosts lead to, in
    preference order (each host's addresses, as a set), so a shared host that gives every
    customer domain an MX name of its own, all resolving to one IP, carries them all in
    the same sessions (issue 33: one session per domain there, each paying the greeting).
    The group dials the first domain's host names; the servers are the same. ``by_server``
    false (``smtp_sessions_by_server``): the host names, as before."""
    if not by_server:
        return tuple(h.name for h in hosts)
    return tuple(tuple(sorted(set(h.addresses))) for h in hosts)


@dataclass
class SmtpStats:
    """What the prober did, for the engine's stats and the benchmarks."""

    sessions: int = 0
    rcpts: int = 0
    mail_from: int = 0
    retries: int = 0
    catch_all_probes: int = 0
    connect_failures: int = 0

    def add(self, other: SmtpStats) -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))


@dataclass
class GroupResult:
    findings: dict[str, Finding] = field(default_factory=dict)  # by recipient address
    catch_all: dict[str, bool | None] = field(default_factory=dict)  # by domain
    catch_all_findings: dict[str, Finding] = field(default_factory=dict)
    stats: SmtpStats = field(default_factory=SmtpStats)
