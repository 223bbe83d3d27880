"""A job stopped by its owner (Ctrl-C in ``verimail bulk`` or ``verimail find --file``,
``POST /api/bulk/{id}/cancel`` and the finder's, the dashboard's Cancel button): nothing
settled is lost.

A run held by a slow server was stopped after 22 minutes and ended silently: no results
file, the 49 settled rows of 50 not in the history, the job left to the reaper. Now the
job is recorded as failed, "cancelled by its owner after N of M rows", and what it settled
goes into a partial results CSV, in the same order and with the same columns as the
finished file would have, less the rows not settled (not looked up yet, or parked for a
retry pass because a server put them off):

- a bulk job: the run's result parts, or what a parked job kept for its next pass; its
  verified rows also go into the history, and the rest of the reservation is refunded in
  the same transaction as the failure;
- a finder job: the rows its run saved as it went (:func:`save_finder_rows`, each time
  its progress is written: the run is in another thread, its outcomes in its memory), or
  what a parked job kept; the finds handed over in the partial CSV stay charged, every
  other find (one charged after the rows were saved) is given back with the failure, so
  the account pays for exactly the addresses it received.

The failure is recorded with ``options["cancelled"]`` and takes the job from its run (one
more run counted, as recovery does): the run's next heartbeat finds the job superseded and
stops it, wherever it runs (the API's threads, a worker; a shard's beat stops once the job
has ended). A second cancellation changes nothing and answers the same cancelled job.
"""

from __future__ import annotations

import uuid
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
)
from verimail.files.csv_io import finder_columns, write_finder_results
from verimail.files.partial_results import write_partial_results
from verimail.files.shards import merged_results
from verimail.jobs import retries
from verimail.jobs.create import stored_info, stored_upload
from verimail.store import jobs as job_store
from verimail.store.billing import cancel_refund
from verimail.store.db import Store


@dataclass(frozen=True)
class Cancelled:
    """What a cancellation kept: rows settled of the job's rows, the partial CSV, if any."""

    settled_rows: int
    total_rows: int
    partial_csv: Path | None
    recorded: bool  # False: the job had ended already (completed or failed) and is left alone
    finds: int = 0  # a finder job's: the addresses found in the partial CSV (all charged)
    credits_used: int = 0  # a finder job's: what those finds cost


PARTIAL_RESULTS = "partial-results.csv"
"""A job cancelled through the API or the dashboard: its settled rows, in its folder (what
its download serves)."""


def partial_results(settings: Settings, job: job_store.Job) -> Path:
    return job_dir(settings.data_dir, job.id) / PARTIAL_RESULTS


def was_cancelled(job: job_store.Job) -> bool:
    """Whether the job ended by its owner's cancellation (its status is ``failed``)."""
    return job.status == "failed" and "cancelled" in (job.options or {})


def cancel_for_owner(settings: Settings, store: Store, job_id: int) -> job_store.Job | None:
    """Cancel job ``job_id`` (an account's own: the caller checked), its settled rows in
    :func:`partial_results`; the job as it stands, cancelled by this call or an earlier
    one. None: it had ended otherwise, completed or failed (the API's 409)."""
    job = _open_job(store, job_id)
    if not job.finished:
        target = partial_results(settings, job)
        target.parent.mkdir(parents=True, exist_ok=True)
        cancel = cancel_finder_job if job.kind == "finder_csv" else cancel_bulk_job
        cancel(settings, store, job_id, target)
        job = _open_job(store, job_id)
    return job if was_cancelled(job) else None


def settled_results(settings: Settings, job: job_store.Job) -> pl.DataFrame:
    """The job's results known so far, one row per address, without the addresses a later
    pass was still to ask (those are not verified: they are refunded)."""
    directory = job_dir(settings.data_dir, job.id)
    state = retries.state_path(directory)
    shards = (job.options or {}).get("shards")
    if state.is_file():
        frame = pl.read_parquet(state)
    elif shards is not None:  # (a sharded job's first pass: what each shard saved so far)
        frame = merged_results(directory, int(shards["total"]))
    elif (parts := directory / RESULT_PARTS / f"run-{job.attempt}").is_dir():
        frame = read_parts(parts)
    else:
        return RESULT_SCHEMA.to_frame()
    return _settled(frame)


def _settled(frame: pl.DataFrame) -> pl.DataFrame:
    """``frame`` without the rows put off (a finder row settled has no sub-status)."""
    return frame.filter(~pl.col("sub_status").is_in(retries.RETRYABLE).fill_null(False))


def _open_job(store: Store, job_id: int) -> job_store.Job:
    job = job_store.get_job_any(store.engine, job_id)
    assert job is not None
    return job


def _ended(job: job_store.Job) -> Cancelled:
    """A job that ended as the key was pressed: left as it ended."""
    return Cancelled(job.processed_emails, job.total_emails, None, recorded=False)


def _reason(settled: int, total: int) -> str:
    return f"cancelled by its owner after {settled} of {total} rows"


def cancel_bulk_job(settings: Settings, store: Store, job_id: int, partial_csv: Path) -> Cancelled:
    """Stop job ``job_id`` for its owner: history, ``partial_csv`` (only when some rows were
    settled) and the job failed with the unsettled rows refunded.

    The files are written under names of their own first and put in place only once the
    failure is recorded: a cancellation that loses to the job's completion, or to another
    cancellation, leaves nothing of its own (the history keeps the run's results)."""
    job = _open_job(store, job_id)
    if job.finished:
        return _ended(job)
    upload = stored_upload(settings, job)
    job_input = read_job_input(
        upload, job.email_column, settings.upload_max_rows, stored_info(settings, job)
    )
    by_address = settled_results(settings, job)
    rows = job_input.row_counts()
    settled = sum(rows.get(address, 0) for address in by_address["normalised"].to_list())
    staged = _staged(partial_csv)
    if settled:
        write_partial_results(upload, job_input, by_address, staged)
    recorded = job_store.mark_failed(
        store.engine,
        job.id,
        _reason(settled, job.total_emails),
        cancel_refund(job, settled),
        cancelled={"settled_rows": settled},
    )
    if not recorded:
        staged.unlink(missing_ok=True)
        return _ended(_open_job(store, job_id))
    written = None
    if settled:
        staged.replace(partial_csv)
        written = partial_csv
        append_history(
            settings.data_dir,
            by_address,
            job_id=job.id,
            account_id=job.account_id,
            source="bulk",
            once_per_job=True,
        )
    return Cancelled(settled, job.total_emails, written, recorded)


def _staged(path: Path) -> Path:
    """Where a cancellation writes ``path`` before it knows it is the one that cancels."""
    return path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")


# --- a finder job ------------------------------------------------------------------------


FINDER_ROWS = "finder-rows.run-{attempt}.parquet"
"""A finder run's row outcomes so far, in its job's folder: one file per run, so a run
taken for dead that wakes up cannot overwrite what the run that has the job saved."""


def finder_rows_path(directory: Path, attempt: int) -> Path:
    return directory / FINDER_ROWS.format(attempt=attempt)


def save_finder_rows(directory: Path, attempt: int, rows: pl.DataFrame) -> None:
    """Keep run ``attempt``'s row outcomes (``row``, ``email``, ``status``, ``confidence``,
    ``sub_status``) where a cancellation in another thread reads them (atomically)."""
    retries.write_atomically(rows, finder_rows_path(directory, attempt))


def drop_finder_rows(directory: Path) -> None:
    """The job is complete: its runs' saved rows are in its results file now."""
    for path in directory.glob(FINDER_ROWS.format(attempt="*")):
        path.unlink(missing_ok=True)


def settled_finder_rows(settings: Settings, job: job_store.Job) -> pl.DataFrame:
    """The finder job's rows settled so far (what its run saved last, or what a parked job
    kept for its next pass), without the rows a later pass was still to look up."""
    directory = job_dir(settings.data_dir, job.id)
    # (The run saves at the end of each pass too: its file is never older than the state.)
    for path in (finder_rows_path(directory, job.attempt), retries.state_path(directory)):
        if path.is_file():
            return _settled(pl.read_parquet(path))
    return pl.DataFrame(schema={"row": pl.Int64, "status": pl.String})


def cancel_finder_job(
    settings: Settings, store: Store, job_id: int, partial_csv: Path
) -> Cancelled:
    """Stop finder job ``job_id`` for its owner: ``partial_csv`` (only when some rows were
    settled) and the job failed, charged for the finds in ``partial_csv`` and no other."""
    job = _open_job(store, job_id)
    if job.finished:
        return _ended(job)
    outcomes = settled_finder_rows(settings, job)
    staged = _staged(partial_csv)
    if outcomes.height:
        upload = stored_upload(settings, job)
        info, _ = finder_columns(
            upload, job.options or {}, settings.upload_max_rows, stored_info(settings, job)
        )
        write_finder_results(upload, info, staged, outcomes, partial=True)
    found = outcomes.filter(pl.col("status") == "found").get_column("row").to_list()
    recorded = job_store.mark_failed(
        store.engine,
        job.id,
        _reason(outcomes.height, job.total_emails),
        0,
        keep_finds=found,
        cancelled={"settled_rows": outcomes.height},
    )
    if not recorded:  # (it ended meanwhile: its own results, or its refunds, stand)
        staged.unlink(missing_ok=True)
        return _ended(_open_job(store, job_id))
    written = None
    if outcomes.height:
        staged.replace(partial_csv)
        written = partial_csv
    return Cancelled(
        outcomes.height,
        job.total_emails,
        written,
        recorded,
        finds=len(found),
        credits_used=_open_job(store, job_id).credits_used,
    )
