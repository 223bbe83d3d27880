"""Throughput through a SOCKS5 proxy against direct: the same world, the same run.

``python -m bench.egress [--size 5000] [--rounds 2]`` builds the world of :mod:`bench.world`
(by default 5,000 addresses over 500 domains on 50 hosts, 20 ms per SMTP reply), serves it
from a testbed process, starts a local SOCKS5 proxy (pproxy, with a user name and password,
:mod:`bench.socks_proxy`), and verifies the addresses with ``Engine.verify_many`` in a fresh
process, alternately direct and with ``VERIMAIL_SMTP_PROXY`` set, ``--rounds`` times each.
The testbed's counters give the sessions and RCPTs each run caused; the proxy's log, the
connections it made. What the proxy costs on loopback is its own relaying (a Python proxy on
the same 2 cores) and one more round trip per session for the SOCKS handshake; a remote proxy
adds its network distance to every SMTP reply.
"""

from __future__ import annotations

import argparse
from typing import Any

from bench.common import (
    Table,
    add_output_args,
    command_text,
    fmt_float,
    fmt_int,
    publish,
)
from bench.socks_proxy import SocksProxy
from bench.throughput import run_side
from bench.world import RemoteTestbed, WorldSpec, build_world
from verimail.testbed.world import GeneratedAddress


def run_once(
    tb: RemoteTestbed,
    addresses: list[GeneratedAddress],
    proxy: SocksProxy | None,
    timeout: float,
) -> dict[str, Any]:
    """One ``verify_many`` run in a fresh process, direct or through ``proxy``."""
    env = {"VERIMAIL_SMTP_PROXY": proxy.url} if proxy is not None else {}
    connections = len(proxy.destinations()) if proxy is not None else 0
    figures = run_side("engine", tb, addresses, timeout, env, own_settings_only=True)
    figures["proxy_connections"] = (
        len(proxy.destinations()) - connections if proxy is not None else 0
    )
    return figures


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=5_000, help="addresses (default 5,000)")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each side (default 2)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per run")
    add_output_args(parser)
    args = parser.parse_args(argv)

    spec = WorldSpec(addresses=args.size)
    _world, addresses = build_world(spec)
    n = len(addresses)
    runs: list[tuple[str, dict[str, Any]]] = []
    with RemoteTestbed(spec) as tb, SocksProxy(user="bench", password="bench-pass") as proxy:
        for round_no in range(1, args.rounds + 1):
            runs.append((f"direct, run {round_no}", run_once(tb, addresses, None, args.timeout)))
            runs.append(
                (f"SOCKS5 proxy, run {round_no}", run_once(tb, addresses, proxy, args.timeout))
            )

    table = Table(
        f"Direct and through a local SOCKS5 proxy: {spec.describe()}",
        [
            "run",
            "addresses",
            "wall s",
            "addresses/s",
            "SMTP sessions",
            "RCPTs",
            "proxy connections",
            "verdicts as expected",
        ],
    )
    for name, fig in runs:
        tbs = fig["testbed"]
        table.add(
            name,
            fmt_int(n),
            fmt_float(fig["wall_s"]),
            fmt_int(n / fig["wall_s"]),
            fmt_int(tbs["sessions"]),
            fmt_int(tbs["rcpt_to"]),
            fmt_int(fig["proxy_connections"]),
            f"{100 * fig['agreement']:.1f}%",
        )

    def rates(prefix: str) -> list[float]:
        return [n / fig["wall_s"] for name, fig in runs if name.startswith(prefix)]

    def mean_rate(prefix: str) -> float:
        return sum(rates(prefix)) / len(rates(prefix))

    def spread(prefix: str) -> str:
        return f"{min(rates(prefix)):,.0f}-{max(rates(prefix)):,.0f}"

    direct, proxied = mean_rate("direct"), mean_rate("SOCKS5")
    sessions = {name: fig["testbed"]["sessions"] for name, fig in runs}
    relayed = all(
        fig["proxy_connections"] == fig["testbed"]["sessions"]
        for name, fig in runs
        if name.startswith("SOCKS5")
    )
    reading = [
        f"Through the proxy: {proxied:,.0f} addresses/s against {direct:,.0f} direct "
        f"({100 * proxied / direct:.0f}% of direct, the mean of {args.rounds} run(s) each); "
        f"SMTP sessions per run: {', '.join(f'{v:,}' for v in sessions.values())}"
        + ("; every session through the proxy was one of its connections." if relayed else "."),
        f"Runs of one side ranged {spread('direct')} addresses/s direct and "
        f"{spread('SOCKS5')} through the proxy: on a machine shared with other work the "
        "spread between runs of the same side is the noise, and a difference within it is "
        "no difference.",
        "The proxy is pproxy (Python, asyncio) on the same 2 cores as verimail and the "
        "testbed: its relaying competes with both for CPU. A proxy on a machine of its own "
        "costs instead its network distance on every SMTP round trip.",
    ]
    result = {"runs": dict(runs), "size": n}
    publish(
        args,
        title="SMTP through a SOCKS5 proxy against direct (issue 34)",
        command=command_text("bench.egress", argv),
        tables=[table],
        reading=reading,
        extra=result,
    )
    return result


if __name__ == "__main__":
    main()
