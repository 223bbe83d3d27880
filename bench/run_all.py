"""Every benchmark at its default size, one after the other (``make bench``, ~6–7 minutes).

``python -m bench.run_all [--no-record] [--output PATH]`` runs ``bench.throughput``,
``bench.scaling``, ``bench.ingest`` and ``bench.api`` as separate processes, each appending its
own section. The big scaling run is not included: ``python -m bench.scaling --sizes
2000,20000,200000``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

from bench.common import REPO

BENCHES = ("throughput", "scaling", "ingest", "api", "finder")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-record", action="store_true")
    parser.add_argument("--output", default=None)
    parser.add_argument("--only", default=",".join(BENCHES), help="comma-separated subset")
    args = parser.parse_args(argv)
    passthrough = ["--no-record"] if args.no_record else []
    if args.output:
        passthrough += ["--output", args.output]
    failed = []
    for name in [b for b in args.only.split(",") if b]:
        print(f"\n=== bench.{name} ===", flush=True)
        started = time.perf_counter()
        code = subprocess.run([sys.executable, "-m", f"bench.{name}", *passthrough], cwd=REPO)
        print(f"=== bench.{name}: exit {code.returncode} in {time.perf_counter() - started:.0f} s")
        if code.returncode:
            failed.append(name)
    if failed:
        print("failed: " + ", ".join(failed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
