"""``verimail find FIRST LAST DOMAIN``: one Email Finder lookup from the command line.

Runs the engine directly: no API, no credits. The caller may pass the store's learned
domain patterns (``cli/jobs.py`` does, booked to the CLI's operator account). The command
itself (with its ``--file`` form, which runs the find-emails flow) is in ``cli/jobs.py``.
"""

from __future__ import annotations

import asyncio
import sys

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from verimail.engine import Engine, FinderInputError, FinderResult, PatternMemory, find_email

STATUS_STYLE = {"found": "green", "catch_all": "yellow", "not_found": "red"}


def find_one(
    first_name: str,
    last_name: str,
    domain: str,
    *,
    as_json: bool,
    max_probes: int | None,
    patterns: PatternMemory | None = None,
) -> None:
    """Look one person up and print the answer (a table, or JSON)."""
    from verimail.config import get_settings

    settings = get_settings()
    engine = Engine(settings)
    probes = max_probes or settings.finder_max_probes
    try:
        result = asyncio.run(
            find_email(engine, first_name, last_name, domain, max_probes=probes, patterns=patterns)
        )
    except FinderInputError as exc:
        param = {"first_name": "FIRST", "last_name": "LAST", "domain": "DOMAIN"}
        raise typer.BadParameter(exc.detail, param_hint=param.get(exc.field or "")) from exc
    if as_json:
        sys.stdout.write(result.model_dump_json() + "\n")
    else:
        _print(result)


def _print(result: FinderResult) -> None:
    style = STATUS_STYLE.get(result.status, "")
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    # Text, not markup: a name, an address or a server's reply may hold "[/]" or ":x:".
    table.add_row("status", Text(result.status, style=style))
    table.add_row("email", Text(result.email or "—"))
    table.add_row("confidence", f"{result.confidence:.2f}")
    if result.pattern:
        table.add_row("pattern", Text(result.pattern))
    if result.alternatives:
        table.add_row("tried", Text("\n".join(result.alternatives)))
    table.add_row("reason", Text(result.reason))
    table.add_row("time", f"{result.elapsed_ms} ms")
    Console().print(table)
