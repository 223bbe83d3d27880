"""CSV ingest and results writing: our path against Python's ``csv`` module.

``python -m bench.ingest [--rows 1000000]`` writes a generated 6-column upload
(:mod:`bench.data`), then runs each implementation in its own process
(:mod:`bench.ingest_worker`) for time and peak RSS:

- ingest: sniff + detect the email column + count, load the column, normalise, dedupe, group
  by domain — ours (``read_emails``: ``inspect_csv`` + ``load_emails`` from one read on the
  native fast path; ``normalise_emails``; Polars) against a one-pass ``csv.reader`` + dict
  implementation; and ours for a file the fast path refuses (the tokenizer fallback);
- results file: ``values_for_rows`` + ``write_results_csv`` (the original bytes plus
  ``Safe to Send``) against ``csv.reader`` → ``csv.writer``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
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
from bench.data import write_upload

INGESTS = ("ours", "csv", "ours-fallback")


def _run(impl: str, path: Path, timeout: float) -> dict[str, Any]:
    return run_measured(
        ["bench.ingest_worker", "--impl", impl, "--path", str(path)], timeout=timeout
    )


def _median_run(trials: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median wall time (the lower middle of an even count), with every
    run's wall time and the highest peak RSS kept beside it."""
    ordered = sorted(trials, key=lambda run: run["wall_s"])
    return {
        **ordered[(len(ordered) - 1) // 2],
        "walls_s": [run["wall_s"] for run in trials],
        "peak_rss_mib": max(run["peak_rss_mib"] for run in trials),
    }


def _wall_cell(run: dict[str, Any]) -> str:
    walls = run["walls_s"]
    if len(walls) == 1:
        return fmt_float(run["wall_s"])
    return f"{fmt_float(run['wall_s'])} ({min(walls):.2f}–{max(walls):.2f})"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="data rows (default 1M)")
    parser.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="fresh-process runs of each ingest, interleaved; the median run is reported",
    )
    parser.add_argument("--timeout", type=float, default=900)
    add_output_args(parser)
    args = parser.parse_args(argv)

    runs: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="verimail-bench-ingest-") as tmp:
        path = Path(tmp, "upload.csv")
        started = time.perf_counter()
        truth = write_upload(path, args.rows)
        gen_s = time.perf_counter() - started
        size_mb = path.stat().st_size / 1e6
        trials: dict[str, list[dict[str, Any]]] = {}
        # Interleaved, so that a slow spell of a shared machine falls on every side alike.
        for _ in range(max(1, args.repeat)):
            for impl in INGESTS:
                trials.setdefault(impl, []).append(_run(impl, path, args.timeout))
        runs = {impl: _median_run(found) for impl, found in trials.items()}
        for impl in ("write-ours", "write-csv"):
            runs[impl] = _run(impl, path, args.timeout)

    ours, base, refused = runs["ours"], runs["csv"], runs["ours-fallback"]
    for impl in ("ours", "ours-fallback", "csv"):
        found = runs[impl]["counts"]
        if found["unique_addresses"] != truth["unique_addresses"]:
            raise RuntimeError(f"{impl} found {found} but the file holds {truth}")
        if found != base["counts"]:  # rows, addresses, domains, the column: all alike
            raise RuntimeError(f"{impl} found {found} but the csv module {base['counts']}")

    ingest = Table(
        f"CSV ingest: {args.rows:,} rows × 6 columns, {size_mb:,.0f} MB "
        f"({truth['unique_addresses']:,} unique addresses, {ours['counts']['domains']:,} domains)",
        ["implementation", "wall s, median (range)", "rows/s", "peak RSS MiB", "steps (s)"],
    )
    for name, run in (("verimail (tokenizer + Polars)", ours), ("Python csv module", base)):
        ingest.add(
            name,
            _wall_cell(run),
            fmt_int(args.rows / run["wall_s"]),
            fmt_int(run["peak_rss_mib"]),
            "; ".join(f"{k} {v:.2f}" for k, v in run["steps"].items()),
        )
    speedup = base["wall_s"] / ours["wall_s"]
    writing = Table(
        "Results file: original columns + Safe to Send",
        ["implementation", "wall s", "rows/s", "peak RSS MiB", "steps (s)"],
    )
    for name, run in (
        ("verimail (values_for_rows + write_results_csv)", runs["write-ours"]),
        ("Python csv.reader → csv.writer", runs["write-csv"]),
    ):
        writing.add(
            name,
            fmt_float(run["wall_s"]),
            fmt_int(args.rows / run["wall_s"]),
            fmt_int(run["peak_rss_mib"]),
            "; ".join(f"{k} {v:.2f}" for k, v in run["steps"].items()),
        )
    write_speedup = runs["write-csv"]["wall_s"] / runs["write-ours"]["wall_s"]
    targets = Table("Ratios (same run) and targets", ["comparison", "figure", "target", "verdict"])
    scale = 1_000_000 / args.rows
    targets.add(
        "ingest wall (ours)",
        f"{ours['wall_s']:.2f} s",
        "≤ 20 s at 1M rows",
        target_cell(ours["wall_s"] * scale <= 20),
    )
    targets.add(
        "ingest peak RSS (ours)",
        f"{ours['peak_rss_mib']:,.0f} MiB",
        "≤ 2 GB at 1M rows",
        target_cell(ours["peak_rss_mib"] * 1.048576 <= 2000),
    )
    targets.add("csv wall ÷ ours (ingest)", fmt_ratio(speedup), "≥ 5×", target_cell(speedup >= 5))
    fallback = base["wall_s"] / refused["wall_s"]
    targets.add(
        "csv wall ÷ ours, refused by the fast path (ingest)",
        f"{fmt_ratio(fallback)} ({refused['wall_s']:.2f} s)",
        "–",
        "–",
    )
    targets.add("csv wall ÷ ours (results file)", fmt_ratio(write_speedup), "–", "–")

    steps = ours["steps"]
    read_s = sum(v for k, v in steps.items() if k.startswith(("inspect", "load")))
    polars_s = sum(steps.values()) - read_s
    verdict = (
        "meets the ≥ 5× target."
        if speedup >= 5
        else f"misses the ≥ 5× target: the Polars steps alone ({polars_s:.2f} s) would cap "
        f"it at {base['wall_s'] / polars_s:.1f}× even if reading the file cost nothing."
    )
    repeat = len(ours["walls_s"])
    reading = [
        f"Each ingest ran {repeat} time{'s' if repeat > 1 else ''} in a fresh process, the "
        "implementations taking turns; each row shows its median run (and the range), and "
        "the ratio is of the medians. This machine is shared: one run of the same code "
        "varies by ±20%.",
        f"Ours takes {ours['wall_s']:.2f} s: {read_s:.2f} s to sniff the file, count its rows "
        "and load the email column from one read (the native fast path: the file is read "
        "once into memory, Polars streams it as lines, summing up the checks that every line is "
        "one the tokenizer reads the same way, and reads the email column as CSV; this CRLF "
        "file with quoted "
        f"cells qualifies), and {polars_s:.2f} s of Polars work on the rows (normalise the cells "
        "that are not normal already, dedupe on a checked 64-bit hash, group by domain). The "
        "csv module does everything in one pass of its C reader with "
        f"dicts in {base['wall_s']:.2f} s, so ours is {speedup:.2f}× its speed and {verdict}",
        "A file the fast path refuses (bare-CR line ends, line breaks inside quoted cells, "
        'stray quotes such as 5" screen; non-UTF-8 files are not even tried) goes through the '
        "Python tokenizer, two passes; refused after all its checks, as measured here, it "
        f"takes {refused['wall_s']:.2f} s, {fallback:.2f}× the csv module. Module imports "
        "(Polars, verimail) are start-up and untimed on both sides.",
        f"Memory: {ours['peak_rss_mib']:,.0f} MiB peak for ours (the file's bytes and the email "
        "cells while reading, then Polars frames of row, email and normalised, which share "
        "the cells that needed no change) against "
        f"{base['peak_rss_mib']:,.0f} MiB for the csv module (a dict of unique addresses); "
        "both far under 2 GB.",
        f"The results file: ours {runs['write-ours']['wall_s']:.1f} s against "
        f"{runs['write-csv']['wall_s']:.1f} s for csv.reader → csv.writer (csv ÷ ours = "
        f"{write_speedup:.2f}×), and ours keeps every original byte (quoting, line ends, "
        "encoding) where the csv module re-quotes the file. Ours spends "
        f"{runs['write-ours']['steps'].get('values per row', 0):.1f} s mapping each row's "
        "address to its value (a Polars join), the rest in the per-line tokenizer (writing "
        "has no fast path: it must keep every byte).",
        f"Generating the {size_mb:,.0f} MB file took {gen_s:.1f} s (not measured above).",
    ]
    publish(
        args,
        title=f"CSV ingest ({args.rows:,} rows)",
        command=command_text("bench.ingest", argv),
        tables=[ingest, writing, targets],
        reading=reading,
        extra={"runs": runs, "truth": truth},
    )
    return {"runs": runs, "tables": [ingest, writing, targets]}


if __name__ == "__main__":
    main()
