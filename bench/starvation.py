"""The starvation world: one mail server that takes one connection at once, shared by
several host groups.

``python -m bench.starvation [--groups 3] [--per-group 600]`` serves ``--groups`` domains
from a testbed in this process, each domain its own host group (a backup MX of its own,
which is down), all with the same primary: a server that answers a second connection
at once with ``421 4.7.0 Too many concurrent connections`` (``max_connections 1``), at
``--reply-delay`` seconds per reply. Every address is a mailbox there, so any verdict
but ``valid`` is the prober's loss. The engine verifies all the addresses in one
``verify_many`` call, its groups at the same time, as a list job would.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench.common import Table, add_output_args, command_text, fmt_float, fmt_int, publish
from verimail.config import Settings
from verimail.engine.core import Engine
from verimail.testbed.server import Testbed
from verimail.testbed.world import DomainSpec, HostBehaviour, HostSpec, World

SHARED = "mx.one.test"


def build(groups: int, per_group: int, reply_delay: float) -> tuple[World, list[str]]:
    boxes = {f"u{i}" for i in range(per_group)}
    one = HostBehaviour(mailboxes=boxes, max_connections=1, reply_delay=reply_delay)
    hosts = [HostSpec(SHARED, one)]
    domains = []
    for g in range(groups):
        hosts.append(HostSpec(f"backup.g{g}.test", HostBehaviour(refuse_connections=True)))
        domains.append(DomainSpec(f"g{g}.test", mx=[(10, SHARED), (20, f"backup.g{g}.test")]))
    addresses = [f"u{i}@g{g}.test" for g in range(groups) for i in range(per_group)]
    return World.of(hosts, domains), addresses


def measure(groups: int, per_group: int, reply_delay: float) -> dict[str, Any]:
    world, addresses = build(groups, per_group, reply_delay)
    with Testbed(world) as tb, tempfile.TemporaryDirectory() as data:
        settings = Settings(data_dir=Path(data), prefect_warm_up=False, **tb.settings_overrides())
        started = time.monotonic()
        batch = asyncio.run(Engine(settings).verify_many(addresses))
        wall = time.monotonic() - started
        stats = tb.host_stats(SHARED)
    statuses = Counter(r.status.value for r in batch.results)
    return {
        "addresses": len(addresses),
        "valid": statuses.get("valid", 0),
        "unknown": statuses.get("unknown", 0),
        "wall_s": wall,
        "sessions": stats.mail_from,  # (a session turned away sends no MAIL FROM)
        "turned_away": stats.sessions - stats.mail_from,
        "peak": stats.peak_concurrent,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", type=int, default=3, help="host groups (default 3)")
    parser.add_argument("--per-group", type=int, default=600, help="addresses each (600)")
    parser.add_argument(
        "--reply-delay", type=float, default=0.02, help="seconds per SMTP reply (0.02)"
    )
    add_output_args(parser)
    args = parser.parse_args(argv)
    fig = measure(args.groups, args.per_group, args.reply_delay)
    table = Table(
        f"Starvation world: {args.groups} host groups × {args.per_group:,} addresses on one "
        f"server that takes one connection at once, {args.reply_delay * 1000:.0f} ms per reply",
        [
            "run",
            "addresses",
            "valid",
            "unknown",
            "wall s",
            "sessions",
            "connections turned away (421)",
            "peak connections",
        ],
    )
    table.add(
        "verimail engine (verify_many)",
        fmt_int(fig["addresses"]),
        fmt_int(fig["valid"]),
        fmt_int(fig["unknown"]),
        fmt_float(fig["wall_s"]),
        fmt_int(fig["sessions"]),
        fmt_int(fig["turned_away"]),
        fmt_int(fig["peak"]),
    )
    reading = [
        f"{fig['unknown']:,} of {fig['addresses']:,} addresses unknown (target: 0); every "
        "address is a mailbox, so each unknown is a host written off while it was busy.",
        f"{fig['turned_away']:,} connections were turned away with 421: the first dials of "
        "each group, before the prober learns the server takes one (peak counts those too).",
    ]
    publish(
        args,
        title="SMTP prober: one-connection server shared by several host groups",
        command=command_text("bench.starvation", argv),
        tables=[table],
        reading=reading,
        extra={"figures": fig},
    )
    return fig


if __name__ == "__main__":
    main()
