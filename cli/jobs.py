"""``verimail bulk``, ``verimail find`` and ``verimail deploy``: flows from a shell."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
from pathlib import Path

import typer
from rich.console import Console
from rich.text import Text

from verimail.cli.progress import JobProgress, finder_counts, status_counts, summary_table

console = Console(stderr=True)

CLI_ACCOUNT_EMAIL = "cli@verimail.localhost"


def _cli_account(store, settings):  # type: ignore[no-untyped-def]
    """The operator account CLI jobs are booked to (made on first use, no signup credits)."""
    from verimail.store import accounts

    account = accounts.get_account_by_email(store.engine, CLI_ACCOUNT_EMAIL)
    if account is None:
        account = accounts.create_account(
            store.engine,
            settings.model_copy(update={"signup_credits": 0}),
            plan="enterprise",
            email=CLI_ACCOUNT_EMAIL,
        )
    return account


def _cli_patterns():  # type: ignore[no-untyped-def]
    """The store's learned domain patterns for a single ``verimail find`` (finds booked to
    the operator account); None when the database cannot be opened: the lookup then works
    as before, it only neither uses nor teaches a pattern."""
    quiet_prefect()  # (flows.finder imports Prefect)
    from sqlalchemy.exc import SQLAlchemyError

    from verimail.config import get_settings
    from verimail.jobs.context import store_for
    from verimail.jobs.learned_patterns import StoredPatterns

    settings = get_settings()
    try:
        store = store_for(settings)
        return StoredPatterns(store, _cli_account(store, settings).id, settings)
    except SQLAlchemyError as exc:
        console.print(f"(learned domain patterns not used: {type(exc).__name__})")
        return None


QUIET_PREFECT = {
    "PREFECT_LOGGING_LEVEL": "WARNING",
    # ...but a run's own lines still reach its Logs tab in the Prefect UI: they were dropped
    # with the rest, and every run page showed an empty Logs tab.
    "PREFECT_LOGGING_LOGGERS_PREFECT_FLOW_RUNS_LEVEL": "INFO",
    "PREFECT_LOGGING_LOGGERS_PREFECT_TASK_RUNS_LEVEL": "INFO",
    "PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL": "WARNING",
}


def quiet_prefect() -> None:
    """Prefect's INFO lines (each task started, finished) would bury the progress bar and
    the results (or the demo's own output) on the terminal; its warnings still show there,
    and the runs' INFO lines go to the Prefect server (the run's Logs tab). Called before
    Prefect is imported: it reads this then. A ``PREFECT_LOGGING_LEVEL`` the user set is
    kept, and with it Prefect's own console output."""
    if "PREFECT_LOGGING_LEVEL" in os.environ:
        return
    for name, value in QUIET_PREFECT.items():
        os.environ.setdefault(name, value)


RETRY_OPTION = typer.Option(
    True,
    "--retry-unknowns/--no-retry-unknowns",
    help="Ask the addresses a server put off (greylisting, 421, other 4xx, timeouts) again "
    "in later passes, minutes apart; --no-retry-unknowns ends after the first pass.",
)
PLAIN: dict[str, bool] = {"markup": False, "highlight": False, "soft_wrap": True}
"""Lines a person (or a script) reads whole: never wrapped at the terminal's width."""
CANCELLED_EXIT = 130  # (128 + SIGINT, as a shell reports a command stopped by Ctrl-C)


def retry_notice(settings, retry_unknowns: bool) -> str:  # type: ignore[no-untyped-def]
    """The start line on deferred retries: how long they may hold the run, or that they are
    off. A run once sat 45 minutes in the foreground on one address without a word."""
    from verimail.jobs import retries

    if not retry_unknowns or settings.job_retry_passes <= 0:
        return "retries: off (addresses a server puts off end as unknown after one pass)"
    passes, waited, done = 0, 0.0, 0
    while (step := retries.plan(settings, done, waited)) is not None:
        done, _, waited = step
        passes += 1
    return (
        f"retries: addresses a server puts off are asked again in up to {passes} later "
        f"pass(es), which may add up to {waited / 60:.0f} min; --no-retry-unknowns skips them"
    )


def _retry_options(retry_unknowns: bool) -> dict[str, object]:
    return {} if retry_unknowns else {"retry_unknowns": False}  # (as the API stores it)


def _run_here(  # type: ignore[no-untyped-def]
    settings, store, kind: str, job_id: int, total: int, partial: Path
):
    """Run a job's flow in this process with a progress bar; the finished job row.

    Ctrl-C stops the job for its owner (``partial``: where its settled rows go): see
    :func:`_cancel`."""
    from verimail.runners.local import LocalRunner
    from verimail.store import jobs as job_store

    runner = LocalRunner(settings)
    runner.submit(kind, job_id)
    counts_of = finder_counts if kind == "finder" else status_counts
    try:
        with JobProgress(console, total, counts_of) as progress:
            while True:
                current = job_store.get_job_any(store.engine, job_id)
                assert current is not None
                progress.update(current, final=current.finished)
                if current.finished:
                    break
                time.sleep(0.2)
    except KeyboardInterrupt:
        _cancel(settings, store, runner, kind, job_id, partial)
    runner.wait()
    runner.shutdown()
    if current.status != "completed":
        console.print(Text.assemble((f"job {job_id} failed: ", "red"), current.failed_reason or ""))
        raise typer.Exit(1)
    return current


def _cancel(settings, store, runner, kind: str, job_id: int, partial: Path) -> None:  # type: ignore[no-untyped-def]
    """Ctrl-C: record the job as cancelled by its owner, its settled rows kept in
    ``partial`` (a bulk job's in the history too), say what it was charged, and exit 130
    (``jobs/cancel.py``).

    Ends with ``os._exit``: the flow still runs in a worker thread of this process, which
    the interpreter would wait for at exit (minutes, for a job parked on a slow server);
    everything it could write is settled by then, and the job is no longer its to finish."""
    from verimail.jobs.cancel import cancel_bulk_job, cancel_finder_job

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # (a second Ctrl-C must not cut this short)
    console.print("stopping: keeping what was settled…", highlight=False)
    cancel = cancel_finder_job if kind == "finder" else cancel_bulk_job
    done = cancel(settings, store, job_id, partial)
    if not done.recorded:  # (it ended as the key was pressed: its page says how)
        console.print(f"job {job_id} had ended already: verimail history job {job_id}", **PLAIN)
        runner.shutdown()
        os._exit(CANCELLED_EXIT)
    settled, total, written = done.settled_rows, done.total_rows, done.partial_csv
    if kind == "finder":  # (it charges as it goes: the finds handed over, and no other)
        charged = (
            f"{done.credits_used} credit(s) charged for the {done.finds} address(es) found, "
            "in its partial results; nothing else"
            if done.finds
            else "nothing was charged"
        )
    else:
        charged = "the rest was refunded"
    console.print(f"job {job_id} cancelled after {settled} of {total} rows; {charged}.", **PLAIN)
    if written is not None:
        console.print(f"partial results ({settled} rows): {written}", **PLAIN)
    else:
        console.print("no row was settled: no partial results file", **PLAIN)
    runner.shutdown()  # (stops the parked job's timer and this process's Prefect server)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(CANCELLED_EXIT)


def _results_path(out: Path | None, default: Path) -> Path:
    """Where the results go: ``--out`` (a file, or a folder to put ``default``'s name in),
    checked before the job runs — not found missing after a long run."""
    if out is None:
        return default
    if out.is_dir():
        return out / default.name
    if not out.parent.is_dir():
        raise typer.BadParameter(f"the folder {out.parent} does not exist", param_hint="--out")
    return out


def bulk_command(
    file: Path = typer.Argument(
        ..., metavar="FILE", exists=True, dir_okay=False, help="CSV with an email column."
    ),
    column: str | None = typer.Option(None, "--column", "-c", help="The email column."),
    out: Path | None = typer.Option(None, "--out", "-o", help="Where to write results CSV."),
    retry_unknowns: bool = RETRY_OPTION,
) -> None:
    """Verify a CSV with the bulk-verify flow, here and now, with a progress bar.

    The job is booked to an operator account (cli@verimail.localhost, enterprise plan)
    that is granted exactly the credits the file needs, so the ledger stays complete.
    Ctrl-C cancels the job: the rows verified so far go to <results>.partial.csv and the
    history, the rest is refunded, and the command exits 130.
    """
    quiet_prefect()
    from verimail.config import get_settings
    from verimail.files.bulk_io import read_job_input
    from verimail.files.upload_errors import UploadError
    from verimail.jobs.context import store_for
    from verimail.jobs.create import create_verify_job
    from verimail.store.billing.movements import grant
    from verimail.store.billing.prices import price

    target = _results_path(out, file.with_name(f"{file.stem}.results.csv"))
    settings = get_settings()
    try:
        job_input = read_job_input(file, column, settings.upload_max_rows)
    except UploadError as exc:
        # The API's words name its form field; here the option is --column.
        detail = exc.reworded(
            {"email_column": "--column"}, "Choose it with --column." if exc.advice else ""
        )
        hint = "--column" if column is not None and "--column" in detail else "FILE"
        raise typer.BadParameter(detail, param_hint=hint) from exc
    count = job_input.address_rows
    store = store_for(settings)
    account = _cli_account(store, settings)
    grant(store.engine, account.id, price("verify", count), reason=f"verimail bulk {file.name}")
    job = create_verify_job(
        store,
        account.id,
        count,
        upload=file.resolve(),
        info=job_input.info,
        email_column=job_input.info.email_reference,
        options={"source": "cli", **_retry_options(retry_unknowns)},
    )
    console.print(
        f"job {job.id}: {count} addresses ({len(job_input.uniques)} unique) from "
        f"column {job_input.info.email_column!r}; starting the flow (Prefect may take a few "
        "seconds to start)…",
        highlight=False,
    )
    notice = job_input.info.column_notice("--column chooses another.")
    if notice:
        console.print(Text(notice, style="yellow"))
    console.print(retry_notice(settings, retry_unknowns), **PLAIN)
    partial = target.with_name(f"{target.stem}.partial.csv")
    current = _run_here(settings, store, "bulk", job.id, count, partial)
    shutil.copyfile(current.result_path or "", target)
    Console().print(summary_table(status_counts(current)))
    console.print(Text(f"results: {target}"))


def find_command(
    first_name: str | None = typer.Argument(None, metavar="FIRST", help="First name."),
    last_name: str | None = typer.Argument(None, metavar="LAST", help="Last name."),
    domain: str | None = typer.Argument(None, metavar="DOMAIN", help="Company domain."),
    file: Path | None = typer.Option(
        None, "--file", "-f", exists=True, dir_okay=False, help="CSV of people (a finder job)."
    ),
    out: Path | None = typer.Option(None, "--out", "-o", help="Results CSV (with --file)."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as one JSON object."),
    max_probes: int | None = typer.Option(None, "--max-probes", min=1, help="Candidates to try."),
    retry_unknowns: bool = RETRY_OPTION,
) -> None:
    """Find a person's email address at a company domain (never a role inbox).

    "verimail find FIRST LAST DOMAIN" looks one person up with the engine directly;
    "verimail find --file people.csv" runs the find-emails flow on a CSV here. Ctrl-C
    cancels its job: the rows looked up so far go to <results>.partial.csv, only the
    addresses found in it are charged, and the command exits 130.
    """
    if file is None:
        if not (first_name and last_name and domain):
            raise typer.BadParameter("give FIRST LAST DOMAIN, or --file people.csv")
        if out is not None:
            raise typer.BadParameter("--out names the results CSV of --file", param_hint="--out")
        from verimail.cli.find import find_one

        find_one(
            first_name,
            last_name,
            domain,
            as_json=as_json,
            max_probes=max_probes,
            patterns=_cli_patterns(),
        )
        return
    quiet_prefect()
    from verimail.config import get_settings
    from verimail.files.csv_columns import PERSON_HEADERS_ADVICE
    from verimail.files.csv_io import read_finder_upload
    from verimail.files.upload_errors import UploadError
    from verimail.jobs.context import store_for
    from verimail.jobs.create import create_finder_job
    from verimail.store.billing.movements import grant
    from verimail.store.billing.prices import price

    if first_name or last_name or domain:
        raise typer.BadParameter("give FIRST LAST DOMAIN, or --file people.csv, not both")
    if as_json:
        raise typer.BadParameter(
            "--json prints one lookup; with --file the results are a CSV", param_hint="--json"
        )
    target = _results_path(out, file.with_name(f"{file.stem}.found.csv"))
    settings = get_settings()
    if max_probes is not None:  # (the job's flow reads the setting, as a worker's does)
        settings = settings.model_copy(update={"finder_max_probes": max_probes})
    try:
        info, rows = read_finder_upload(file, {}, settings.upload_max_rows)
    except UploadError as exc:
        # (the API's column fields have no options here: the headers name the columns)
        detail = exc.reworded({}, PERSON_HEADERS_ADVICE if exc.advice else "")
        raise typer.BadParameter(detail, param_hint="--file") from exc
    store = store_for(settings)
    account = _cli_account(store, settings)
    grant(
        store.engine, account.id, price("find", rows.height, settings), reason=f"find {file.name}"
    )
    job = create_finder_job(
        store,
        settings,
        account.id,
        rows.height,
        upload=file.resolve(),
        info=info,
        options={"source": "cli", **_retry_options(retry_unknowns)},
    )
    console.print(retry_notice(settings, retry_unknowns), **PLAIN)
    partial = target.with_name(f"{target.stem}.partial.csv")
    current = _run_here(settings, store, "finder", job.id, rows.height, partial)
    shutil.copyfile(current.result_path or "", target)
    console.print(
        f"{current.found_count} found, {current.catch_all_count} catch-all guesses, "
        f"{current.invalid_count} not found of {rows.height} rows; results: {target}"
    )


def deploy_command(
    pool: str | None = typer.Option(
        None, help="Work pool (default: VERIMAIL_PREFECT_WORK_POOL, else 'verimail')."
    ),
) -> None:
    """Register the four deployments (bulk-verify, find-emails, verify-shard, reverify-stored)."""
    import httpx
    from prefect.exceptions import PrefectHTTPStatusError
    from prefect.settings import PREFECT_API_URL

    from verimail.config import get_settings
    from verimail.runners.deploy import register_deployments

    url = PREFECT_API_URL.value()
    if not url:  # (Prefect would register them in a throwaway server of this process)
        console.print(
            "verimail deploy needs the Prefect server the workers use: set PREFECT_API_URL "
            "(e.g. http://prefect.internal:4200/api).",
            style="red",
            highlight=False,
        )
        raise typer.Exit(2)
    try:
        names = register_deployments(pool_name := pool or get_settings().prefect_work_pool)
    except (httpx.HTTPError, PrefectHTTPStatusError) as exc:
        console.print(
            f"Could not register the deployments at PREFECT_API_URL={url}: {exc}",
            style="red",
            highlight=False,
        )
        raise typer.Exit(1) from None
    for name in names:
        console.print(f"deployment {name}")
    pool_option = f" --pool {pool}" if pool else ""
    console.print(
        f"Start a worker on each machine that runs flows: verimail worker{pool_option} "
        f"(or: prefect worker start --pool {pool_name} --limit 2; docs/deployment.md)",
        highlight=False,
        soft_wrap=True,
    )
