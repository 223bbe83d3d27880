"""``verimail history ...``: the verification history (DuckDB over the Parquet files).

Three shortcuts answer the usual questions without SQL: an address's verifications over
time, the results a job wrote, the latest verdict of each address at a domain. ``query``
runs any SQL over the views ``history``, ``latest`` and ``changes``. Every command prints a
table for people (the main columns; a table too wide for the terminal becomes one block per
row) or, with ``--format csv|json``, every column for programs.
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console

from verimail.cli.output import OutputFormat, print_rows, store_notice

history_app = typer.Typer(
    help="The verification history: an address, a job, a domain, or any SQL (DuckDB).",
    no_args_is_help=True,
)
err = Console(stderr=True)

FormatOption = Annotated[
    OutputFormat,
    typer.Option("--format", "-F", help="table (for people), csv or json (every column)."),
]
LimitOption = Annotated[int, typer.Option("--limit", "-n", min=1, help="Rows to print at most.")]

# The columns a table shows (csv/json give them all); the one a shortcut filters on is left out.
RESULT_COLUMNS = ["status", "sub_status", "confidence_score", "reason", "verified_at"]


def _print(
    sql: str, params: list[object], fmt: OutputFormat, limit: int, hint: str, what: str
) -> None:
    import duckdb

    from verimail.config import get_settings
    from verimail.files.history import query_rows

    settings = get_settings()
    err.print(store_notice(settings), markup=False, highlight=False, soft_wrap=True)
    try:
        columns, rows, more = query_rows(settings.data_dir, sql, limit, params)
    except duckdb.Error as exc:
        raise typer.BadParameter(str(exc).splitlines()[0], param_hint=hint) from exc
    if not columns:
        err.print("(no result)")
        return
    if not rows and fmt is OutputFormat.table:
        err.print(f"(no rows: nothing in the history for {what})", markup=False, highlight=False)
        return
    print_rows(columns, rows, fmt, Console())
    if more:
        err.print(f"(more rows: raise --limit to see past {limit})")


def _select(table_columns: list[str], fmt: OutputFormat) -> str:
    return ", ".join(table_columns) if fmt is OutputFormat.table else "*"


@history_app.command("address")
def history_address(
    email: Annotated[str, typer.Argument(metavar="ADDRESS", help="The email address.")],
    fmt: FormatOption = OutputFormat.table,
    limit: LimitOption = 50,
) -> None:
    """Every verification of one address, newest first (status changes show over time)."""
    columns = _select([*RESULT_COLUMNS, "job_id", "source"], fmt)
    sql = f"SELECT {columns} FROM history WHERE lower(email) = lower(?) ORDER BY verified_at DESC"
    _print(sql, [email.strip()], fmt, limit, "ADDRESS", email)


@history_app.command("job")
def history_job(
    job_id: Annotated[int, typer.Argument(metavar="JOB_ID", min=1, help="The job's id.")],
    fmt: FormatOption = OutputFormat.table,
    limit: LimitOption = 50,
) -> None:
    """The results one job wrote to the history, one row per distinct address."""
    columns = _select(["email", *RESULT_COLUMNS], fmt)
    sql = f"SELECT {columns} FROM history WHERE job_id = ? ORDER BY email, verified_at"
    _print(sql, [job_id], fmt, limit, "JOB_ID", f"job {job_id}")


@history_app.command("domain")
def history_domain(
    domain: Annotated[str, typer.Argument(metavar="DOMAIN", help="The domain (acme.com).")],
    fmt: FormatOption = OutputFormat.table,
    limit: LimitOption = 50,
) -> None:
    """The latest verdict of each address at a domain, by address."""
    columns = _select(["email", *RESULT_COLUMNS], fmt)
    name = domain.strip().lstrip("@").rstrip(".")
    sql = f"SELECT {columns} FROM latest WHERE lower(domain) = lower(?) ORDER BY email"
    _print(sql, [name], fmt, limit, "DOMAIN", name)


@history_app.command("query")
def history_query(
    sql: Annotated[
        str, typer.Argument(metavar="SQL", help="SQL over the views history, latest, changes.")
    ],
    fmt: FormatOption = OutputFormat.table,
    limit: LimitOption = 50,
) -> None:
    """Run DuckDB SQL over the history, e.g. "SELECT status, count(*) FROM latest GROUP BY 1"."""
    _print(sql, [], fmt, limit, "SQL", "this query")
