"""A bulk job stopped by its owner (Ctrl-C in ``verimail bulk``): nothing verified is lost.

A run held by a slow server was stopped after 22 minutes and ended silently: no results
file, the 49 settled rows of 50 not in the history, the job left to the reaper. Now the
job is recorded as failed, "cancelled by its owner after N of M rows"; what it verified
(the run's result parts, or what a parked job kept for its next pass, less the addresses
still waiting for it) goes into the history and a partial results CSV; the rest of the
reservation is refunded, in the same transaction as the failure.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import polars as pl

from verimail.config import Settings
from verimail.files.bulk_io import (
    RESULT_PARTS,
    RESULT_SCHEMA,
    append_history,
    job_dir,
    read_job_input,
    read_parts,
    write_partial_results,
)
from verimail.jobs import retries
from verimail.jobs.create import stored_info
from verimail.store import jobs as job_store
from verimail.store.db import Store


@dataclass(frozen=True)
class Cancelled:
    """What a cancellation kept: rows settled of the job's rows, the partial CSV, if any."""

    settled_rows: int
    total_rows: int
    partial_csv: Path | None
    recorded: bool  # False: the job had ended already (completed or failed) and is left alone


def settled_results(settings: Settings, job: job_store.Job) -> pl.DataFrame:
    """The job's results known so far, one row per address, without the addresses a later
    pass was still to ask (those are not verified: they are refunded)."""
    directory = job_dir(settings.data_dir, job.id)
    state = retries.state_path(directory)
    if state.is_file():
        frame = pl.read_parquet(state)
    elif (parts := directory / RESULT_PARTS / f"run-{job.attempt}").is_dir():
        frame = read_parts(parts)
    else:
        return RESULT_SCHEMA.to_frame()
    return frame.filter(~pl.col("sub_status").is_in(retries.RETRYABLE))


def cancel_bulk_job(settings: Settings, store: Store, job_id: int, partial_csv: Path) -> Cancelled:
    """Stop job ``job_id`` for its owner: history, ``partial_csv`` (only when some rows were
    settled) and the job failed with the unsettled rows refunded."""
    job = job_store.get_job_any(store.engine, job_id)
    assert job is not None
    if job.finished:
        return Cancelled(job.processed_emails, job.total_emails, None, recorded=False)
    upload = Path(job.upload_path or job_dir(settings.data_dir, job.id) / "upload.csv")
    job_input = read_job_input(
        upload, job.email_column, settings.upload_max_rows, stored_info(settings, job)
    )
    by_address = settled_results(settings, job)
    rows = job_input.row_counts()
    settled = sum(rows.get(address, 0) for address in by_address["normalised"].to_list())
    written = None
    if settled:
        append_history(
            settings.data_dir,
            by_address,
            job_id=job.id,
            account_id=job.account_id,
            source="bulk",
            once_per_job=True,
        )
        write_partial_results(upload, job_input, by_address, partial_csv)
        written = partial_csv
    reason = f"cancelled by its owner after {settled} of {job.total_emails} rows"
    unsettled = job.credits_reserved - job.credits_refunded - settled
    recorded = job_store.mark_failed(store.engine, job.id, reason, max(unsettled, 0))
    return Cancelled(settled, job.total_emails, written, recorded)
