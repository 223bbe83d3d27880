"""The settled rows of a job that waits for a deferred retry pass, as a CSV its owner can
download now (``GET /api/bulk/{id}/download?partial=true``).

While a job waits (15 + 30 minutes by default) its first pass's results are kept beside it
for the next pass (``retry-state.parquet``, :mod:`verimail.jobs.retries`): every address
settled, and those a server put off. The partial file is the upload with the results so
far: each row's ``Safe to Send``, and ``Retry Pending`` ``Yes`` on the parked rows (their
verdict is not known yet). It is made once per pass and kept: the state does not change
until the next pass parks again or the job completes.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from verimail.config import Settings
from verimail.files.bulk_io import job_dir, read_job_input
from verimail.files.partial_results import write_pending_results
from verimail.jobs import retries
from verimail.jobs.create import stored_info, stored_upload
from verimail.store import jobs as job_store


def waiting_for_retry(job: job_store.Job) -> bool:
    """The job's first pass is over and a retry pass waits or runs: it has settled rows."""
    return job.status == "processing" and job.retry.get("phase") in (
        "waiting_to_retry",
        "retrying",
    )


def partial_results_csv(
    settings: Settings, job: job_store.Job, *, details: bool, neutralise_formulas: bool
) -> Path | None:
    """The partial results CSV of a job waiting for a retry pass; None when it has no kept
    results (its first pass still runs, or it completed meanwhile and its state is gone)."""
    directory = job_dir(settings.data_dir, job.id)
    state = retries.state_path(directory)
    suffix = ("-details" if details else "") + ("-safe" if neutralise_formulas else "")
    out = directory / f"results-partial-pass{job.retry.get('pass', 0)}{suffix}.csv"
    if out.is_file():
        return out
    try:
        by_address = pl.read_parquet(state)
    except FileNotFoundError:
        return None
    upload = stored_upload(settings, job)
    job_input = read_job_input(
        upload, job.email_column, settings.upload_max_rows, stored_info(settings, job)
    )
    write_pending_results(
        upload,
        job_input,
        by_address,
        out,
        retryable=retries.RETRYABLE,
        details=details,
        neutralise_formulas=neutralise_formulas,
    )
    return out
