"""Scaling: the engine on the same world shape at several sizes — time and peak RSS.

``python -m bench.scaling [--sizes 2000,20000]`` (``--sizes 2000,20000,200000`` for the big
run, about 8 minutes more on this machine). Each size gets its own testbed process and a fresh
engine process (:mod:`bench.verify_worker`), so peak RSS is that of one ``verify_many`` call on
that many addresses. The world keeps its shape: 10 addresses per domain, 10 domains per host,
the same skew, 20 ms per SMTP reply, 2 ms per DNS answer.
"""

from __future__ import annotations

import argparse
import tempfile
from typing import Any

from bench.common import (
    Table,
    add_output_args,
    command_text,
    fmt_float,
    fmt_int,
    fmt_ratio,
    publish,
)
from bench.throughput import run_side
from bench.world import RemoteTestbed, WorldSpec, bench_settings, build_world, lower_bound


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="2000,20000", help="comma-separated address counts")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per run")
    add_output_args(parser)
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]

    table = Table(
        "Scaling: verify_many on the world's shape at each size",
        [
            "addresses",
            "domains / hosts",
            "wall s",
            "addresses/s",
            "lower bound s",
            "wall ÷ bound",
            "slowest host: addresses",
            "SMTP sessions",
            "engine CPU s",
            "peak RSS MiB",
            "RSS KiB per address",
        ],
    )
    runs: list[dict[str, Any]] = []
    for size in sizes:
        spec = WorldSpec(addresses=size)
        _world, addresses = build_world(spec)
        with RemoteTestbed(spec) as tb:
            settings = bench_settings(tb, tempfile.gettempdir())
            bound = lower_bound(addresses, spec, settings)
            run = run_side("engine", tb, addresses, args.timeout)
        n = len(addresses)
        run.update(size=n, bound_s=bound.seconds, slowest=bound.slowest.addresses)
        runs.append(run)
        table.add(
            fmt_int(n),
            f"{spec.n_domains:,} / {spec.n_hosts:,}",
            fmt_float(run["wall_s"]),
            fmt_int(n / run["wall_s"]),
            fmt_float(bound.seconds),
            fmt_ratio(run["wall_s"] / bound.seconds),
            fmt_int(bound.slowest.addresses),
            fmt_int(run["testbed"]["sessions"]),
            fmt_float(run["cpu_s"], 1),
            fmt_int(run["peak_rss_mib"]),
            fmt_float((run["peak_rss_mib"] - run["rss_before_mib"]) * 1024 / n, 1),
        )

    reading = []
    if len(runs) >= 2:
        a, b = runs[0], runs[-1]
        grow = b["size"] / a["size"]
        reading.append(
            f"From {a['size']:,} to {b['size']:,} addresses ({grow:.0f}×) the wall time grew "
            f"{b['wall_s'] / a['wall_s']:.1f}× and the bound {b['bound_s'] / a['bound_s']:.1f}× "
            f"(the slowest host grew from {a['slowest']:,} to {b['slowest']:,} addresses): the "
            "time follows the biggest host, not the address count, because every host is "
            "probed at once and each is capped at 5 sessions. CPU grew "
            f"{b['cpu_s'] / a['cpu_s']:.1f}× — linear in addresses (syntax, DNS per domain, "
            "one verdict each)."
        )
        reading.append(
            f"Peak RSS went from {a['peak_rss_mib']:,.0f} to {b['peak_rss_mib']:,.0f} MiB: "
            "verify_many returns every result at once, so memory is linear in addresses "
            "(about "
            f"{(b['peak_rss_mib'] - b['rss_before_mib']) * 1024 / b['size']:.1f} KiB each here, "
            "results and the per-address work list); the SMTP work itself is bounded by the "
            "session caps."
        )
    publish(
        args,
        title="Scaling (" + ", ".join(f"{s:,}" for s in sizes) + " addresses)",
        command=command_text("bench.scaling", argv),
        tables=[table],
        reading=reading,
        extra={"runs": runs},
    )
    return {"runs": runs, "tables": [table]}


if __name__ == "__main__":
    main()
