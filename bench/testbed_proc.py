"""The benchmark world's testbed, served from its own process.

``python -m bench.testbed_proc --spec '<WorldSpec as JSON>'`` (or ``--world-yaml FILE``)
prints one JSON line ``{"nameserver": "ip:port", "smtp_port": n}`` when everything listens,
then answers one JSON line per command read on stdin: ``stats`` (server-side counters since
the last reset, after open sessions have closed), ``reset``, ``quit``. Not meant to be run by
hand.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
from collections import Counter

from bench.world import WorldSpec, build_world
from verimail.testbed.server import Testbed
from verimail.testbed.world import load_world


def _stats(tb: Testbed) -> dict:
    tb.wait_idle(timeout=30)
    dns: Counter[str] = Counter()
    for (_name, rdtype), n in tb.dns_queries.items():
        dns[rdtype] += n
    total = tb.total_stats()
    hosts = {name: tb.host_stats(name) for name in tb.world.hosts}
    peaks = {name: stats.peak_concurrent for name, stats in hosts.items()}
    busiest = max(peaks, key=lambda n: peaks[n]) if peaks else ""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "cpu_s": usage.ru_utime + usage.ru_stime,  # cumulative: callers take differences
        "dns": dict(dns),
        "dns_queries": sum(dns.values()),
        "sessions": total.sessions,
        "mail_from": total.mail_from,
        "rcpt_to": total.rcpt_to,
        "rejections": total.rejections,
        "peak_concurrent": total.peak_concurrent,
        "max_host_peak": peaks.get(busiest, 0),
        "max_host_peak_host": busiest,
        "host_sessions": {name: stats.sessions for name, stats in hosts.items()},
        "host_peaks": peaks,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--spec", help="a WorldSpec as JSON")
    source.add_argument("--world-yaml", help="a world file (testbed/world.py's YAML form)")
    args = parser.parse_args()
    if args.spec:
        world, _ = build_world(WorldSpec(**json.loads(args.spec)))
    else:
        world = load_world(args.world_yaml)
    with Testbed(world) as tb:
        ip, port = tb.nameserver
        print(json.dumps({"nameserver": f"{ip}:{port}", "smtp_port": tb.smtp_port}), flush=True)
        for line in sys.stdin:
            command = line.strip()
            if command == "stats":
                print(json.dumps(_stats(tb)), flush=True)
            elif command == "reset":
                tb.wait_idle(timeout=30)
                tb.reset_stats()
                tb.reset_greylist()
                print("{}", flush=True)
            elif command in ("quit", ""):
                break


if __name__ == "__main__":
    main()
