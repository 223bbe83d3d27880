"""``verimail bulk``, ``verimail history query`` and ``verimail deploy``: flows from a shell."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn
from rich.table import Table

from verimail.config import get_settings

console = Console(stderr=True)
history_app = typer.Typer(help="Query the verification history (DuckDB over Parquet).")

CLI_ACCOUNT_EMAIL = "cli@verimail.localhost"


def bulk_command(
    file: Path = typer.Argument(..., exists=True, dir_okay=False, help="CSV of addresses."),
    column: str | None = typer.Option(None, "--column", "-c", help="The email column."),
    out: Path | None = typer.Option(None, "--out", "-o", help="Where to write results CSV."),
) -> None:
    """Verify a CSV with the bulk-verify flow, here and now, with a progress bar.

    The job is booked to an operator account (``cli@verimail.localhost``, enterprise plan)
    that is granted exactly the credits the file needs, so the ledger stays complete.
    """
    from verimail.flows.context import store_for
    from verimail.flows.runner import LocalRunner
    from verimail.store import accounts, credits
    from verimail.store import jobs as job_store
    from verimail.tasks.bulk_io import read_job_input
    from verimail.tasks.csv_detect import UploadError

    settings = get_settings()
    try:
        job_input = read_job_input(file, column, settings.upload_max_rows)
    except UploadError as exc:
        raise typer.BadParameter(exc.detail, param_hint="FILE") from exc
    count = job_input.address_rows
    store = store_for(settings)
    account = accounts.get_account_by_email(store.engine, CLI_ACCOUNT_EMAIL)
    if account is None:
        account = accounts.create_account(
            store.engine,
            settings.model_copy(update={"signup_credits": 0}),
            plan="enterprise",
            email=CLI_ACCOUNT_EMAIL,
        )
    credits.grant(store.engine, account.id, count, reason=f"verimail bulk {file.name}")
    job = job_store.create_job(
        store.engine,
        account.id,
        "bulk_csv",
        count,
        reserve=count,
        upload_path=str(file.resolve()),
        email_column=job_input.info.email_column,
        options={"source": "cli"},
    )
    assert job is not None  # just granted
    console.print(
        f"job {job.id}: {count} addresses ({len(job_input.uniques)} unique) from "
        f"column {job_input.info.email_column!r}; starting the flow (Prefect may take a few "
        "seconds to start)…"
    )
    runner = LocalRunner(settings)
    runner.submit("bulk", job.id)
    columns = (BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        bar = progress.add_task("verifying", total=max(count, 1))
        while True:
            current = job_store.get_job_any(store.engine, job.id)
            assert current is not None
            progress.update(bar, completed=current.processed_emails)
            if current.finished:
                break
            time.sleep(0.2)
    runner.wait()
    runner.shutdown()
    if current.status != "completed":
        console.print(f"[red]job {job.id} failed:[/] {current.failed_reason}")
        raise typer.Exit(1)
    target = out or file.with_name(f"{file.stem}.results.csv")
    shutil.copyfile(current.result_path or "", target)
    table = Table("status", "addresses")
    for name in ("valid", "invalid", "catch_all", "disposable", "unknown", "risky"):
        table.add_row(name, str(getattr(current, f"{name}_count")))
    Console().print(table)
    console.print(f"results: {target}")


@history_app.command("query")
def history_query(
    sql: str = typer.Argument(..., help="SQL over the views history, latest, changes."),
    limit: int = typer.Option(50, help="Rows to print at most."),
) -> None:
    """Run DuckDB SQL over the history, e.g. ``SELECT status, count(*) FROM latest GROUP BY 1``."""
    import duckdb

    from verimail.tasks.history import query

    try:
        frame = query(get_settings().data_dir, sql)
    except duckdb.Error as exc:
        raise typer.BadParameter(str(exc).splitlines()[0], param_hint="SQL") from exc
    table = Table(*frame.columns)
    for row in frame.head(limit).iter_rows():
        table.add_row(*("" if v is None else str(v) for v in row))
    Console().print(table)
    if frame.height > limit:
        console.print(f"({frame.height - limit} more rows)")


def deploy_command(
    pool: str | None = typer.Option(None, help="Work pool (default: setting)."),
) -> None:
    """Register the three deployments (bulk-verify, find-emails, reverify-stored)."""
    from verimail.flows.deploy import register_deployments

    names = register_deployments(pool or get_settings().prefect_work_pool)
    for name in names:
        console.print(f"deployment {name}")
