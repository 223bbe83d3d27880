"""How long ``verimail --help`` and ``verimail verify --help`` take, in fresh interpreters.

``--before DIR`` times another tree too, alternating run by run so both see the same load:
``DIR`` holds that tree as a ``verimail`` folder (``git archive main --prefix=verimail/ |
tar -x -C DIR``), put first on ``PYTHONPATH``. Prints one line per command (median of
``--runs``); the figures are copied into docs/cli.md by hand.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

RUN_CLI = "from verimail.cli import main; main()"
COMMANDS = (["--help"], ["verify", "--help"])


def _once(words: list[str], tree: str | None) -> float:
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = tree
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-c", RUN_CLI, *words], env=env, stdout=subprocess.DEVNULL, check=True
    )
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--before", help="a folder holding the older tree as verimail/")
    args = parser.parse_args()
    for words in COMMANDS:
        new: list[float] = []
        old: list[float] = []
        for _ in range(args.runs):
            if args.before:
                old.append(_once(words, args.before))
            new.append(_once(words, None))
        line = f"verimail {' '.join(words)}: {statistics.median(new):.2f} s"
        if old:
            line += f" (before: {statistics.median(old):.2f} s)"
        print(f"{line}, median of {args.runs}")


if __name__ == "__main__":
    main()
