"""The ``reverify-stored`` flow: verify a stored list again and report what changed.

What to re-verify, in this order: a past job (``job_id``), a file (``file_path``), or —
on the weekly schedule, with no parameters — every address whose latest verification
is older than ``older_than_days``. Runs are operator work: nothing is charged.

Writes the new results to the history and a change report CSV
(``<data_dir>/reports/reverify-<time>.csv``: email, previous_status, status,
previous_verified_at, reason) and returns the transitions counted, e.g.
``{"valid->invalid": 3}``.
"""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl
from prefect import flow, get_run_logger

from verimail.config import current_settings
from verimail.flows.bulk import chunk_groups, prepare_addresses, verify_host_groups
from verimail.flows.context import engine_for, store_for
from verimail.flows.failures import refused
from verimail.flows.forms import FormError, shared_file
from verimail.flows.summary import name_this_run, publish_table, transition_rows
from verimail.store import jobs as job_store
from verimail.tasks.bulk_io import append_history, job_dir, read_job_input, results_frame
from verimail.tasks.csv_detect import UploadError
from verimail.tasks.csv_io import distinct_in_order
from verimail.tasks.history import latest_statuses, query


def _addresses(
    job_id: int | None, file_path: str | None, older_than_days: int, max_rows: int
) -> list[str]:
    settings = current_settings()
    if job_id is not None:
        job = job_store.get_job_any(store_for(settings).engine, job_id)
        if job is None or job.status != "completed" or job.kind not in ("bulk_csv", "bulk_json"):
            raise FormError(f"Job {job_id} is not a completed verification job.")
        frame = pl.read_parquet(job_dir(settings.data_dir, job_id) / "results.parquet")
        return distinct_in_order(frame.get_column("normalised")).to_list()
    if file_path is not None:
        path = shared_file(settings, file_path)
        try:
            return read_job_input(path, None, max_rows).uniques
        except UploadError as exc:
            raise FormError(f"{path.name}: {exc.detail}") from None
    cutoff = datetime.now(UTC) - timedelta(days=older_than_days)
    frame = query(
        settings.data_dir,
        f"SELECT email FROM latest WHERE verified_at < TIMESTAMPTZ '{cutoff.isoformat()}'",
    )
    return frame.get_column("email").to_list()


def _artifact_name(job_id: int | None, file_path: str | None, older_than_days: int) -> str:
    """One artifact key per list re-verified (its versions are the list's history)."""
    if job_id is not None:
        return f"reverify-job-{job_id}"
    if file_path is not None:
        stem = re.sub(r"[^a-z0-9]+", "-", Path(file_path).stem.lower()).strip("-")
        return f"reverify-file-{stem or 'file'}"
    return f"reverify-older-than-{older_than_days}-days"


@flow(name="reverify-stored", persist_result=False, log_prints=True)
async def reverify_stored(
    job_id: int | None = None, file_path: str | None = None, older_than_days: int = 30
) -> Any:
    """Re-verify a job's, a file's, or all stale addresses; report status changes.

    Args:
        job_id: A completed bulk job to verify again (its number). Leave empty for a file
            or for the stale addresses.
        file_path: A CSV file inside the shared data dir (e.g. inbox/leads.csv) to verify
            again and compare with the history. Leave empty for a job or the stale addresses.
        older_than_days: With neither a job nor a file: re-verify every address whose
            latest verification is older than this many days.
    """
    settings = current_settings()
    logger = get_run_logger()
    what = (
        f"job {job_id}"
        if job_id is not None
        else Path(file_path).name
        if file_path is not None
        else f"addresses older than {older_than_days} days"
    )
    await name_this_run(f"reverify {what}")
    try:
        addresses = await asyncio.to_thread(
            _addresses, job_id, file_path, older_than_days, settings.upload_max_rows
        )
    except FormError as exc:
        return refused(str(exc))
    engine = engine_for(settings)
    prepared = await prepare_addresses(addresses)
    chunks = chunk_groups(prepared.groups)
    for results in await asyncio.gather(*(verify_host_groups(c) for c in chunks)):
        for result in results:
            engine.absorb(prepared, result)
    results = [engine.verdict(prepared, a) for a in addresses]
    # The history keys each address as its result spells it (an IDN domain in ASCII, say),
    # so the previous statuses are looked up by that, before this run's are added.
    stored = [result.email for result in results]
    before = await asyncio.to_thread(latest_statuses, settings.data_dir, stored)
    previous = {
        row["email"]: (row["status"], row["verified_at"]) for row in before.iter_rows(named=True)
    }
    await asyncio.to_thread(
        append_history,
        settings.data_dir,
        results_frame(dict(zip(addresses, results, strict=True))),
        job_id=job_id,
        account_id=None,
        source="reverify",
    )
    transitions: Counter[str] = Counter()
    changed = []
    for address, result in zip(addresses, results, strict=True):
        old = previous.get(result.email)
        if old is not None and old[0] != result.status.value:
            transitions[f"{old[0]}->{result.status.value}"] += 1
            changed.append(
                {
                    "email": address,
                    "previous_status": old[0],
                    "status": result.status.value,
                    "previous_verified_at": old[1],
                    "reason": result.reason,
                }
            )
    reports = Path(settings.data_dir) / "reports"
    reports.mkdir(parents=True, exist_ok=True)
    report = reports / f"reverify-{datetime.now(UTC):%Y%m%dT%H%M%S%f}.csv"
    schema = {
        "email": pl.String,
        "previous_status": pl.String,
        "status": pl.String,
        "previous_verified_at": pl.Datetime(time_zone="UTC"),
        "reason": pl.String,
    }
    pl.DataFrame(changed, schema=schema).write_csv(report)
    logger.info("re-verified %s addresses, %s changed", len(addresses), len(changed))
    await publish_table(
        settings,
        _artifact_name(job_id, file_path, older_than_days),
        transition_rows(transitions),
        f"reverify {what}: {len(addresses)} addresses, {len(changed)} changed status; "
        f"report {report}",
    )
    return {
        "addresses": len(addresses),
        "changed": len(changed),
        "transitions": dict(transitions),
        "report": str(report),
    }
