"""What every benchmark shares: the machine line, tables, recording, subprocess helpers.

Each benchmark prints its tables (Rich) and appends one section to ``BENCHMARKS.md`` with the
exact command, the machine and a reading of the figures. ``--no-record`` leaves the file alone,
``--output PATH`` writes elsewhere and ``--json PATH`` dumps the rows (the smoke test uses both).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUTPUT = REPO / "BENCHMARKS.md"
RESULT_PREFIX = "BENCH-RESULT "  # the line a measuring subprocess prints its figures on


# --- the machine -----------------------------------------------------------------------


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _memory_gib() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 1024 / 1024
    except OSError:
        pass
    return 0.0


def _git(*args: str) -> str:
    """What a read-only git command prints in the repository, stripped."""
    run = subprocess.run(
        ["git", *args], cwd=REPO, capture_output=True, text=True, check=True, timeout=10
    )
    return run.stdout.strip()


def _commit() -> str:
    """The checked-out commit, and whether the tree had changes (read-only git calls)."""
    try:
        head = _git("rev-parse", "--short", "HEAD")
        dirty = _git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + (" + uncommitted changes" if dirty else "")


_LOAD_AT_START = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0


def machine_line() -> str:
    """Cores, memory, CPU, Python, OS, date, commit and the load when the run started."""
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return (
        f"{os.cpu_count()} cores ({_cpu_model()}), {_memory_gib():.1f} GiB memory, "
        f"Python {platform.python_version()}, {platform.system()} {platform.release()}; "
        f"{now}; commit {_commit()}; 1-minute load average {_LOAD_AT_START:.1f} at start "
        "(other work on the machine slows every figure alike)"
    )


# --- measuring -------------------------------------------------------------------------


def peak_rss_mib() -> float:
    """This process's peak resident set size (VmHWM), in MiB."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def current_rss_mib() -> float:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def stop_process(process: subprocess.Popen[Any], timeout: float = 30.0) -> None:
    """Terminate ``process`` and wait for it; killed if it has not ended within ``timeout``."""
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def emit_result(data: dict[str, Any]) -> None:
    """Print the figures of a measuring subprocess for ``run_measured`` to pick up."""
    print(RESULT_PREFIX + json.dumps(data), flush=True)


def run_measured(
    args: Sequence[str], *, timeout: float, env: dict[str, str] | None = None
) -> dict[str, Any]:
    """Run ``python -m <args>`` from the repo root and return the dict it emitted."""
    cmd = [sys.executable, "-m", *args]
    started = time.perf_counter()
    proc = subprocess.run(
        cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env, check=False
    )
    wall = time.perf_counter() - started
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(RESULT_PREFIX):
            data = json.loads(line[len(RESULT_PREFIX) :])
            data.setdefault("process_wall_s", wall)
            return data
    raise RuntimeError(
        f"{shlex.join(cmd)} exited {proc.returncode} without a result:\n"
        f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )


# --- formatting --------------------------------------------------------------------------


def fmt_int(value: float | int | None) -> str:
    return "–" if value is None else f"{round(value):,}"


def fmt_float(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def fmt_ratio(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value:,.1f}×" if value >= 10 else f"{value:,.2f}×"


@dataclass
class Table:
    """A titled table; the first cell of each row names it (the smoke test checks those)."""

    title: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)

    def add(self, *cells: Any) -> None:
        self.rows.append([str(c) for c in cells])

    def markdown(self) -> str:
        def esc(text: str) -> str:
            return text.replace("|", "\\|")

        lines = [
            "| " + " | ".join(esc(c) for c in self.columns) + " |",
            "|" + "|".join("---" if i == 0 else "---:" for i in range(len(self.columns))) + "|",
        ]
        lines += ["| " + " | ".join(esc(c) for c in row) + " |" for row in self.rows]
        return f"**{self.title}**\n\n" + "\n".join(lines)

    def print(self) -> None:
        from rich.console import Console
        from rich.table import Table as RichTable

        table = RichTable(title=self.title, title_justify="left")
        for i, column in enumerate(self.columns):
            table.add_column(column, justify="left" if i == 0 else "right", overflow="fold")
        for row in self.rows:
            table.add_row(*row)
        Console(width=200).print(table)


def target_cell(met: bool | None) -> str:
    return "–" if met is None else ("met" if met else "**missed**")


# --- command line and recording ---------------------------------------------------------


def add_output_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--no-record", action="store_true", help="Print only; do not append to BENCHMARKS.md."
    )
    parser.add_argument(
        "--output",
        type=Path,
        default=DEFAULT_OUTPUT,
        help="Markdown file the section is appended to (default: BENCHMARKS.md).",
    )
    parser.add_argument("--json", type=Path, default=None, help="Also write the tables as JSON.")


def command_text(module: str, argv: Sequence[str] | None = None) -> str:
    """The command that reproduces this run, as typed from the repository root."""
    argv = sys.argv[1:] if argv is None else argv
    return " ".join(["python", "-m", module, *(shlex.quote(a) for a in argv)])


def publish(
    args: argparse.Namespace,
    *,
    title: str,
    command: str,
    tables: Sequence[Table],
    reading: Sequence[str],
    extra: dict[str, Any] | None = None,
) -> None:
    """Print the tables and the reading; append the section; dump JSON if asked."""
    for table in tables:
        table.print()
    print()
    for paragraph in reading:
        print("- " + paragraph)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        payload = {"title": title, "tables": [asdict(t) for t in tables], "extra": extra or {}}
        args.json.write_text(json.dumps(payload, indent=2, default=str), encoding="utf-8")
    if args.no_record:
        return
    section = [
        f"## {title}",
        "",
        f"Command: `{command}`  ",
        f"Machine: {machine_line()}",
        "",
    ]
    for table in tables:
        section += [table.markdown(), ""]
    section += ["Reading:", ""]
    section += ["- " + paragraph for paragraph in reading]
    section.append("")
    output: Path = args.output
    output.parent.mkdir(parents=True, exist_ok=True)
    existing = output.read_text(encoding="utf-8") if output.exists() else "# Benchmarks\n"
    if not existing.endswith("\n"):
        existing += "\n"
    output.write_text(existing + "\n" + "\n".join(section), encoding="utf-8")
    print(f"\nappended to {output}")
