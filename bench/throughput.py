"""Verification throughput: the engine, the bulk flow, the peer and the latency lower bound.

``python -m bench.throughput [--size 20000]`` builds the world of :mod:`bench.world` (by default
20,000 addresses over 2,000 domains on 200 hosts, 20 ms per SMTP reply, 2 ms per DNS answer),
serves it from a testbed process, and verifies its addresses

1. with ``Engine.verify_many`` (a fresh process);
2. with the ``bulk-verify`` flow through ``LocalRunner`` (a fresh process);
3. with the peer ``py3-validate-email`` (its own venv) from thread pools of ``--peer-threads``
   workers, each on a random sample of ``--peer-sample`` addresses per thread (the order is
   shuffled, so the first N are a random sample);

and computes the latency-model lower bound. All figures come from the same run; the testbed's
own counters give the DNS queries, sessions and RCPTs each side caused.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from bench.common import (
    Table,
    add_output_args,
    command_text,
    fmt_float,
    fmt_int,
    fmt_ratio,
    publish,
    run_measured,
    target_cell,
)
from bench.peer import run_peer
from bench.world import (
    SHARED_SERVER,
    LowerBound,
    RemoteTestbed,
    WorldSpec,
    bench_settings,
    build_world,
    lower_bound,
)
from verimail.testbed.world import GeneratedAddress

ENGINE_OK = {
    "valid": {"valid"},
    "invalid": {"invalid"},
    "catchall": {"catchall", "likely_valid"},
}
PEER_OK: dict[str, set[bool | None]] = {"valid": {True}, "invalid": {False}, "catchall": {True}}


def agreement(addresses: list[GeneratedAddress], answers: list[Any], ok: dict[str, set]) -> float:
    hits = sum(1 for a, got in zip(addresses, answers, strict=True) if got in ok[a.expected])
    return hits / max(1, len(addresses))


def run_side(
    side: str,
    tb: RemoteTestbed,
    addresses: list[GeneratedAddress],
    timeout: float,
    env: dict[str, str] | None = None,
    *,
    own_settings_only: bool = False,
) -> dict[str, Any]:
    """One measured run of the engine or the flow, with the testbed's view of it; ``env``:
    more ``VERIMAIL_*`` variables for the run's process (a setting of the run before);
    ``own_settings_only``: the caller's ``VERIMAIL_*`` variables are not passed on (a
    proxy set in the shell must not reach the direct run it is compared with)."""
    with tempfile.TemporaryDirectory(prefix=f"verimail-bench-{side}-") as tmp:
        src = Path(tmp, "addresses.txt")
        src.write_text("\n".join(a.address for a in addresses) + "\n", encoding="utf-8")
        statuses_path = Path(tmp, "statuses.json")
        data_dir = Path(tmp, "data")
        data_dir.mkdir()
        tb.reset()
        before = tb.stats()
        figures = run_measured(
            [
                "bench.verify_worker",
                "--side",
                side,
                "--addresses",
                str(src),
                "--nameserver",
                tb.nameserver,
                "--smtp-port",
                str(tb.smtp_port),
                "--data-dir",
                str(data_dir),
                "--statuses",
                str(statuses_path),
            ],
            timeout=timeout,
            env=_run_env(env, own_settings_only),
        )
        after = tb.stats()
        if side == "engine-stream":  # [address, status] lines, in the order results came
            pairs = dict(json.loads(line) for line in statuses_path.open(encoding="utf-8"))
            statuses = [pairs[a.address] for a in addresses]
        else:
            statuses = json.loads(statuses_path.read_text())
    figures["testbed"] = after
    figures["testbed_cpu_s"] = after["cpu_s"] - before["cpu_s"]
    figures["agreement"] = agreement(addresses, statuses, ENGINE_OK)
    figures["statuses"] = dict(Counter(statuses))
    return figures


def _run_env(env: dict[str, str] | None, own_settings_only: bool) -> dict[str, str] | None:
    if env is None and not own_settings_only:
        return None  # (the caller's environment as it is)
    inherited = {
        k: v for k, v in os.environ.items() if not (own_settings_only and k.startswith("VERIMAIL_"))
    }
    return {**inherited, **(env or {})}


def run_peer_side(
    tb: RemoteTestbed, addresses: list[GeneratedAddress], threads: int, timeout: float
) -> dict[str, Any]:
    tb.reset()
    before = tb.stats()
    summary, answers = run_peer(
        [a.address for a in addresses], tb.nameserver, tb.smtp_port, threads, timeout
    )
    after = tb.stats()
    summary["testbed"] = after
    summary["testbed_cpu_s"] = after["cpu_s"] - before["cpu_s"]
    summary["agreement"] = agreement(addresses, answers, PEER_OK)
    summary["threads"] = threads
    return summary


def _row(table: Table, name: str, n: int, wall: float, tb: dict[str, Any], fig: dict) -> None:
    dns = tb["dns"]
    table.add(
        name,
        fmt_int(n),
        fmt_float(wall),
        fmt_int(n / wall),
        fmt_int(tb["dns_queries"]),
        fmt_int(dns.get("MX", 0)),
        fmt_int(tb["sessions"]),
        fmt_int(tb["rcpt_to"]),
        fmt_int(tb["max_host_peak"]),
        f"{100 * fig['testbed_cpu_s'] / wall:.0f}%",
        f"{100 * fig['agreement']:.1f}%",
    )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=20_000, help="addresses (default 20,000)")
    parser.add_argument(
        "--peer-threads",
        default="1,50",
        help="comma-separated thread-pool sizes for the peer (default 1,50; empty: no peer)",
    )
    parser.add_argument(
        "--peer-sample",
        type=int,
        default=40,
        help="addresses per peer thread (default 40: 2,000 for 50 threads); 0: all",
    )
    parser.add_argument("--no-flow", action="store_true", help="skip the Prefect flow run")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per run")
    parser.add_argument(
        "--shared-names",
        type=int,
        default=0,
        help="add a shared host: this many domains, an MX name each, one server IP (issue 33)",
    )
    parser.add_argument(
        "--shared-per-domain", type=int, default=15, help="addresses per shared-host domain"
    )
    parser.add_argument(
        "--greeting-delay", type=float, default=1.0, help="the shared server's greeting (s)"
    )
    parser.add_argument(
        "--by-name",
        action="store_true",
        help="also run the engine with sessions per MX name, as before issue 33 "
        "(VERIMAIL_SMTP_SESSIONS_BY_SERVER=false), in the same run",
    )
    add_output_args(parser)
    args = parser.parse_args(argv)

    spec = WorldSpec(
        addresses=args.size,
        shared_names=args.shared_names,
        shared_per_domain=args.shared_per_domain,
        greeting_delay=args.greeting_delay if args.shared_names else 0.0,
    )
    _world, addresses = build_world(spec)
    n = len(addresses)
    domains = len({a.domain for a in addresses})
    runs: dict[str, dict[str, Any]] = {}
    with RemoteTestbed(spec) as tb:
        settings = bench_settings(tb, tempfile.gettempdir())
        bound: LowerBound = lower_bound(addresses, spec, settings)
        runs["engine"] = run_side("engine", tb, addresses, args.timeout)
        if args.by_name:
            by_name = {"VERIMAIL_SMTP_SESSIONS_BY_SERVER": "false"}
            runs["engine-by-name"] = run_side("engine", tb, addresses, args.timeout, by_name)
        if not args.no_flow:
            runs["flow"] = run_side("flow", tb, addresses, args.timeout)
        for threads in [int(t) for t in args.peer_threads.split(",") if t.strip()]:
            sample = n if args.peer_sample <= 0 else min(n, args.peer_sample * threads)
            runs[f"peer{threads}"] = run_peer_side(tb, addresses[:sample], threads, args.timeout)

    columns = [
        "run",
        "addresses",
        "wall s",
        "addresses/s",
        "DNS queries",
        "MX queries",
        "SMTP sessions",
        "RCPTs",
        "max sessions on a host",
        "testbed CPU",
        "verdicts as expected",
    ]
    table = Table(f"Throughput: {spec.describe()}", columns)
    engine = runs["engine"]
    _row(table, "verimail engine (verify_many)", n, engine["wall_s"], engine["testbed"], engine)
    if "engine-by-name" in runs:
        old = runs["engine-by-name"]
        label = "verimail engine, sessions per MX name (before issue 33)"
        _row(table, label, n, old["wall_s"], old["testbed"], old)
    if "flow" in runs:
        flow = runs["flow"]
        _row(
            table,
            "verimail bulk_verify flow (LocalRunner)",
            n,
            flow["wall_s"],
            flow["testbed"],
            flow,
        )
    peers = [(k, v) for k, v in runs.items() if k.startswith("peer")]
    for _key, peer in peers:
        label = (
            f"py3-validate-email {peer['version']}, {peer['threads']} thread"
            + ("s" if peer["threads"] != 1 else "")
            + (f" (random sample of {peer['addresses']:,})" if peer["addresses"] < n else "")
        )
        _row(table, label, peer["addresses"], peer["wall_s"], peer["testbed"], peer)
    slow = bound.slowest
    table.add(
        "latency-model lower bound",
        fmt_int(n),
        fmt_float(bound.seconds),
        fmt_int(n / bound.seconds),
        "–",
        fmt_int(domains),
        "–",
        fmt_int(n + domains),
        fmt_int(settings.smtp_max_sessions_per_host),
        "–",
        "–",
    )

    engine_rate = n / engine["wall_s"]
    ratios = Table("Ratios (same run) and targets", ["comparison", "figure", "target", "verdict"])
    for _key, peer in peers:
        peer_rate = peer["addresses"] / peer["wall_s"]
        ratios.add(
            f"engine ÷ peer throughput ({peer['threads']} thread"
            + ("s" if peer["threads"] != 1 else "")
            + ")",
            fmt_ratio(engine_rate / peer_rate),
            "≥ 20×",
            target_cell(engine_rate / peer_rate >= 20),
        )
    ratio_bound = engine["wall_s"] / bound.seconds
    ratios.add(
        "engine wall ÷ lower bound", fmt_ratio(ratio_bound), "≤ 2×", target_cell(ratio_bound <= 2)
    )
    if "flow" in runs:
        flow_ratio = runs["flow"]["wall_s"] / engine["wall_s"]
        ratios.add(
            "flow wall ÷ engine wall (Prefect overhead)",
            fmt_ratio(flow_ratio),
            "≤ 1.15×",
            target_cell(flow_ratio <= 1.15),
        )
    for name in ("engine", "flow"):
        if name in runs:
            mx = runs[name]["testbed"]["dns"].get("MX", 0)
            ratios.add(
                f"MX queries ÷ unique domains ({name})",
                f"{mx:,} ÷ {domains:,} = {mx / domains:.2f}",
                "= 1",
                target_cell(mx == domains),
            )

    phases = engine["phases"]
    detail = Table(
        "Engine run in detail",
        ["figure", "value"],
    )
    detail.add("prepare: syntax, lists, DNS (s)", fmt_float(phases.get("prepare_s")))
    detail.add("SMTP, all host groups (s)", fmt_float(phases.get("smtp_s")))
    detail.add("verdicts (s)", fmt_float(phases.get("verdicts_s")))
    detail.add("engine process CPU (s)", fmt_float(engine["cpu_s"]))
    detail.add("engine peak RSS (MiB)", fmt_float(engine["peak_rss_mib"], 0))
    detail.add("MAIL FROM sent", fmt_int(engine["testbed"]["mail_from"]))
    detail.add(
        "slowest host in the bound",
        f"{slow.host}: {slow.domains} domains, {slow.addresses:,} addresses",
    )
    detail.add("its minimum sessions / round trips", f"{slow.sessions} / {slow.round_trips:,}")
    if "flow" in runs:
        detail.add(
            "Prefect test server start-up, not in the flow's time (s)",
            fmt_float(runs["flow"]["phases"].get("prefect_server_start_s")),
        )

    reading = _reading(spec, n, domains, runs, bound, engine_rate)
    tables = [table, ratios, detail]
    if spec.shared_names:
        tables.append(_shared_host_table(runs, bound))
        reading.append(_shared_host_reading(spec, runs, bound))
    publish(
        args,
        title=f"Throughput ({n:,} addresses)",
        command=command_text("bench.throughput", argv),
        tables=tables,
        reading=reading,
        extra={"runs": runs, "bound_s": bound.seconds},
    )
    return {"runs": runs, "bound": bound, "tables": tables}


def _shared_host_table(runs: dict[str, dict[str, Any]], bound: LowerBound) -> Table:
    """The shared server's view of each engine run (issue 33): its sessions against the
    fewest its limits allow, and the run's wall against the bound, which that server
    sets (its greeting is paid once per session)."""
    shared = bound.by_host[SHARED_SERVER]
    table = Table(
        f"The shared host ({shared.domains} MX names, one IP): sessions and wall, same run",
        [
            "run",
            "sessions on its IP",
            "fewest its limits allow",
            "sessions ÷ fewest",
            "peak at once",
            "its bound s",
            "wall s",
            "wall ÷ bound",
            "target",
        ],
    )
    names = [("engine", "sessions per server IP (now)")]
    if "engine-by-name" in runs:
        names.insert(0, ("engine-by-name", "sessions per MX name (before)"))
    for key, label in names:
        run = runs[key]
        sessions = run["testbed"]["host_sessions"].get(SHARED_SERVER, 0)
        ratio = run["wall_s"] / bound.seconds
        table.add(
            label,
            fmt_int(sessions),
            fmt_int(shared.sessions),
            fmt_ratio(sessions / shared.sessions),
            fmt_int(run["testbed"]["host_peaks"].get(SHARED_SERVER, 0)),
            fmt_float(shared.seconds),
            fmt_float(run["wall_s"]),
            fmt_ratio(ratio),
            f"≤ 1.15× {target_cell(ratio <= 1.15)}" if key == "engine" else "–",
        )
    return table


def _shared_host_reading(
    spec: WorldSpec, runs: dict[str, dict[str, Any]], bound: LowerBound
) -> str:
    """What the shared host's figures say, and what keeps the run above its bound."""
    shared = bound.by_host[SHARED_SERVER]
    per_session = shared.seconds * shared.concurrency / shared.sessions
    new = runs["engine"]
    sessions = new["testbed"]["host_sessions"].get(SHARED_SERVER, 0)
    rounds = math.ceil(sessions / shared.concurrency)
    text = (
        f"Shared host: {shared.domains} domains with an MX name each, one server IP that "
        f"greets after {spec.greeting_delay:g} s. Sessions per server IP: {sessions} "
        f"sessions there against the {shared.sessions} its limits allow "
        f"({shared.rejections} rejections at 9 a session), {new['wall_s']:.1f} s, "
        f"{new['wall_s'] / bound.seconds:.2f}× the bound (which that server sets)."
    )
    if "engine-by-name" in runs:
        old = runs["engine-by-name"]
        old_sessions = old["testbed"]["host_sessions"].get(SHARED_SERVER, 0)
        text += (
            f" Per MX name, as before, in the same run: {old_sessions} sessions (every "
            f"domain at least one, each paying the greeting), {old['wall_s']:.1f} s, "
            f"{old['wall_s'] / bound.seconds:.2f}× the bound; now "
            f"{old['wall_s'] / new['wall_s']:.2f}× faster."
        )
    text += (
        f" What is left above the bound: it spreads {shared.sessions} sessions over "
        f"{shared.concurrency} slots as {shared.sessions / shared.concurrency:.1f} rounds of a "
        f"{per_session:.2f} s session (greeting, EHLO, MAIL FROM, the RCPTs, QUIT), but a "
        "real session ends at its 9th rejection wherever that falls, and each worker's last "
        f"session is a partial one: {sessions} sessions are {rounds} rounds, "
        f"{rounds * per_session:.1f} s, before the "
        f"{new['phases'].get('prepare_s', 0):.1f} s of syntax and DNS that precede the first "
        "session (not in the bound) and replies slower than 20 ms on a shared machine."
    )
    return text


def _reading(
    spec: WorldSpec,
    n: int,
    domains: int,
    runs: dict[str, dict[str, Any]],
    bound: LowerBound,
    engine_rate: float,
) -> list[str]:
    engine = runs["engine"]
    ph = engine["phases"]
    out = [
        f"Lower bound: {bound.describe()}. The engine took {engine['wall_s']:.1f} s "
        f"({engine['wall_s'] / bound.seconds:.2f}× the bound): {ph.get('prepare_s', 0):.1f} s "
        f"before SMTP (syntax + {engine['testbed']['dns_queries']:,} DNS queries), "
        f"{ph.get('smtp_s', 0):.1f} s of SMTP, whose tail is the slowest host, and "
        f"{ph.get('verdicts_s', 0):.1f} s of verdicts. Beyond the bound "
        f"({engine['testbed']['mail_from']:,} MAIL FROM in all: one transaction per session "
        "for all of a host's domains, as the bound assumes), the time before the first "
        "session adds one for one, and every reply "
        "takes longer than its 20 ms while the engine, the testbed (one process serving "
        f"every host, {100 * engine['testbed_cpu_s'] / engine['wall_s']:.0f}% of a core on "
        "average) and anything else running share two cores: the first seconds, when all "
        "hosts are probed at once, slow the slowest host's sessions too.",
    ]
    if "flow" in runs:
        flow = runs["flow"]
        out.append(
            f"The flow took {flow['wall_s']:.1f} s, {flow['wall_s'] / engine['wall_s']:.2f}× "
            "the engine: the same prepare and prober, plus reading the upload, the job row, "
            "the Prefect task runs (one per chunk of host groups) and writing results CSV, "
            "Parquet and history. The Prefect server's start-up "
            f"({flow['phases'].get('prefect_server_start_s', 0):.0f} s here) is paid once per "
            "process, at API start-up, and is not in the figure."
        )
    for key, peer in runs.items():
        if not key.startswith("peer"):
            continue
        rate = peer["addresses"] / peer["wall_s"]
        per = peer["wall_s"] * peer["threads"] / peer["addresses"]
        out.append(
            f"Peer, {peer['threads']} thread(s): {rate:,.0f} addresses/s, "
            f"{per * 1000:.0f} ms per address per thread (a session each: greeting, EHLO, "
            f"MAIL, RCPT, QUIT = 5 replies of {spec.reply_delay * 1000:g} ms, plus an MX and "
            f"an A query); engine ÷ peer = {engine_rate / rate:.1f}×. Up to "
            f"{peer['testbed']['max_host_peak']} sessions at once on one host (ours: "
            f"{engine['testbed']['max_host_peak']}). It cannot tell a catch-all domain, so "
            "its True on those counts as expected here."
        )
    peer50 = [p for k, p in runs.items() if k.startswith("peer") and p["threads"] > 1]
    if peer50:
        threads = max(p["threads"] for p in peer50)
        peer_bound = threads / (5 * spec.reply_delay + 2 * spec.dns_delay)
        measured = max(peer50, key=lambda p: p["threads"])
        out.append(
            f"Why ≥ 20× cannot hold against a {threads}-thread peer: its latency model allows "
            f"{threads} ÷ (5 × {spec.reply_delay * 1000:g} ms + 2 × {spec.dns_delay * 1000:g} "
            f"ms) = {peer_bound:,.0f} addresses/s (measured: "
            f"{measured['addresses'] / measured['wall_s']:,.0f}/s, held down by its "
            f"{measured['cpu_s']:.1f} s of CPU under one GIL and by the testbed answering a new "
            f"session per address), ours at most {n / bound.seconds:,.0f}/s "
            f"(the bound: the slowest host at {spec.reply_delay * 1000:g} ms per reply and 5 "
            f"sessions), so no verifier that keeps to 5 sessions per host can be more than "
            f"{(n / bound.seconds) / peer_bound:.1f}× faster on this world. The peer buys its "
            "rate by ignoring per-host politeness; against the library used one call at a "
            "time the ratio is well over 20×."
        )
    return out


if __name__ == "__main__":
    main()
