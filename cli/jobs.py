"""``verimail bulk``, ``verimail find`` and ``verimail deploy``: flows from a shell."""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import typer
from rich.console import Console
from rich.text import Text

from verimail.cli.follow import PLAIN, RUNNER_KIND, is_parked, run_here, stop_signals, wait_until
from verimail.cli.output import store_notice

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
    None,
    "--retry-unknowns/--no-retry-unknowns",
    help="Addresses a server put off (greylisting, 421, other 4xx, timeouts): by default the "
    "results are written after the first pass, those unknown, with the command that asks "
    "them again later; --retry-unknowns waits here for the later passes (minutes apart); "
    "--no-retry-unknowns leaves them unknown for good.",
    show_default=False,
)
DETAILS_OPTION = typer.Option(
    True,
    "--details/--no-details",
    help="Status, Sub Status, Reason, Score and Did You Mean beside Safe to Send (the "
    "default); --no-details: the upload's columns and Safe to Send only.",
)


def retry_notice(settings, retry_unknowns: bool | None) -> str:  # type: ignore[no-untyped-def]
    """The start line on deferred retries: what happens to addresses a server puts off, and
    how long waiting for them may hold the run. A run once sat 45 minutes in the foreground
    on one address without a word."""
    from verimail.jobs import retries

    if retry_unknowns is False or settings.job_retry_passes <= 0:
        return "retries: off (addresses a server puts off end as unknown after one pass)"
    passes, waited, done = 0, 0.0, 0
    while (step := retries.plan(settings, done, waited)) is not None:
        done, _, waited = step
        passes += 1
    later = f"up to {passes} later pass(es), which may add up to {waited / 60:.0f} min"
    if retry_unknowns is None:
        return (
            "retries: addresses a server puts off are written as unknown after the first "
            "pass, with the command that asks them again later (--retry-unknowns waits here "
            f"instead: {later})"
        )
    return (
        f"retries: addresses a server puts off are asked again in {later}; Ctrl-C stops "
        "(keeping what was settled), --no-retry-unknowns skips them"
    )


def _retry_options(retry_unknowns: bool | None) -> dict[str, object]:
    return {"retry_unknowns": False} if retry_unknowns is False else {}  # (as the API stores it)


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
    retry_unknowns: bool | None = RETRY_OPTION,
    details: bool = DETAILS_OPTION,
) -> None:
    """Verify a CSV with the bulk-verify flow, here and now, with a progress bar.

    The job is booked to an operator account (cli@verimail.localhost, enterprise plan)
    that is granted exactly the credits the file needs, so the ledger stays complete.
    Ctrl-C (or SIGTERM) cancels the job: the rows verified so far go to
    <results>.partial.csv and the history, the rest is refunded, and the command exits 130.
    """
    quiet_prefect()
    from verimail.config import get_settings
    from verimail.files.bulk_io import read_job_input
    from verimail.files.upload_errors import UploadError
    from verimail.jobs.context import store_for
    from verimail.jobs.create import create_verify_job
    from verimail.store.billing import grant, quote

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
    grant(store.engine, account.id, quote("verify", count), reason=f"verimail bulk {file.name}")
    job = create_verify_job(
        store,
        account.id,
        count,
        upload=file.resolve(),
        info=job_input.info,
        email_column=job_input.info.email_reference,
        options={"source": "cli", **_retry_options(retry_unknowns)},
    )

    def announce() -> None:
        console.print(
            f"job {job.id}: {count} addresses ({len(job_input.uniques)} unique) from "
            f"column {job_input.info.email_column!r}; starting the flow (Prefect may take a "
            "few seconds to start)…",
            **PLAIN,
        )
        console.print(store_notice(settings), **PLAIN)
        notice = job_input.info.column_notice("--column chooses another.")
        if notice:
            console.print(Text(notice, style="yellow"))
        console.print(retry_notice(settings, retry_unknowns), **PLAIN)

    _run_and_deliver(settings, store, job, count, target, retry_unknowns, details, announce)


def _run_and_deliver(  # type: ignore[no-untyped-def]
    settings,
    store,
    job,
    total: int,
    target: Path,
    retry_unknowns: bool | None,
    details: bool,
    announce: Callable[[], None] | None = None,
    retry_pass: int = 0,
) -> None:
    """Run the job here (or its deferred pass ``retry_pass``), then write its results."""
    from verimail.cli.job_results import deliver

    partial = target.with_name(f"{target.stem}.partial.csv")
    with stop_signals():
        current = run_here(
            settings,
            store,
            RUNNER_KIND[job.kind],
            job.id,
            total,
            partial,
            wait_retries=bool(retry_unknowns),
            retry_pass=retry_pass,
            announce=announce,
        )
    deliver(settings, current, target, details=details)


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
    retry_unknowns: bool | None = RETRY_OPTION,
) -> None:
    """Find a person's email address at a company domain (never a role inbox).

    "verimail find FIRST LAST DOMAIN" looks one person up with the engine directly;
    "verimail find --file people.csv" runs the find-emails flow on a CSV here. Ctrl-C (or
    SIGTERM) cancels its job: the rows looked up so far go to <results>.partial.csv, only the
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
    from verimail.store.billing import grant, quote

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
        store.engine, account.id, quote("find", rows.height, settings), reason=f"find {file.name}"
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

    def announce() -> None:
        console.print(f"job {job.id}: {rows.height} rows", **PLAIN)
        console.print(store_notice(settings), **PLAIN)
        console.print(retry_notice(settings, retry_unknowns), **PLAIN)

    _run_and_deliver(settings, store, job, rows.height, target, retry_unknowns, False, announce)


def retry_command(
    job_id: int = typer.Argument(..., metavar="JOB_ID", help="The job verimail bulk ran."),
    out: Path | None = typer.Option(
        None, "--out", "-o", help="Results CSV (default: job-JOB_ID.results.csv)."
    ),
    wait: bool = typer.Option(False, "--retry-unknowns", help="Wait here for any later pass too."),
    details: bool = DETAILS_OPTION,
) -> None:
    """Ask again the addresses a job's first pass put off, into its results file.

    "verimail bulk" and "verimail find --file" print this command when servers put some
    addresses off (greylisting, 421, timeouts): it waits for the time they asked for, with
    a countdown, runs the job's retry pass here, and writes the whole results again. Ctrl-C
    while it waits leaves the job as it was; Ctrl-C while the pass runs cancels the job as
    in "verimail bulk".
    """
    quiet_prefect()
    from verimail.config import get_settings
    from verimail.jobs.context import store_for
    from verimail.store import jobs as job_store

    settings = get_settings()
    store = store_for(settings)
    console.print(store_notice(settings), **PLAIN)
    job = job_store.get_job_any(store.engine, job_id)
    if job is None or job.kind not in RUNNER_KIND:
        raise typer.BadParameter(f"no bulk or finder job {job_id}", param_hint="JOB_ID")
    name = "found" if RUNNER_KIND[job.kind] == "finder" else "results"
    target = _results_path(out, Path(f"job-{job_id}.{name}.csv"))
    if job.finished or not is_parked(job):
        _retry_not_needed(settings, job, target, details)
        return
    state = job.retry
    what = f"retry pass {state.get('pass')} of job {job_id} ({state.get('waiting', 0)} put off)"
    with stop_signals():
        try:
            wait_until(datetime.fromisoformat(state["next_retry_at"]), what)
        except KeyboardInterrupt:
            console.print(f"stopped waiting: job {job_id} is still parked", **PLAIN)
            raise typer.Exit(130) from None
    _run_and_deliver(
        settings, store, job, job.total_emails, target, wait, details, None, int(state["pass"])
    )


def _retry_not_needed(settings, job, target: Path, details: bool) -> None:  # type: ignore[no-untyped-def]
    """A job that is not parked: finished (its results written anyway), or at work."""
    from verimail.cli.job_results import deliver

    if not job.finished:
        console.print(f"job {job.id} is at work, not waiting for a retry pass", **PLAIN)
        raise typer.Exit(1)
    console.print(f"job {job.id} has no retry pass left: it {job.status}", **PLAIN)
    deliver(settings, job, target, details=details)


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
        names = register_deployments(pool or get_settings().prefect_work_pool)
    except (httpx.HTTPError, PrefectHTTPStatusError) as exc:
        console.print(
            f"Could not register the deployments at PREFECT_API_URL={url}: {exc}",
            style="red",
            highlight=False,
        )
        raise typer.Exit(1) from None
    for name in names:
        console.print(f"deployment {name}")
