"""Where SMTP sessions leave from: directly, or through a SOCKS5 proxy (docs/egress.md).

Most cloud machines cannot open outbound port 25, so sessions may go out through SOCKS5
proxies (RFC 1928, with RFC 1929 user name and password), several of them chosen by MX host
(``VERIMAIL_SMTP_EGRESS_FILE``). verimail resolves the MX hosts itself and asks the proxy
for the *address*: the private-range guard (:mod:`verimail.engine.netguard`) has decided on
it before the proxy is asked, so a proxy is never asked for an internal address that the
guard refuses.

The choice of an egress among a route's equal ones is a weighted rendezvous hash of the
recipient's domain: the same domain goes out through the same egress on every pass, so a
greylisted address is asked again from the client address that was greylisted (greylisting
keys on the client IP), and adding an egress moves only its share of the domains.

How a session's socket leaves is its egress's kind, a module each
(:mod:`verimail.engine.smtp.egress_kinds`: direct, SOCKS5); this module holds what all kinds
share: the egresses, the routes choosing one, and the password kept out of everything shown.
"""

from __future__ import annotations

import fnmatch
import hashlib
import math
import socket
from dataclasses import dataclass, field

from verimail.config import EgressFile, Settings, mask_proxy_url
from verimail.engine.smtp.egress_kinds import kind_of
from verimail.engine.smtp.egress_kinds.direct import DIRECT

PROXY = "proxy"
"""The name of the one egress of ``VERIMAIL_SMTP_PROXY``."""


@dataclass(frozen=True)
class Egress:
    """One way out for SMTP sessions, and the identity they present there."""

    name: str  # "direct" when no proxy is configured
    proxy_url: str | None = field(repr=False)  # "socks5://[user:password@]host:port"; None = direct
    helo_name: str  # must be a fully qualified name (checked at start-up)
    mail_from: str | None = None
    max_sessions_per_host: int | None = None  # None = the global setting

    @property
    def shown(self) -> str:
        """The URL with the password masked: for logs, health, the CLI and errors."""
        return mask_proxy_url(self.proxy_url) if self.proxy_url else DIRECT

    def __repr__(self) -> str:
        return f"Egress(name={self.name!r}, via={self.shown!r}, helo_name={self.helo_name!r})"

    def sender(self, settings: Settings) -> str:
        """The envelope sender of sessions through this egress."""
        return self.mail_from or settings.smtp_mail_from

    def session_cap(self, settings: Settings) -> int:
        """Sessions at once per server IP through this egress."""
        return self.max_sessions_per_host or settings.smtp_max_sessions_per_host

    def slot_key(self, address: str) -> str:
        """The politeness slot of ``address`` through this egress: each egress is its own
        source address, so caps hold per (egress, server IP). The direct egress keeps the
        server's address alone (the key every session had before egresses)."""
        return address if self.name == DIRECT else f"{address}@{self.name}"


def configured_egresses(settings: Settings) -> tuple[Egress, ...]:
    """Every egress the settings name: those of the egress file, else one through
    ``VERIMAIL_SMTP_PROXY``, else the direct one."""
    return Routes.from_settings(settings).egresses


async def open_socket(egress: Egress, ip: str, port: int, timeout: float) -> socket.socket | None:
    """A socket connected through ``egress`` to ``ip``:``port``, opened by its kind
    (:mod:`verimail.engine.smtp.egress_kinds`); None for a direct egress (the caller dials).
    :class:`~verimail.engine.smtp.egress_kinds.failed.EgressFailed` for a fault of the
    way out itself."""
    return await kind_of(egress).open_socket(egress, ip, port, timeout)


@dataclass(frozen=True)
class Route:
    """MX hosts matching one of ``patterns`` go out through ``weights``' egresses."""

    patterns: tuple[str, ...]
    weights: tuple[tuple[str, float], ...]

    def matches(self, mx_host: str) -> bool:
        name = mx_host.rstrip(".").lower()
        return any(fnmatch.fnmatchcase(name, p.lower()) for p in self.patterns)


@dataclass(frozen=True)
class Routes:
    """The egresses and the rules choosing one per (MX host, domain)."""

    egresses: tuple[Egress, ...]
    rules: tuple[Route, ...] = ()
    default: tuple[tuple[str, float], ...] = ()

    @classmethod
    def from_settings(cls, settings: Settings) -> Routes:
        routes = settings.egress_routes
        if routes is not None:
            return cls.from_file(routes)
        proxy = settings.smtp_proxy.get_secret_value() if settings.smtp_proxy else None
        egress = Egress(PROXY if proxy else DIRECT, proxy, settings.smtp_helo_name)
        return cls((egress,), default=((egress.name, 1.0),))

    @classmethod
    def from_file(cls, spec: EgressFile) -> Routes:
        egresses = []
        for item in spec.egresses:
            url = item.url.get_secret_value().strip()
            egresses.append(
                Egress(
                    item.name,
                    None if url.lower() == DIRECT else url,
                    item.helo_name,
                    item.mail_from,
                    item.max_sessions_per_host,
                )
            )
        rules = tuple(Route(tuple(rule.match), tuple(rule.use.items())) for rule in spec.routes)
        default = tuple((spec.default or {egresses[0].name: 1.0}).items())
        return cls(tuple(egresses), rules, default)

    def by_name(self, name: str) -> Egress | None:
        return next((e for e in self.egresses if e.name == name), None)

    def choose(self, mx_hosts: tuple[str, ...], domain: str) -> Egress:
        """The egress for ``domain``'s sessions to ``mx_hosts`` (by preference): the first
        rule that matches one of the hosts, else the default route; among its egresses,
        the weighted rendezvous winner for the domain (the same one on every pass)."""
        return self.ranked(mx_hosts, domain)[0]

    def ranked(self, mx_hosts: tuple[str, ...], domain: str) -> tuple[Egress, ...]:
        """The egresses of the route :meth:`choose` takes, its winner first, then the next
        best for the domain: where a server refuses the winner's IP (``egress_blocked``),
        the addresses go out through the next one."""
        weights = self.default
        for rule in self.rules:
            if any(rule.matches(host) for host in mx_hosts):
                weights = rule.weights
                break
        order = sorted(weights, key=lambda item: -_score(item[0], item[1], domain))
        return tuple(self._named(name) for name, _ in order)

    def split(
        self,
        mx_hosts: tuple[str, ...],
        domains: dict[str, list[str]],
        pinned: dict[str, str] | None = None,
    ) -> dict[Egress, dict[str, list[str]]]:
        """``domains`` (of one host group) by the egress each leaves through: the one
        ``pinned`` names (a retry's first try's) while it is still configured, else the
        routes' choice."""
        parts: dict[Egress, dict[str, list[str]]] = {}
        for domain, rcpts in domains.items():
            egress = self.by_name(pinned[domain]) if pinned and domain in pinned else None
            parts.setdefault(egress or self.choose(mx_hosts, domain), {})[domain] = rcpts
        return parts

    def _named(self, name: str) -> Egress:
        egress = self.by_name(name)
        assert egress is not None, name  # (the settings checked every route's names)
        return egress


def _score(name: str, weight: float, domain: str) -> float:
    """Weighted rendezvous hashing: the highest score wins, each egress in proportion to
    its weight, and the winner for a domain changes only when its winner goes."""
    digest = hashlib.sha256(f"{name}\0{domain.lower()}".encode()).digest()
    unit = (int.from_bytes(digest[:8], "big") + 1) / (2**64 + 1)  # in (0, 1)
    return -weight / math.log(unit)
