"""A job's results before it has its final file: the rows a stopped job settled (Ctrl-C, a
cancel) and every row of a job waiting for a deferred retry pass, the parked ones marked.
Both keep the final file's layout: the upload's columns, ``Safe to Send``, the details."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import polars as pl

from verimail.files.bulk_io import SAFE_COLUMN, JobInput, details_columns, rows_with_results
from verimail.files.csv_io import write_results_csv


def write_partial_results(
    upload: Path,
    job_input: JobInput,
    by_address: pl.DataFrame,
    dest: Path,
    *,
    every_row: bool = False,
    details: bool = True,
) -> int:
    """The rows of a stopped job that have a result, with ``Safe to Send`` and the details
    columns, to ``dest`` (its owner keeps what was verified); the rows written.
    ``every_row``: rows without an address too (a parked job's results so far, which hold
    every address); ``details``: False leaves the details columns out."""
    frame = rows_with_results(job_input, by_address)
    keep = None if every_row else frame.get_column("status").is_not_null().to_list()
    safe = frame.get_column("safe_to_send").fill_null(False).to_list()
    columns = {SAFE_COLUMN: ["Yes" if v else "No" for v in safe]}
    if details:
        columns.update(details_columns(frame))
    return write_results_csv(upload, job_input.info, dest, columns, keep=keep)


PENDING_COLUMN = "Retry Pending"
"""The column a partial download adds: ``Yes`` on a row parked for a later retry pass."""


def write_pending_results(
    upload: Path,
    job_input: JobInput,
    by_address: pl.DataFrame,
    dest: Path,
    *,
    retryable: Sequence[str],
    details: bool = False,
    neutralise_formulas: bool = False,
) -> int:
    """Every row of a job waiting for a retry pass, to ``dest``: ``Safe to Send`` as the
    results so far say it (``No`` on a parked row: not known yet), the details columns if
    asked, and :data:`PENDING_COLUMN` last, ``Yes`` on the rows whose sub-status is one of
    ``retryable`` (a later pass asks them again). The rows written."""
    frame = rows_with_results(job_input, by_address)
    parked = frame.get_column("sub_status").is_in(list(retryable)).fill_null(False)
    safe = frame.get_column("safe_to_send").fill_null(False) & ~parked
    columns = {SAFE_COLUMN: ["Yes" if v else "No" for v in safe.to_list()]}
    if details:
        columns.update(details_columns(frame))
    columns[PENDING_COLUMN] = ["Yes" if v else "No" for v in parked.to_list()]
    return write_results_csv(
        upload, job_input.info, dest, columns, neutralise_formulas=neutralise_formulas
    )
