"""The Prefect tasks of a job's files, each a thin unit over ``files/``: read the upload as
the job's inspection says, write the results (CSV, details, Parquet) and add them to the
history DuckDB reads. Blocking work, so each runs in a thread, off the loop that carries the
SMTP sessions.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import polars as pl
from prefect import task
from prefect.cache_policies import NO_CACHE

from verimail.files.bulk_io import (
    JobInput,
    StagedFiles,
    append_history,
    read_job_input,
    write_job_results,
)
from verimail.files.csv_detect import CsvInfo


@task(name="read-job-input", persist_result=False, cache_policy=NO_CACHE)
async def read_input(
    upload: Path, email_column: str | None, max_rows: int, info: CsvInfo | None
) -> JobInput:
    """The upload loaded, normalised and de-duplicated (``info``: its inspection, kept with
    the job, so the file is not sniffed again)."""
    return await asyncio.to_thread(read_job_input, upload, email_column, max_rows, info)


@task(name="write-results", persist_result=False, cache_policy=NO_CACHE)
async def write_results(
    directory: Path,
    upload: Path,
    job_input: JobInput,
    by_address: pl.DataFrame,
    *,
    run: int,
    previous: Path | None,
) -> StagedFiles:
    """The job's result files, staged for the run's completion to put in place."""
    return await asyncio.to_thread(
        write_job_results, directory, upload, job_input, by_address, run=run, previous=previous
    )


@task(name="record-history", persist_result=False, cache_policy=NO_CACHE)
async def record_history(
    data_dir: Path,
    by_address: pl.DataFrame,
    *,
    job_id: int | None,
    account_id: int | None,
    source: str,
    once_per_job: bool = False,
) -> None:
    """The results added to the verification history (DuckDB's views over Parquet)."""
    await asyncio.to_thread(
        append_history,
        data_dir,
        by_address,
        job_id=job_id,
        account_id=account_id,
        source=source,
        once_per_job=once_per_job,
    )
