"""A declarative mail world: domains, MX records and scripted SMTP host behaviours.

Why one long file: a host's behaviours are one list of knobs, documented where they are
declared, and the world reads and writes them all (Python or YAML) in one place.

The world is plain data so that tests, the demo and the benchmarks describe what they need in a
few lines (Python or YAML) and the servers in ``dns_server`` / ``smtp_server`` only interpret it.
Names are case-insensitive and stored lower-case without a trailing dot.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

NULL_MX = "."
"""Target of an RFC 7505 null MX (``0 .``): the domain accepts no mail at all."""

Expected = Literal["valid", "invalid", "catchall"]


def normalise_name(name: str) -> str:
    """Lower-case a DNS name and drop the trailing dot (the root stays ``.``)."""
    name = name.strip().lower()
    if name == NULL_MX:
        return name
    return name.rstrip(".")


def is_ip_literal(text: str) -> bool:
    """True when ``text`` is an IPv4/IPv6 address rather than a host name."""
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


HOSTILE_MODES: dict[str, str] = {
    "silent": "accepts the connection, then never sends a byte",
    "garbage_banner": "greets with a line whose code is not a number",
    "huge_banner": "a single-line banner of hostile_bytes bytes",
    "endless_line": "streams bytes without ever sending CRLF (up to hostile_bytes)",
    "endless_multiline": "a 220- continuation banner that never ends, a line per interval",
    "rcpt_code_999": "answers RCPT TO with the out-of-range code 999",
    "rcpt_code_garbage": "answers RCPT TO with a line whose code is not a number",
    "mute_after_ehlo": "greets and answers EHLO, then never answers another command",
    "reset_mid_rcpt": "resets the connection (TCP RST) on RCPT TO",
    "reset_at_greeting": "resets the connection (TCP RST) before any banner",
}
"""Protocol-breaking behaviours of ``HostBehaviour.hostile``, with what each does."""


@dataclass
class HostBehaviour:
    """How one SMTP server answers; every field defaults to a plain, well-behaved MTA.

    - ``mailboxes``: local parts (any domain) or full addresses, case-insensitive, that get 250;
      every other recipient gets 550 5.1.1 unless ``accept_all`` (a catch-all host).
    - ``greylist_tries``: the first N RCPTs of each (sender, recipient) pair get 450, counted
      across sessions for the testbed's lifetime.
    - ``greylist_delay`` (seconds, postgrey's ``--delay``): postgrey's rule instead, per
      (client IP, sender, recipient) triplet: 450 until ``greylist_delay`` seconds after its
      first try; a retry after that and within ``greylist_window`` seconds of the first try
      (postgrey's ``--retry-window``) is accepted and the triplet passes from then on; a retry
      after the window counts as a new first try (450 again).
    - ``full_mailboxes``: 552 5.2.2, or ``full_reply`` (Gmail's ``452 4.2.2 … over quota``);
      they exist, so they need not be in ``mailboxes`` too.
    - ``block``: 554 5.7.1 to every RCPT, as after a block-list hit.
    - ``reply_delay``: seconds before every reply, banner included; ``tarpit_delay``: more
      seconds before every reply once a session has ``tarpit_after_rejections`` rejections
      (1: from the first; Postfix's soft error limit is 10, see :func:`postfix_limits`).
    - ``greeting_delay``: more seconds before the banner, on top of ``reply_delay`` (a
      server that greets slowly, as busy shared hosts and anti-spam front ends do).
    - ``disconnect_after_rejections``: after the Nth rejection in a session, 421 and close.
    - ``max_rcpts_per_session``: RCPTs beyond N in one connection get 452 4.5.3, or
      ``too_many_reply`` (Gmail: ``452 4.5.3 Your message has too many recipients …``).
    - ``one_domain_per_transaction``: a RCPT for another domain than the transaction's
      first recipient gets 550 5.7.1 (a server that will not mix domains in one message).
    - ``refuse_connections``: nothing listens (connection refused); ``greeting_421``: the
      banner is a 421 and the server closes.
    - ``max_connections``: a connection beyond N open at once gets a 421 banner ("too many
      connections from your IP", as Exim or Microsoft 365 answer) and is closed. Counted as
      connections arrive; the ones turned away do not count.
    - ``starttls`` / ``pipelining``: advertise (and do) STARTTLS with a self-signed certificate,
      advertise PIPELINING (pipelined commands are always answered in order).
    - ``greeting_reply``: a banner that refuses the session (``554 5.3.2 … not accepting
      connections``), then the server closes; ``greeting_421`` is the 421 case.
    - ``smtputf8``: advertise SMTPUTF8 (non-ASCII addresses); off, as older servers are.
    - ``helo_reply``: the reply to every ``EHLO`` and ``HELO`` (``554 5.7.1 … Helo command
      rejected``).
    - ``starttls_reply``: with ``starttls``, the reply to ``STARTTLS`` instead of the
      handshake (``454 4.7.0 TLS not available``); the session goes on in plain text.
    - ``mail_from_reply``: the reply to every ``MAIL FROM`` instead of 250 (a refused sender,
      as Postfix's ``reject_unknown_sender_domain`` answers).
    - ``rcpt_replies``: local parts or full addresses (case-insensitive) → the reply to their
      ``RCPT TO``, before every rule but the recipient limit (``452 4.2.2 … over quota``).
    - ``unknown_reply``: the reply to a recipient that is no mailbox, instead of Postfix's
      ``550 5.1.1 … User unknown`` (Microsoft 365 says ``550 5.4.1 Recipient address
      rejected: Access denied``); ``{addr}`` in it is the recipient.
    - ``blocklisted_clients``: client networks (``127.0.0.0/8``, ``127.0.0.1/32``) this
      listener refuses as a blocklist hit on the *client's* IP, at ``blocklist_stage``:
      ``greeting`` (a ``554 5.7.1 … blocked using zen.spamhaus.org`` banner, then close, as
      postscreen answers) or ``rcpt`` (the same text to every ``RCPT TO``, as Postfix's
      ``reject_rbl_client``). Per client, so one egress can be listed and another not.
      ``blocklist_reply`` is a provider's own text instead (Microsoft's ``550 5.7.708 …
      traffic not accepted from this IP``, Gmail's ``421 4.7.0 … unusual rate``); ``{ip}``
      in it is the client's address.
    - ``hostile``: a server that breaks the protocol on purpose (see ``HOSTILE_MODES``), for
      the hardening tests; ``hostile_bytes`` caps what a streaming mode sends (the
      banner's size for ``huge_banner``) and ``hostile_interval`` paces its lines.
    """

    mailboxes: set[str] = field(default_factory=set)
    accept_all: bool = False
    greylist_tries: int = 0
    greylist_delay: float | None = None
    greylist_window: float = 2 * 24 * 3600.0
    full_mailboxes: set[str] = field(default_factory=set)
    full_reply: str | None = None
    block: bool = False
    reply_delay: float = 0.0
    tarpit_delay: float = 0.0
    tarpit_after_rejections: int = 1
    greeting_delay: float = 0.0
    disconnect_after_rejections: int | None = None
    max_rcpts_per_session: int | None = None
    too_many_reply: str | None = None
    one_domain_per_transaction: bool = False
    refuse_connections: bool = False
    greeting_421: bool = False
    max_connections: int | None = None
    starttls: bool = False
    pipelining: bool = False
    smtputf8: bool = True
    greeting_reply: str | None = None
    helo_reply: str | None = None
    starttls_reply: str | None = None
    mail_from_reply: str | None = None
    rcpt_replies: dict[str, str] = field(default_factory=dict)
    unknown_reply: str | None = None
    blocklisted_clients: list[str] = field(default_factory=list)
    blocklist_stage: Literal["greeting", "rcpt"] = "rcpt"
    blocklist_reply: str | None = None
    hostile: str | None = None
    hostile_bytes: int = 10 * 1024 * 1024
    hostile_interval: float = 0.0

    def __post_init__(self) -> None:
        # Matching is case-insensitive: store lower-case once instead of at every RCPT.
        self.mailboxes = {m.strip().lower() for m in self.mailboxes}
        self.full_mailboxes = {m.strip().lower() for m in self.full_mailboxes}
        self.rcpt_replies = {k.strip().lower(): v for k, v in self.rcpt_replies.items()}
        if self.greylist_delay is not None and not 0 <= self.greylist_delay < self.greylist_window:
            raise ValueError("greylist_delay must be at least 0 and less than greylist_window")
        self.blocklisted_clients = [
            str(ipaddress.ip_network(net, strict=False)) for net in self.blocklisted_clients
        ]
        if self.blocklist_stage not in ("greeting", "rcpt"):
            raise ValueError("blocklist_stage must be 'greeting' or 'rcpt'")
        if self.hostile is not None and self.hostile not in HOSTILE_MODES:
            raise ValueError(f"hostile: {self.hostile!r} is not one of {sorted(HOSTILE_MODES)}")

    @staticmethod
    def _matches(boxes: set[str], address: str) -> bool:
        address = address.lower()
        local = address.rpartition("@")[0] if "@" in address else address
        return address in boxes or local in boxes

    def has_mailbox(self, address: str) -> bool:
        """Is ``address`` (or its local part) one of the known mailboxes (full ones included)?"""
        return self._matches(self.mailboxes, address) or self._matches(self.full_mailboxes, address)

    def blocklists(self, client_ip: str | None, stage: str) -> bool:
        """Is ``client_ip`` on this listener's blocklist, refused at ``stage``?"""
        if stage != self.blocklist_stage or not client_ip or not self.blocklisted_clients:
            return False
        ip = ipaddress.ip_address(client_ip)
        return any(ip in ipaddress.ip_network(net) for net in self.blocklisted_clients)

    def scripted_reply(self, address: str) -> str | None:
        """The ``rcpt_replies`` entry for ``address`` (or its local part), if any."""
        address = address.lower()
        local = address.rpartition("@")[0] if "@" in address else address
        return self.rcpt_replies.get(address, self.rcpt_replies.get(local))

    def is_full(self, address: str) -> bool:
        """Is ``address`` (or its local part) a mailbox that is over quota?"""
        return self._matches(self.full_mailboxes, address)


POSTFIX_SOFT_ERROR_LIMIT = 10  # smtpd_soft_error_limit: replies slow down from here
POSTFIX_HARD_ERROR_LIMIT = 20  # smtpd_hard_error_limit: 421 and the session is dropped
POSTFIX_ERROR_SLEEP = 1.0  # smtpd_error_sleep_time, seconds


def postfix_limits(**fields: Any) -> HostBehaviour:
    """A host with Postfix's default error limits: from the 10th rejection of a session
    every reply waits a second, at the 20th it answers 421 and hangs up."""
    return HostBehaviour(
        tarpit_delay=POSTFIX_ERROR_SLEEP,
        tarpit_after_rejections=POSTFIX_SOFT_ERROR_LIMIT,
        disconnect_after_rejections=POSTFIX_HARD_ERROR_LIMIT,
        **fields,
    )


@dataclass
class HostSpec:
    """One mail host: a DNS name, and either a behaviour (a server runs) or a fixed address."""

    name: str
    behaviour: HostBehaviour = field(default_factory=HostBehaviour)
    address: str | None = None

    def __post_init__(self) -> None:
        self.name = normalise_name(self.name)
        if self.address is not None:
            self.address = str(ipaddress.ip_address(self.address))

    @property
    def runs_server(self) -> bool:
        """A host with a fixed address (e.g. SSRF targets) or refusing connections runs none."""
        return self.address is None and not self.behaviour.refuse_connections


@dataclass
class DomainSpec:
    """One mail domain's DNS records.

    ``mx`` holds (preference, host name) pairs; ``(0, ".")`` is a null MX. ``a`` holds host names
    or literal IPs the domain's own A/AAAA records point to (the implicit MX when ``mx`` is empty).
    ``dns_delay``/``ttl`` of None fall back to the world's values. ``cname`` makes the name an
    alias: every query for it is answered with that CNAME (and the chain it starts, loops
    included, as far as the server follows it), whatever the other fields say.
    """

    name: str
    mx: list[tuple[int, str]] = field(default_factory=list)
    a: list[str] = field(default_factory=list)
    txt: list[str] = field(default_factory=list)
    servfail: bool = False
    dns_delay: float | None = None
    ttl: int | None = None
    cname: str | None = None

    def __post_init__(self) -> None:
        self.name = normalise_name(self.name)
        self.mx = [(int(pref), normalise_name(host)) for pref, host in self.mx]
        self.a = [a if is_ip_literal(a) else normalise_name(a) for a in self.a]
        if self.cname is not None:
            self.cname = normalise_name(self.cname)

    @property
    def is_null_mx(self) -> bool:
        """RFC 7505: a single ``0 .`` MX record."""
        return any(host == NULL_MX for _, host in self.mx)


@dataclass
class World:
    """The whole simulated world; names not in ``domains`` or ``hosts`` do not exist (NXDOMAIN)."""

    hosts: dict[str, HostSpec] = field(default_factory=dict)
    domains: dict[str, DomainSpec] = field(default_factory=dict)
    dns_delay: float = 0.0
    dns_ttl: int = 300

    def __post_init__(self) -> None:
        # Re-key by normalised name so lookups never depend on how the caller spelled a name.
        self.hosts = {h.name: h for h in self.hosts.values()}
        self.domains = {d.name: d for d in self.domains.values()}

    @classmethod
    def of(
        cls,
        hosts: Iterable[HostSpec] = (),
        domains: Iterable[DomainSpec] = (),
        *,
        dns_delay: float = 0.0,
        dns_ttl: int = 300,
    ) -> World:
        """Build a world from lists (tests read better without the name-keyed dicts)."""
        return cls(
            hosts={h.name: h for h in hosts},
            domains={d.name: d for d in domains},
            dns_delay=dns_delay,
            dns_ttl=dns_ttl,
        )

    # ------------------------------------------------------------------ dict / YAML form
    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> World:
        """Parse the YAML/JSON form (see ``data/worlds/demo.yaml``); unknown keys are errors."""
        _check_keys("world", data, {"hosts", "domains", "dns_delay", "dns_ttl"})
        hosts = [_host_from(name, spec) for name, spec in _named_items(data.get("hosts"), "host")]
        domains = [
            _domain_from(name, spec) for name, spec in _named_items(data.get("domains"), "domain")
        ]
        return cls.of(
            hosts,
            domains,
            dns_delay=float(data.get("dns_delay", 0.0) or 0.0),
            dns_ttl=int(data.get("dns_ttl", 300)),
        )

    def to_dict(self) -> dict[str, Any]:
        """The inverse of ``from_dict`` (non-default fields only), e.g. to write a YAML file."""
        hosts: dict[str, Any] = {}
        for host in self.hosts.values():
            entry: dict[str, Any] = {}
            defaults = HostBehaviour()
            for f in dataclasses.fields(HostBehaviour):
                value = getattr(host.behaviour, f.name)
                if value != getattr(defaults, f.name):
                    entry[f.name] = sorted(value) if isinstance(value, set) else value
            if host.address is not None:
                entry["address"] = host.address
            hosts[host.name] = entry
        domains: dict[str, Any] = {}
        for dom in self.domains.values():
            entry = {}
            if dom.mx:
                entry["mx"] = [[pref, host] for pref, host in dom.mx]
            for key in ("a", "txt"):
                if getattr(dom, key):
                    entry[key] = list(getattr(dom, key))
            if dom.servfail:
                entry["servfail"] = True
            for key in ("dns_delay", "ttl", "cname"):
                if getattr(dom, key) is not None:
                    entry[key] = getattr(dom, key)
            domains[dom.name] = entry
        return {
            "dns_delay": self.dns_delay,
            "dns_ttl": self.dns_ttl,
            "hosts": hosts,
            "domains": domains,
        }

    # ------------------------------------------------------------------ helpers
    def host(self, name: str) -> HostSpec | None:
        """The host called ``name`` (any case, trailing dot allowed), if any."""
        return self.hosts.get(normalise_name(name))

    def domain(self, name: str) -> DomainSpec | None:
        """The domain called ``name`` (any case, trailing dot allowed), if any."""
        return self.domains.get(normalise_name(name))


def load_world(path: str | Path) -> World:
    """Read a world from a YAML file."""
    with open(path, encoding="utf-8") as fh:
        data = yaml.safe_load(fh) or {}
    if not isinstance(data, Mapping):
        raise ValueError(f"{path}: a world file must be a mapping")
    return World.from_dict(data)


# ---------------------------------------------------------------------- parsing helpers
_BEHAVIOUR_FIELDS = {f.name for f in dataclasses.fields(HostBehaviour)}
_DOMAIN_FIELDS = {"mx", "a", "txt", "servfail", "dns_delay", "ttl", "cname"}


def _check_keys(what: str, data: Mapping[str, Any], allowed: set[str]) -> None:
    unknown = set(data) - allowed
    if unknown:
        raise ValueError(f"{what}: unknown keys {sorted(unknown)}; allowed: {sorted(allowed)}")


def _named_items(section: Any, what: str) -> list[tuple[str, Mapping[str, Any]]]:
    """Accept ``{name: spec}`` or ``[{name: ..., ...}]``; a bare name means all defaults."""
    if section is None:
        return []
    if isinstance(section, Mapping):
        return [(str(name), spec or {}) for name, spec in section.items()]
    items: list[tuple[str, Mapping[str, Any]]] = []
    for entry in section:
        if isinstance(entry, str):
            items.append((entry, {}))
        elif isinstance(entry, Mapping) and "name" in entry:
            items.append((str(entry["name"]), {k: v for k, v in entry.items() if k != "name"}))
        else:
            raise ValueError(f"each {what} needs a name: {entry!r}")
    return items


def _host_from(name: str, spec: Mapping[str, Any]) -> HostSpec:
    spec = dict(spec)
    address = spec.pop("address", None)
    nested = spec.pop("behaviour", None)
    if nested is not None:
        if spec:
            raise ValueError(f"host {name}: put behaviour fields either nested or flat, not both")
        spec = dict(nested)
    _check_keys(f"host {name}", spec, _BEHAVIOUR_FIELDS)
    for key in ("mailboxes", "full_mailboxes"):
        if key in spec:
            value = spec[key]
            spec[key] = {value} if isinstance(value, str) else {str(v) for v in value or ()}
    return HostSpec(name=name, behaviour=HostBehaviour(**spec), address=address)


def _parse_mx(name: str, item: Any) -> tuple[int, str]:
    """One MX as ``[10, host]``, ``"10 host"`` or ``{preference: 10, host: h}``."""
    if isinstance(item, str):
        parts = item.split()
        if len(parts) != 2:
            raise ValueError(f"domain {name}: MX {item!r} is not 'preference host'")
        return int(parts[0]), parts[1]
    if isinstance(item, Mapping):
        return int(item.get("preference", 10)), str(item["host"])
    pref, host = item
    return int(pref), str(host)


def _domain_from(name: str, spec: Mapping[str, Any]) -> DomainSpec:
    _check_keys(f"domain {name}", spec, _DOMAIN_FIELDS)
    mx = spec.get("mx") or []
    if isinstance(mx, str):
        mx = [mx]
    a = spec.get("a") or []
    txt = spec.get("txt") or []
    return DomainSpec(
        name=name,
        mx=[_parse_mx(name, item) for item in mx],
        a=[a] if isinstance(a, str) else [str(x) for x in a],
        txt=[txt] if isinstance(txt, str) else [str(x) for x in txt],
        servfail=bool(spec.get("servfail", False)),
        dns_delay=None if spec.get("dns_delay") is None else float(spec["dns_delay"]),
        ttl=None if spec.get("ttl") is None else int(spec["ttl"]),
        cname=None if spec.get("cname") is None else str(spec["cname"]),
    )


# ---------------------------------------------------------------------- generated worlds
@dataclass(frozen=True)
class GeneratedAddress:
    """One address of a generated world and the verdict a correct verifier must reach."""

    address: str
    domain: str
    host: str
    expected: Expected


def _words(text: str) -> list[str]:
    """Word lists read better as text than as a column of quoted strings."""
    return text.split()


_FIRST = _words(
    "anna ben carla david emma felix greta hugo ida jonas karl lena max nina oskar paula "
    "quinn rosa sam tina uwe vera will xena yann zoe"
)
_LAST = _words(
    "adams baker clark davis evans fisher green hall irwin jones king lewis moore nash "
    "owens price quirk reed smith turner vance walker young zimmer"
)


def generate_world(
    n_domains: int,
    n_hosts: int,
    addresses_per_domain: int,
    seed: int,
    skew: float = 1.1,
    *,
    catchall_ratio: float = 0.1,
    valid_ratio: float = 0.7,
) -> tuple[World, list[GeneratedAddress]]:
    """A big deterministic world: domains spread over hosts by a Zipf-like law of exponent ``skew``.

    So a few big hosts serve many domains (as Google/Microsoft do) and a long tail serves one or
    two: exactly the shape where grouping by mail host pays. About ``catchall_ratio`` of the
    hosts accept everything; on the others about ``valid_ratio`` of the addresses exist. Mailboxes
    are stored as full addresses, since one host serves many domains.
    """
    if n_hosts < 1 or n_domains < 0 or addresses_per_domain < 0:
        raise ValueError("need n_hosts >= 1 and non-negative counts")
    rng = random.Random(seed)
    host_names = [f"mx{i:04d}.mail{i:04d}.test" for i in range(n_hosts)]
    n_catchall = round(n_hosts * catchall_ratio)
    # The biggest hosts stay ordinary mailbox hosts; catch-alls are drawn from the rest (but
    # may be the big ones in tiny worlds), so a run's outcome mix follows the ratios.
    pool = list(range(1, n_hosts)) if n_hosts > 1 else [0]
    catchall_hosts = set(rng.sample(pool, min(n_catchall, len(pool))))
    behaviours = [HostBehaviour(accept_all=i in catchall_hosts) for i in range(n_hosts)]
    weights = [1.0 / (rank + 1) ** skew for rank in range(n_hosts)]

    domains: list[DomainSpec] = []
    addresses: list[GeneratedAddress] = []
    for d in range(n_domains):
        dom = f"dom{d:06d}.test"
        h = rng.choices(range(n_hosts), weights=weights)[0]
        domains.append(DomainSpec(name=dom, mx=[(10, host_names[h])]))
        used: set[str] = set()
        for _ in range(addresses_per_domain):
            while True:
                local = f"{rng.choice(_FIRST)}.{rng.choice(_LAST)}"
                if rng.random() < 0.5:
                    local += str(rng.randrange(100))
                if local not in used:
                    used.add(local)
                    break
            address = f"{local}@{dom}"
            if behaviours[h].accept_all:
                expected: Expected = "catchall"
            elif rng.random() < valid_ratio:
                expected = "valid"
                behaviours[h].mailboxes.add(address)
            else:
                expected = "invalid"
            addresses.append(GeneratedAddress(address, dom, host_names[h], expected))
    hosts = [HostSpec(name=n, behaviour=b) for n, b in zip(host_names, behaviours, strict=True)]
    return World.of(hosts, domains), addresses
