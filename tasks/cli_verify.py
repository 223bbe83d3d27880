"""``verimail verify``: the engine from the command line (no API, no accounts)."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from verimail.config import get_settings
from verimail.tasks.engine import BatchResult, Engine

STATUS_STYLE = {
    "valid": "green",
    "likely_valid": "green",
    "invalid": "red",
    "disposable": "magenta",
    "risky": "yellow",
    "catchall": "yellow",
    "unknown": "dim",
}


def read_address_file(path: Path) -> list[str]:
    """One address a line; blank lines and ``#`` comments skipped."""
    lines = path.read_text(encoding="utf-8-sig", errors="replace").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def looks_like_csv(lines: list[str]) -> bool:
    """Most of the first lines hold a comma, semicolon or tab (which an address list does not):
    each line would be checked whole and come back invalid, the file "verified"."""
    sample = lines[:20]
    split = [line for line in sample if any(d in line for d in (",", ";", "\t"))]
    return len(split) * 2 > len(sample)


def verify_command(
    addresses: list[str] = typer.Argument(None, metavar="ADDRESS", help="Addresses to verify."),
    file: Path | None = typer.Option(None, "--file", "-f", help="File of addresses, one a line."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON lines, one result per address."),
    show_stats: bool = typer.Option(False, "--stats", help="Print DNS/SMTP counters."),
) -> None:
    """Verify addresses: syntax, DNS, SMTP, catch-all, lists, verdict."""
    todo = list(addresses or [])
    if file is not None:
        if not file.is_file():
            raise typer.BadParameter(f"{file} is not a file", param_hint="--file")
        listed = read_address_file(file)
        if not listed:
            raise typer.BadParameter(f"{file} holds no addresses", param_hint="--file")
        if looks_like_csv(listed):
            raise typer.BadParameter(
                f"{file} looks like a CSV file (its lines hold several fields); "
                "`verimail bulk FILE` verifies its email column",
                param_hint="--file",
            )
        todo += listed
    if not todo:
        raise typer.BadParameter("give at least one address or --file")
    err = Console(stderr=True)
    engine = Engine(get_settings())
    outcome = asyncio.run(_run(engine, todo, err, show_progress=file is not None))
    if as_json:
        for result in outcome.results:
            sys.stdout.write(json.dumps(result.model_dump(mode="json"), ensure_ascii=False) + "\n")
    else:
        _print_table(outcome)
    if show_stats:
        err.print_json(data=outcome.stats.as_dict())


async def _run(engine: Engine, todo: list[str], err: Console, show_progress: bool) -> BatchResult:
    if not show_progress:
        return await engine.verify_many(todo)
    columns = (BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=err, transient=True) as progress:
        task = progress.add_task("verifying", total=len(set(todo)))
        return await engine.verify_many(
            todo, on_progress=lambda done: progress.update(task, completed=done)
        )


def _print_table(outcome: BatchResult) -> None:
    table = Table(
        "email", "status", "sub_status", "score", "did_you_mean", "reason", show_lines=False
    )
    table.columns[0].no_wrap = True  # (an address stays whole; the reason wraps instead)
    for r in outcome.results:
        style = STATUS_STYLE.get(r.status.value, "")
        # Text, not markup: an address or a server's reply may hold "[/]" or ":x:".
        table.add_row(
            Text(r.email), Text(r.status.value, style=style), r.sub_status.value,
            f"{r.confidence_score:.2f}", Text(r.did_you_mean or ""), Text(r.reason),
        )  # fmt: skip
    Console().print(table)
