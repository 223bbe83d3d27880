"""Re-verifying a customer's list, as the job service sees it: whether a job can be
re-verified, the re-verification job, and the dates of its schedule.

A re-verification is a bulk job of its own (the owner's, reserving 1 credit per address
like any upload, made by ``jobs/create.py``) over a copy of the list's upload, compared with
the list's previous run (``options["reverify_of"]``): the ``bulk-verify`` flow writes
``previous_status`` / ``status_changed`` into its files and the transitions onto the job.

A schedule is one planned Prefect flow run of ``reverify-stored`` at a time
(``flows/planner.py``); when it runs it first plans its successor (``every_days``
later, :func:`next_after`), then re-verifies (``flows/reverify.py``).
"""

from __future__ import annotations

import shutil
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl

from verimail.config import Settings
from verimail.files.bulk_io import job_dir, read_job_input
from verimail.files.csv_io import distinct_in_order
from verimail.files.history import query
from verimail.files.upload_errors import UploadError
from verimail.jobs.context import store_for
from verimail.jobs.create import NotEnoughCredits, create_verify_job, stored_info
from verimail.jobs.forms import FormError, shared_file
from verimail.store import jobs as job_store
from verimail.store import reverify as reverify_store
from verimail.store.accounts import get_account
from verimail.store.billing import balance
from verimail.store.db import Store

VERIFIABLE_KINDS = ("bulk_csv", "bulk_json")


class NotReverifiable(ValueError):
    """The job cannot be re-verified (not a completed bulk job, or its upload is gone)."""


def check_reverifiable(job: job_store.Job) -> None:
    """Raise :class:`NotReverifiable` with what stops ``job`` from being re-verified now."""
    if job.kind not in VERIFIABLE_KINDS:
        raise NotReverifiable(f"Job {job.id} is not a verification job.")
    if job.status == "failed":
        raise NotReverifiable(
            f"Job {job.id} failed, so it has no results to compare with; upload the list again."
        )
    if job.status != "completed":
        raise NotReverifiable(
            f"Job {job.id} is {job.status} ({job.processed_emails} of {job.total_emails} "
            "verified); re-verify it once its status is completed."
        )
    if not job.upload_path or not Path(job.upload_path).is_file():
        raise NotReverifiable(f"Job {job.id}'s upload is no longer stored; upload it again.")


def create_reverify_job(
    store: Store,
    settings: Settings,
    previous: job_store.Job,
    *,
    webhook_url: str | None,
    webhook_secret: str | None,
    schedule_id: int | None = None,
    flow_run_id: str | None = None,
) -> job_store.Job | None:
    """The job re-verifying ``previous`` (pending, its credits reserved) and its entry in
    the list's history; None, with nothing stored or charged, when the balance is short."""
    check_reverifiable(previous)
    folder = Path(settings.data_dir) / "uploads" / uuid.uuid4().hex
    folder.mkdir(parents=True)
    upload = folder / "upload.csv"
    list_job = reverify_store.list_job_id(previous)
    options: dict[str, Any] = {"reverify_of": previous.id, "list_job_id": list_job}
    if filename := (previous.options or {}).get("filename"):
        options["filename"] = filename
    if webhook_url and webhook_secret:
        options["webhook_secret"] = webhook_secret
    try:
        shutil.copyfile(str(previous.upload_path), upload)
        job = create_verify_job(
            store,
            previous.account_id,
            previous.total_emails,
            upload=upload,
            kind=previous.kind,  # type: ignore[arg-type]
            info=stored_info(settings, previous),  # (the same bytes: no need to inspect them again)
            email_column=previous.email_column,
            options=options,
            webhook_url=webhook_url if webhook_secret else None,
            flow_run_id=flow_run_id,
        )
    except NotEnoughCredits:
        shutil.rmtree(folder, ignore_errors=True)
        return None
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    reverify_store.record_run(
        store.engine,
        job,
        account_id=job.account_id,
        list_job=list_job,
        previous_job_id=previous.id,
        schedule_id=schedule_id,
        flow_run_id=flow_run_id,
    )
    return job


def short_of_credits(store: Store, previous: job_store.Job) -> str:
    """Why a re-verification of ``previous`` was not made: the balance against the need."""
    have = balance(store.engine, previous.account_id).total
    return (
        f"Not enough credits: re-verifying this list needs {previous.total_emails} "
        f"(1 per address), the balance is {have}. Nothing was charged."
    )


def list_webhook(store: Store, account_id: int, list_job: int) -> tuple[str | None, str | None]:
    """The list's webhook URL and secret (its upload's), which scheduled runs report to."""
    job = job_store.get_job(store.engine, account_id, list_job)
    if job is None or not job.webhook_url:
        return None, None
    return job.webhook_url, (job.options or {}).get("webhook_secret")


def next_after(planned: datetime, every_days: int, now: datetime) -> datetime:
    """The first date after ``now`` on the schedule through ``planned`` (runs missed while
    nothing ran are not made up: one run, then the schedule goes on)."""
    step = timedelta(days=every_days)
    upcoming = planned + step
    if upcoming <= now:
        upcoming += step * ((now - upcoming) // step + 1)
    return upcoming


def run_name(store: Store, account_id: int, list_job: int) -> str:
    """``reverify list 17 of owner@example.com``: how the run shows in the Prefect UI."""
    account = get_account(store.engine, account_id)
    owner = account.email if account is not None and account.email else f"account {account_id}"
    return f"reverify list {list_job} of {owner}"


def any_list_due(settings: Settings) -> bool:
    """Whether the store says a list's scheduled run is due (one query, no Prefect)."""
    return reverify_store.any_due(store_for(settings).engine, datetime.now(UTC))


def addresses_to_reverify(
    settings: Settings, job_id: int | None, file_path: str | None, older_than_days: int
) -> list[str]:
    """What an operator's ``reverify-stored`` run verifies again, in order: a completed bulk
    job's addresses, a file's on the shared data dir, or every address whose latest
    verification is older than ``older_than_days``; :class:`FormError` for a wrong input."""
    max_rows = settings.upload_max_rows
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
