"""The benchmark world and data: a generated mail world, its testbed in its own process, and the
latency-model lower bound of verifying it.

The world is ``testbed.world.generate_world`` (Zipf-skewed domains over hosts, 10% catch-all
hosts, 70% of the other addresses real) with a delay on every SMTP reply and every DNS answer.
It is a pure function of :class:`WorldSpec`, so the testbed process and the benchmark process
build the same world from the same few numbers.

The testbed runs in a subprocess so that its servers never compete with the code being
measured for the GIL (two cores: one for the testbed, one for the verifier).
"""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass
from typing import Any

from bench.common import REPO
from verimail.config import Settings
from verimail.testbed.world import (
    DomainSpec,
    Expected,
    GeneratedAddress,
    HostBehaviour,
    HostSpec,
    World,
    generate_world,
)


@dataclass(frozen=True)
class WorldSpec:
    """``addresses`` over ``addresses / 10`` domains on ``domains / 10`` hosts by default."""

    addresses: int = 20_000
    domains: int | None = None
    hosts: int | None = None
    seed: int = 2024
    skew: float = 1.1
    reply_delay: float = 0.020  # every SMTP reply, banner included
    dns_delay: float = 0.002  # every DNS answer
    # The shared-host shape (issue 33): ``shared_names`` more domains, each with an MX name
    # of its own, all resolving to one server (``SHARED_SERVER``) that greets after
    # ``greeting_delay`` more seconds; ``shared_per_domain`` addresses each.
    shared_names: int = 0
    shared_per_domain: int = 15
    greeting_delay: float = 0.0

    @property
    def n_domains(self) -> int:
        return self.domains or max(1, self.addresses // 10)

    @property
    def n_hosts(self) -> int:
        return self.hosts or max(1, self.n_domains // 10)

    @property
    def per_domain(self) -> int:
        return max(1, round(self.addresses / self.n_domains))

    def to_args(self) -> list[str]:
        return ["--spec", json.dumps(asdict(self))]

    def describe(self) -> str:
        text = (
            f"{self.n_domains * self.per_domain:,} addresses over {self.n_domains:,} domains on "
            f"{self.n_hosts:,} hosts (skew {self.skew}), {self.reply_delay * 1000:g} ms per SMTP "
            f"reply, {self.dns_delay * 1000:g} ms per DNS answer"
        )
        if self.shared_names:
            text += (
                f"; plus a shared host: {self.shared_names} domains × "
                f"{self.shared_per_domain} addresses, an MX name each, one server IP that "
                f"greets after {self.greeting_delay:g} s"
            )
        return text


SHARED_SERVER = "server.shared-host.test"


def build_world(spec: WorldSpec) -> tuple[World, list[GeneratedAddress]]:
    """The world and its addresses, shuffled (a real list is not sorted by domain)."""
    world, addresses = generate_world(
        spec.n_domains, spec.n_hosts, spec.per_domain, seed=spec.seed, skew=spec.skew
    )
    if spec.shared_names:
        addresses += _add_shared_host(world, spec)
    for host in world.hosts.values():
        host.behaviour.reply_delay = spec.reply_delay
    world.dns_delay = spec.dns_delay
    random.Random(spec.seed).shuffle(addresses)
    return world, addresses


def _add_shared_host(world: World, spec: WorldSpec) -> list[GeneratedAddress]:
    """The shared-host shape into ``world``: ``cust<N>.shared.test`` with the MX name
    ``mx.cust<N>.shared.test``, whose A record is :data:`SHARED_SERVER`'s address (the
    testbed answers a domain's ``a`` entry naming a host with that host's address); 70% of
    the addresses are mailboxes, the server is no catch-all."""
    rng = random.Random(spec.seed + 1)
    server = HostBehaviour(greeting_delay=spec.greeting_delay)
    addresses = []
    for d in range(spec.shared_names):
        domain = f"cust{d:04d}.shared.test"
        mx = f"mx.{domain}"
        world.domains[domain] = DomainSpec(domain, mx=[(10, mx)])
        world.domains[mx] = DomainSpec(mx, a=[SHARED_SERVER])
        for k in range(spec.shared_per_domain):
            address = f"user{k}@{domain}"
            valid = rng.random() < 0.7
            if valid:
                server.mailboxes.add(address)
            expected: Expected = "valid" if valid else "invalid"
            addresses.append(GeneratedAddress(address, domain, SHARED_SERVER, expected))
    world.hosts[SHARED_SERVER] = HostSpec(SHARED_SERVER, server)
    return addresses


# --- the testbed in its own process -------------------------------------------------------


class RemoteTestbed:
    """``python -m bench.testbed_proc``: start, read counters, reset them, stop."""

    def __init__(self, spec: WorldSpec | None = None, world_yaml: str | None = None) -> None:
        self.spec = spec
        self.world_yaml = world_yaml
        self.proc: subprocess.Popen[str] | None = None
        self.nameserver = ""
        self.smtp_port = 0

    def __enter__(self) -> RemoteTestbed:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.testbed_proc", *self._source()],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        ready = self._read()
        self.nameserver = ready["nameserver"]
        self.smtp_port = ready["smtp_port"]
        return self

    def _source(self) -> list[str]:
        if self.spec is not None:
            return self.spec.to_args()
        if self.world_yaml is not None:
            return ["--world-yaml", self.world_yaml]
        raise ValueError("give a WorldSpec or a world file")

    def __exit__(self, *exc: object) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        try:
            if proc.poll() is None and proc.stdin is not None:
                proc.stdin.write("quit\n")
                proc.stdin.flush()
            proc.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()

    def _read(self) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the testbed process exited ({self.proc.poll()})")
        return json.loads(line)

    def _ask(self, command: str) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self._read()

    def stats(self) -> dict[str, Any]:
        """Server-side counters since the last reset (waits for sessions to close first)."""
        return self._ask("stats")

    def reset(self) -> None:
        self._ask("reset")

    def settings_overrides(self) -> dict[str, Any]:
        return {
            "dns_nameservers": [self.nameserver],
            "smtp_port": self.smtp_port,
            "smtp_allow_networks": ["127.0.0.0/8"],
        }


def bench_settings(tb: RemoteTestbed, data_dir: Any, **overrides: Any) -> Settings:
    """Production defaults (politeness 5 sessions/host, 100 RCPTs and 9 rejections per
    session) pointed at the testbed; only the timeouts are written out, at their defaults."""
    values: dict[str, Any] = {
        "data_dir": data_dir,
        "prefect_warm_up": False,
        "smtp_max_sessions_per_host": 5,
        "smtp_rcpts_per_session": 100,
        "smtp_max_rejections_per_session": 9,
        **tb.settings_overrides(),
    }
    values.update(overrides)
    return Settings(**values)


# --- the latency-model lower bound ----------------------------------------------------------


@dataclass
class HostBound:
    host: str
    domains: int
    addresses: int
    rcpts: int  # addresses + one catch-all probe per domain
    rejections: int
    sessions: int
    round_trips: int
    concurrency: int
    seconds: float


@dataclass
class LowerBound:
    seconds: float
    slowest: HostBound
    by_host: dict[str, HostBound]  # per server IP (a host of the world is one IP)
    total_round_trips: int
    aggregate_seconds: float  # all round trips over the process-wide session cap
    dns_seconds: float

    def describe(self) -> str:
        s = self.slowest
        return (
            f"slowest host {s.host}: {s.domains} domains, {s.addresses:,} addresses → "
            f"{s.rcpts:,} RCPTs (a catch-all probe per domain), {s.rejections:,} rejections → "
            f"≥ {s.sessions} sessions; ({s.round_trips:,} round trips × "
            f"{self.delay * 1000:g} ms{self._greetings(s)}) ÷ {s.concurrency} sessions = "
            f"{s.seconds:.2f} s, plus {self.dns_seconds * 1000:g} ms of DNS (one MX and one "
            "A answer)"
        )

    def _greetings(self, s: HostBound) -> str:
        if s.host != SHARED_SERVER or not self.greeting_delay:
            return ""
        return f" + {s.sessions} greetings × {self.greeting_delay:g} s"

    delay: float = 0.0
    greeting_delay: float = 0.0


def lower_bound(
    addresses: list[GeneratedAddress], spec: WorldSpec, settings: Settings
) -> LowerBound:
    """The least time any verifier needs under our politeness, from round trips alone.

    Per host: every address and one catch-all probe per domain is one ``RCPT TO``; a session
    may carry at most ``smtp_rcpts_per_session`` of them and at most
    ``smtp_max_rejections_per_session`` rejections (unknown users and the probes on hosts that
    are not catch-all), so the host needs at least ``max(ceil(rcpts / R), ceil(rejections / J))``
    sessions. Each session costs greeting + EHLO + one ``MAIL FROM`` + ``QUIT`` on top of its
    RCPTs (a single transaction may carry recipients of several domains). Those round trips,
    times the reply delay, plus the server's ``greeting_delay`` once per session, shared by
    ``min(sessions, smtp_max_sessions_per_host)`` parallel sessions, give the host's time
    (per server IP: the shared host's MX names all count as its one server); the job's
    bound is the slowest host, plus one MX and one A answer. (Free of CPU cost, of RSET
    between domains and of any ordering constraint, so no real run can beat it.)
    """
    by_host: dict[str, list[GeneratedAddress]] = defaultdict(list)
    for a in addresses:
        by_host[a.host].append(a)
    bounds: list[HostBound] = []
    for host, items in by_host.items():
        domains = {a.domain for a in items}
        catch_all = all(a.expected == "catchall" for a in items)
        rejections = sum(1 for a in items if a.expected == "invalid")
        if not catch_all:
            rejections += len(domains)  # the random-address probes are refused too
        rcpts = len(items) + len(domains)
        sessions = max(
            math.ceil(rcpts / settings.smtp_rcpts_per_session),
            math.ceil(rejections / settings.smtp_max_rejections_per_session),
            1,
        )
        round_trips = sessions * 4 + rcpts
        concurrency = min(sessions, settings.smtp_max_sessions_per_host)
        greetings = sessions * (spec.greeting_delay if host == SHARED_SERVER else 0.0)
        bounds.append(
            HostBound(
                host,
                len(domains),
                len(items),
                rcpts,
                rejections,
                sessions,
                round_trips,
                concurrency,
                (round_trips * spec.reply_delay + greetings) / concurrency,
            )
        )
    slowest = max(bounds, key=lambda b: b.seconds)
    total = sum(b.round_trips for b in bounds)
    aggregate = total * spec.reply_delay / settings.smtp_max_sessions_total
    dns = 2 * spec.dns_delay
    return LowerBound(
        seconds=max(slowest.seconds, aggregate) + dns,
        slowest=slowest,
        by_host={b.host: b for b in bounds},
        total_round_trips=total,
        aggregate_seconds=aggregate,
        dns_seconds=dns,
        delay=spec.reply_delay,
        greeting_delay=spec.greeting_delay,
    )


def expected_counts(addresses: list[GeneratedAddress]) -> Counter[str]:
    return Counter(a.expected for a in addresses)
