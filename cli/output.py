"""What every ``verimail`` command shares about its output: rows as a table, CSV or JSON,
address columns that never break, and help pages without type noise on flags.

It imports nothing of ours, so every command module of ``cli/`` may use it.
"""

from __future__ import annotations

import csv
import json
import sys
from collections.abc import Sequence
from datetime import date, datetime
from enum import StrEnum
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

# Columns holding an address or a domain: printed whole on one line (a table that does not fit
# the terminal wraps its other columns instead); "alice@exam" + "ple.com" cannot be copied.
UNBROKEN_COLUMNS = frozenset({"email", "address", "domain", "did_you_mean", "mx_host"})


class OutputFormat(StrEnum):
    """How ``history`` commands print rows: a table for people, CSV or JSON for programs."""

    table = "table"
    csv = "csv"
    json = "json"


def _plain(value: Any) -> Any:
    """A value as JSON can hold it (datetimes as ISO 8601, anything else unknown as text)."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, datetime | date):
        return value.isoformat()
    return str(value)


def new_table(columns: Sequence[str], **kwargs: Any) -> Table:
    """A table whose address/domain columns are never wrapped or cut (see UNBROKEN_COLUMNS)."""
    table = Table(**kwargs)
    for name in columns:
        unbroken = name in UNBROKEN_COLUMNS
        # (Text: a name is data, never markup or emoji)
        table.add_column(Text(name), no_wrap=unbroken, overflow="fold", min_width=None)
    return table


def print_rows(
    columns: Sequence[str], rows: Sequence[Sequence[Any]], fmt: OutputFormat, out: Console
) -> None:
    """Print ``rows`` as a Rich table on ``out``, or as CSV (a header line, then one line a
    row) or JSON (an array of objects keyed by column) on standard output, unstyled."""
    if fmt is OutputFormat.csv:
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(columns)
        for row in rows:
            writer.writerow(["" if v is None else _plain(v) for v in row])
        return
    if fmt is OutputFormat.json:
        records = [dict(zip(columns, (_plain(v) for v in row), strict=True)) for row in rows]
        sys.stdout.write(json.dumps(records, ensure_ascii=False, indent=2) + "\n")
        return
    print_table(out, columns, [["" if v is None else str(_plain(v)) for v in row] for row in rows])


def _narrowest(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> int:
    """Width of the narrowest table that breaks no word (nor any address): a column is as
    wide as its longest word, or its longest value when it holds addresses; plus borders."""
    width = 1
    for i, name in enumerate(columns):
        cells = [name, *(row[i] for row in rows)]
        if name in UNBROKEN_COLUMNS:
            width += max(len(cell) for cell in cells) + 3
        else:
            width += max((len(word) for cell in cells for word in cell.split()), default=0) + 3
    return width


def print_table(out: Console, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """A table when it fits ``out`` without breaking a word; else one block a row, a line a
    field (as ``psql``'s expanded display): twenty columns squeezed into 80 were ``e…``."""
    if _narrowest(columns, rows) <= out.width:
        table = new_table(columns)
        for row in rows:
            table.add_row(*(Text(cell) for cell in row))
        out.print(table)
        return
    label = max(len(name) for name in columns)
    for number, row in enumerate(rows, 1):
        out.print(Text(f"-[ {number} ]" + "-" * max(0, label - 4), style="dim"))
        for name, cell in zip(columns, row, strict=True):
            out.print(Text(f"{name:<{label}} | {cell}"), soft_wrap=True)


def plain_help() -> None:
    """Typer 0.29's help pages (1) show a value type beside every option, flags included
    (``--help <bool>``, ``--json <bool>``) as if they took a value, and (2) write a required
    argument ``{FILE}``, against the usual ``FILE`` (required) and ``[FILE]`` (optional).

    Typer offers no setting for either; its two methods that render them are wrapped here,
    once, for every command (a test walks all help pages)."""
    from typer.core import TyperArgument, TyperOption

    if getattr(TyperOption.display_type_rich, "_verimail_plain", False):
        return
    shown_type = TyperOption.display_type_rich
    usage_name = TyperArgument._usage_display_name

    def display_type_rich(self: TyperOption, ctx: Any) -> str | None:
        if self.is_flag and not self.count:
            return None
        return shown_type(self, ctx)

    def _usage_display_name(self: TyperArgument) -> str:
        if not self.required:
            return usage_name(self)
        return self.display_name_raw + ("..." if self.nargs != 1 else "")

    display_type_rich._verimail_plain = True  # type: ignore[attr-defined]
    TyperOption.display_type_rich = display_type_rich  # type: ignore[method-assign]
    TyperArgument._usage_display_name = _usage_display_name  # type: ignore[method-assign]
    _whole_paragraphs()


def _unwrapped(paragraph: str) -> str:
    """A docstring paragraph as one line (Rich wraps it at the terminal's width); a
    ``\b`` paragraph keeps its lines, as in click."""
    return paragraph if paragraph.startswith("\b") else " ".join(paragraph.split("\n"))


def _whole_paragraphs() -> None:
    """(3) Typer 0.29 keeps the docstring's own line ends in the command list's one-line
    help and in a help page's later paragraphs, and Rich wraps them again: "exit 1 when an
    SMTP egress / fails" broke mid-sentence at 80 columns. Each paragraph is one line for
    Rich to wrap."""
    import inspect

    from typer import rich_utils

    command_help = rich_utils._make_command_help

    def _make_command_help(*, help_text: str, markup_mode: Any) -> Any:
        first, *rest = inspect.cleandoc(help_text).split("\n\n")
        return command_help(
            help_text="\n\n".join([_unwrapped(first), *rest]), markup_mode=markup_mode
        )

    def _fix_linebreaks(paragraphs: list[str], markup_mode: Any) -> str:
        return "\n\n".join(_unwrapped(p) for p in paragraphs)

    rich_utils._make_command_help = _make_command_help  # type: ignore[assignment]
    rich_utils._fix_linebreaks = _fix_linebreaks  # type: ignore[assignment]


def store_notice(settings: Any) -> str:
    """Which store a command reads and writes, and how to pick the other: the CLI's
    default is ``.verimail/``, the demo's ``.verimail/demo``, and CLI jobs never showed in
    the demo's dashboard, nor the README's ``history job 1`` the demo's job 1."""
    where = str(settings.data_dir)
    default_db = f"sqlite:///{settings.data_dir / 'verimail.db'}"
    if settings.database_url and settings.database_url != default_db:
        from sqlalchemy.engine import make_url

        url = make_url(settings.database_url).render_as_string(hide_password=True)
        where += f", database {url}"
    return (
        f"store: {where} (VERIMAIL_DATA_DIR picks another; the demo prints the line that "
        "points the CLI at its own)"
    )
