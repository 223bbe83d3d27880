"""``verimail verify``: the engine from the command line (no API, no accounts)."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from verimail.cli.progress import STATUS_NAMES, JobProgress, summary_table
from verimail.schemas.limits import TIMEOUT_MAX, TIMEOUT_MIN
from verimail.schemas.outcomes import SubStatus

if TYPE_CHECKING:
    from verimail.engine import BatchResult, Engine

# The engine and the file reader (Polars) are imported when the command runs:
# ``verimail --help`` loads this module too (tests/test_cli_help.py).

STATUS_STYLE = {
    "valid": "green",
    "likely_valid": "green",
    "invalid": "red",
    "disposable": "magenta",
    "risky": "yellow",
    "catchall": "yellow",
    "unknown": "dim",
}


def read_address_file(path: Path) -> tuple[list[str], str | None]:
    """One address a line; blank lines and ``#`` comments skipped. A first line that is an
    email header (``email``, ``E-mail Address`` …: a one-column CSV) is no address: it is
    left out and returned apart, so the caller can say so (it came back "invalid")."""
    from verimail.files.csv_columns import EMAIL_HEADERS, header_key

    lines = path.read_text(encoding="utf-8-sig", errors="replace").splitlines()
    listed = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    if listed and "@" not in listed[0] and header_key(listed[0]) in EMAIL_HEADERS:
        return listed[1:], listed[0]
    return listed, None


def verify_command(
    addresses: list[str] = typer.Argument(None, metavar="ADDRESS", help="Addresses to verify."),
    file: Path | None = typer.Option(None, "--file", "-f", help="File of addresses, one a line."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON lines, one result per address."),
    show_stats: bool = typer.Option(False, "--stats", help="Print DNS/SMTP counters."),
    timeout: float | None = typer.Option(
        None,
        "--timeout",
        min=TIMEOUT_MIN,
        max=TIMEOUT_MAX,
        help="Deadline in seconds (1-60): what is not settled by then is unknown/timeout. "
        "Default: VERIMAIL_VERIFY_TIMEOUT for addresses given here, none with --file.",
    ),
    retry_greylisted: float | None = typer.Option(
        None,
        "--retry-greylisted",
        is_flag=False,
        flag_value=0.0,
        min=0,
        metavar="[DELAY]",
        help="Wait for greylisting to pass and ask again once: after DELAY seconds, or "
        "without one after the servers' retry_after. Off: greylisted is answered at once.",
    ),
) -> None:
    """Verify addresses: syntax, DNS, SMTP, catch-all, lists, verdict."""
    from verimail.config import get_settings
    from verimail.engine import Engine
    from verimail.files.csv_detect import looks_delimited

    todo = list(addresses or [])
    if file is not None:
        if not file.is_file():
            raise typer.BadParameter(f"{file} is not a file", param_hint="--file")
        listed, header = read_address_file(file)
        if header is not None:
            Console(stderr=True).print(
                Text(f"(the first line, {header!r}, is a header: not verified)", style="dim")
            )
        if not listed:
            raise typer.BadParameter(f"{file} holds no addresses", param_hint="--file")
        if looks_delimited(listed):
            raise typer.BadParameter(
                f"{file} looks like a CSV file (its lines hold several fields); "
                "`verimail bulk FILE` verifies its email column",
                param_hint="--file",
            )
        todo += listed
    if not todo:
        raise typer.BadParameter("give at least one address or --file")
    err = Console(stderr=True)
    settings = get_settings()
    engine = Engine(settings)
    if timeout is None and file is None:
        timeout = settings.verify_timeout
    outcome = asyncio.run(_run(engine, todo, err, show_progress=file is not None, timeout=timeout))
    if retry_greylisted is not None:
        asyncio.run(_retry_greylisted(engine, outcome, err, retry_greylisted, timeout))
    if as_json:
        for result in outcome.results:
            sys.stdout.write(json.dumps(result.model_dump(mode="json"), ensure_ascii=False) + "\n")
    else:
        _print_table(outcome)
    if show_stats:
        err.print_json(data=outcome.stats.as_dict())


async def _run(
    engine: Engine,
    todo: list[str],
    err: Console,
    show_progress: bool,
    timeout: float | None,
) -> BatchResult:
    """One pass; greylisting is answered at once (``--retry-greylisted`` waits apart).

    With a file, the progress of ``verimail bulk``: the pace, an ETA and the counts by
    status so far (the results come from :meth:`Engine.stream` as they settle), then the
    summary table of the counts."""
    if not show_progress:
        return await engine.verify_many(todo, timeout=timeout, greylist_retries=0)
    from verimail.engine import BatchResult, EngineStats

    inputs = list(dict.fromkeys(todo))
    counts = dict.fromkeys(STATUS_NAMES, 0)
    results = {}
    stats = EngineStats()
    with JobProgress(err, len(inputs)) as progress:
        progress.show(0, counts)
        async for raw, result in engine.stream(
            inputs, stats=stats, timeout=timeout, greylist_retries=0
        ):
            results[raw] = result
            counts[result.status.value] = counts.get(result.status.value, 0) + 1
            progress.show(len(results), counts, final=len(results) == len(inputs))
    err.print(summary_table(counts))
    return BatchResult([results[raw] for raw in todo], stats)


async def _retry_greylisted(
    engine: Engine, outcome: BatchResult, err: Console, delay: float, timeout: float | None
) -> None:
    """Wait ``delay`` seconds (0: the longest ``retry_after`` of the greylisted results) with
    a progress line, then ask once more about the greylisted addresses with the same
    envelope sender, so the greylist triplets the first try opened can pass. Their results
    in ``outcome`` are replaced."""
    waiting = [i for i, r in enumerate(outcome.results) if r.sub_status is SubStatus.GREYLISTED]
    if not waiting:
        return
    wait = delay or max(outcome.results[i].retry_after or 0 for i in waiting)
    n = len({outcome.results[i].email for i in waiting})
    columns = (TextColumn("{task.description}"), BarColumn(), TimeRemainingColumn())
    with Progress(*columns, console=err, transient=True) as progress:
        line = f"{n} greylisted: asking again in {wait:g} s"
        task = progress.add_task(line, total=wait)
        loop = asyncio.get_running_loop()
        until = loop.time() + wait
        while (left := until - loop.time()) > 0:
            progress.update(task, completed=wait - left)
            await asyncio.sleep(min(1.0, left))
    err.print(f"asking again about {n} greylisted address{'es' if n != 1 else ''}")
    again = await engine.verify_many(
        [outcome.results[i].email for i in waiting], timeout=timeout, greylist_retries=0
    )
    for i, result in zip(waiting, again.results, strict=True):
        outcome.results[i] = result
    outcome.stats.smtp.add(again.stats.smtp)


REASON_MIN_WIDTH = 30
"""Narrower than this, the reason goes under the table, a line an address: at 80 columns
it was wrapped one word a line, twenty lines for one address."""


def _print_table(outcome: BatchResult) -> None:
    console = Console()
    rows = [
        (r, [r.email, r.status.value, r.sub_status.value, f"{r.confidence_score:.2f}"])
        for r in outcome.results
    ]
    columns = ["email", "status", "sub_status", "score"]
    if any(r.did_you_mean for r in outcome.results):
        columns.append("did_you_mean")
        for r, cells in rows:
            cells.append(r.did_you_mean or "")
    widths = [
        max(len(c) for c in [name, *(cells[i] for _, cells in rows)])
        for i, name in enumerate(columns)
    ]
    left = console.width - sum(w + 3 for w in widths) - 4  # (borders and padding)
    inline = left >= REASON_MIN_WIDTH
    table = Table(*columns, *(["reason"] if inline else []), show_lines=False)
    for column in table.columns[: len(columns)]:
        column.no_wrap = True  # (an address, a status stay whole; the reason wraps instead)
    for r, cells in rows:
        style = STATUS_STYLE.get(r.status.value, "")
        # Text, not markup: an address or a server's reply may hold "[/]" or ":x:".
        texts = [Text(cell) for cell in cells]
        texts[1].stylize(style)
        table.add_row(*texts, *([Text(r.reason)] if inline else []))
    console.print(table)
    if not inline:
        for r, _ in rows:
            console.print(Text.assemble((r.email, "bold"), ": ", r.reason))
