"""The results file a CLI job run leaves: when the job completed, or when its first pass
left addresses a server put off and the command ends without waiting for them.

A bulk job's file has the upload's columns, ``Safe to Send`` and, unless ``--no-details``,
``Status``, ``Sub Status``, ``Reason``, ``Score`` and ``Did You Mean`` (the API's
``?include=details`` file): a list owner reads why an address is not safe, as the partial
file of a stopped job always showed. A parked job's file holds every row, the put-off ones
``unknown`` for now, and the command says which ``verimail retry`` line asks them again
into the same file.
"""

from __future__ import annotations

import shlex
import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.text import Text

from verimail.cli.follow import PLAIN, RUNNER_KIND, console, is_parked
from verimail.cli.progress import duration, status_counts, summary_table


def deliver(settings: Any, job: Any, target: Path, *, details: bool) -> None:
    """Write the job's results (or, parked, its results so far) to ``target`` and say what
    they hold; a failed job is an error (exit 1)."""
    if job.status != "completed" and not is_parked(job):
        console.print(Text.assemble((f"job {job.id} failed: ", "red"), job.failed_reason or ""))
        raise typer.Exit(1)
    if RUNNER_KIND[job.kind] == "finder":
        _finder_results(settings, job, target)
    else:
        _bulk_results(settings, job, target, details)
    if is_parked(job):
        console.print(parked_advice(job, target, details), **PLAIN)


def _bulk_results(settings: Any, job: Any, target: Path, details: bool) -> None:
    from verimail.files.bulk_io import job_dir, results_csv
    from verimail.jobs.create import stored_upload

    directory = job_dir(settings.data_dir, job.id)
    upload = stored_upload(settings, job)
    if is_parked(job):
        _parked_bulk_results(settings, job, directory, upload, target, details)
    elif details:
        shutil.copyfile(results_csv(directory, upload, details=True), target)
    else:
        shutil.copyfile(job.result_path or "", target)
    Console().print(summary_table(status_counts(job)))
    console.print(Text(f"results: {target}"))


def _parked_bulk_results(  # type: ignore[no-untyped-def]
    settings, job, directory: Path, upload: Path, target: Path, details: bool
) -> None:
    import polars as pl

    from verimail.files.bulk_io import read_job_input, write_partial_results
    from verimail.jobs import retries
    from verimail.jobs.create import stored_info

    by_address = pl.read_parquet(retries.state_path(directory))
    job_input = read_job_input(
        upload, job.email_column, settings.upload_max_rows, stored_info(settings, job)
    )
    write_partial_results(upload, job_input, by_address, target, every_row=True, details=details)


def _finder_results(settings: Any, job: Any, target: Path) -> None:
    if is_parked(job):
        import polars as pl

        from verimail.files.bulk_io import job_dir
        from verimail.files.csv_io import finder_columns, write_finder_results
        from verimail.jobs import retries
        from verimail.jobs.create import stored_info, stored_upload

        upload = stored_upload(settings, job)
        info, _ = finder_columns(
            upload, job.options or {}, settings.upload_max_rows, stored_info(settings, job)
        )
        rows = pl.read_parquet(retries.state_path(job_dir(settings.data_dir, job.id)))
        write_finder_results(upload, info, target, rows, partial=True)
    else:
        shutil.copyfile(job.result_path or "", target)
    console.print(
        f"{job.found_count} found, {job.catch_all_count} catch-all guesses, "
        f"{job.invalid_count} not found of {job.total_emails} rows; results: {target}",
        **PLAIN,
    )


def parked_advice(job: Any, target: Path, details: bool) -> str:
    """How many were put off, until when their servers asked us to wait, and the command
    that asks them again into ``target``."""
    state = job.retry
    at = datetime.fromisoformat(state["next_retry_at"])
    left = duration(max((at - datetime.now(UTC)).total_seconds(), 0))
    command = f"verimail retry {job.id} --out {shlex.quote(str(target))}"
    if not details and RUNNER_KIND[job.kind] == "bulk":
        command += " --no-details"
    return (
        f"{state.get('waiting', 0)} put off by their servers (greylisting, a 421, a timeout): "
        f"unknown in these results for now; job {job.id} keeps their credits reserved for a "
        f"retry pass after {at:%H:%M:%S} UTC (in {left}). To ask just those again, into the "
        f"same file: {command}"
    )
