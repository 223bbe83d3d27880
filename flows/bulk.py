"""The ``bulk-verify`` flow: a stored upload in, results CSV/Parquet and history out.

Why one long file: the flow and its Prefect tasks (read, verify a chunk, write, retry passes)
stay together until the tasks move to ``tasks/`` in the re-plan.

Thin orchestration: the work is in ``engine/`` and ``files/``. One Prefect task per chunk
of mail-host groups (never per address), results caching and persistence off, progress
written to the job row and a Prefect progress artifact as chunks finish.

The same flow serves CSV uploads (``POST /api/bulk``), JSON lists (``POST /api/verify/bulk``)
and runs started by hand from the Prefect UI with ``file_path`` and ``account_id`` (which
create their own job row, so the API sees them).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from asyncio import FIRST_COMPLETED
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import polars as pl
from prefect import flow, get_run_logger
from prefect.artifacts import acreate_progress_artifact, aupdate_progress_artifact
from prefect.context import get_run_context
from pydantic.json_schema import SkipJsonSchema

from verimail.config import Settings, current_settings
from verimail.engine import GroupResult, HostGroup, Prepared, shared_engine
from verimail.files.bulk_io import (
    JobInput,
    ResultSink,
    append_history,
    job_dir,
    read_job_input,
    results_frame,
    write_job_results,
)
from verimail.files.upload_errors import UploadError
from verimail.flows.failures import refused
from verimail.flows.forms import (
    BulkVerifyForm,
    FormError,
    checked_webhook,
    find_account,
    shared_file,
)
from verimail.flows.job_run import park_or_finish, run_as_owner, start_job
from verimail.flows.summary import artifact_key, name_this_run, run_name
from verimail.jobs import retries
from verimail.jobs.context import db_retried, store_for
from verimail.jobs.create import NotEnoughCredits, create_verify_job, stored_info
from verimail.jobs.heartbeat import complete_run, still_owned
from verimail.schemas.results import VerificationResult
from verimail.store import jobs as job_store
from verimail.store.db import Store
from verimail.tasks.verify import chunk_groups, prepare_addresses, verify_host_groups

ARTIFACT_TIMEOUT = 5.0
"""Seconds a progress artifact's Prefect API call may take. The artifact is only a view of
progress: a Prefect server slow to answer (its client waits up to 60 s) once held a job at
100% in processing for a minute, past a test's wait."""
# A host group of more recipients is verified in pieces of this many (Prepared.split_groups),
# each settled — and counted in the job's progress — as soon as its task is done: a list on
# one big provider would otherwise show 0% until the very end.
PIECE_ADDRESSES = 2_000

# Job columns counted by status. catch_all_count holds both catch-all statuses (SPEC:
# "addresses on detected catch-all domains"); likely_valid_count is the confident part.
STATUS_COUNTS = {
    "valid": ("valid_count",),
    "invalid": ("invalid_count",),
    "catchall": ("catch_all_count",),
    "likely_valid": ("catch_all_count", "likely_valid_count"),
    "disposable": ("disposable_count",),
    "unknown": ("unknown_count",),
    "risky": ("risky_count",),
}


class _Tally:
    """Counts by status over data rows, as results come in."""

    def __init__(self, rows_per_address: dict[str, int]):
        self.rows = rows_per_address
        self.counts: Counter[str] = Counter()
        self.processed = 0

    def add(self, results: Iterable[tuple[str, VerificationResult]]) -> None:
        self.add_statuses((address, result.status.value) for address, result in results)

    def add_statuses(self, statuses: Iterable[tuple[str, str]]) -> None:
        for address, status in statuses:
            n = self.rows.get(address, 1)
            self.processed += n
            for column in STATUS_COUNTS[status]:
                self.counts[column] += n

    def job_counts(self) -> dict[str, int]:
        return {
            column: self.counts.get(column, 0) for cols in STATUS_COUNTS.values() for column in cols
        }


async def _db(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Store calls are blocking: keep them off the loop that runs the SMTP sessions."""
    return await asyncio.to_thread(fn, *args, **kwargs)


def _flow_run_id() -> str | None:
    with contextlib.suppress(Exception):
        return str(get_run_context().flow_run.id)
    return None


def create_job_for_file(
    store: Store,
    settings: Settings,
    file_path: str,
    account_id: int,
    email_column: str | None,
    webhook_url: str | None = None,
    retry_unknowns: bool = True,
) -> int:
    """A job row for a run started without one (the Prefect UI, a script): reserve like the
    API does. :class:`FormError` (one sentence) when the file or the balance will not do."""
    path = Path(file_path)
    try:
        job_input = read_job_input(path, email_column, settings.upload_max_rows)
    except UploadError as exc:
        raise FormError(f"{path.name}: {exc.detail}") from None
    count = job_input.address_rows
    options: dict[str, Any] = {"source": "prefect", "filename": path.name}
    if webhook_url:
        options["webhook_secret"] = secrets.token_urlsafe(32)
    if not retry_unknowns:
        options["retry_unknowns"] = False  # (as the API's upload form stores the opt-out)
    try:
        job = create_verify_job(
            store,
            account_id,
            count,
            upload=path.resolve(),
            info=job_input.info,
            email_column=job_input.info.email_reference,
            options=options,
            webhook_url=webhook_url,
        )
    except NotEnoughCredits as exc:
        raise FormError(
            f"Account {account_id} has {exc.have} credits and {path.name} needs {count} "
            "(1 per address row); nothing was charged."
        ) from None
    return job.id


def create_job_for_form(store: Store, settings: Settings, form: BulkVerifyForm) -> int:
    """The job of a run started from the deployment's form, its inputs checked first."""
    account = find_account(store, form.account)
    path = shared_file(settings, form.file)
    webhook_url = checked_webhook(settings, form.webhook_url)
    return create_job_for_file(
        store,
        settings,
        str(path),
        account.id,
        form.email_column,
        webhook_url,
        retry_unknowns=form.retry_unknowns,
    )


@flow(name="bulk-verify", persist_result=False, log_prints=True)
async def bulk_verify(
    job_id: SkipJsonSchema[int | None] = None,
    file_path: SkipJsonSchema[str | None] = None,
    account_id: SkipJsonSchema[int | None] = None,
    email_column: SkipJsonSchema[str | None] = None,
    attempt: SkipJsonSchema[int | None] = None,
    verify: BulkVerifyForm | SkipJsonSchema[None] = None,
    retry_pass: SkipJsonSchema[int] = 0,
) -> Any:
    """Verify a CSV file for an account, or (the API's runs) a bulk job.

    Args:
        verify: The account, the file on the shared data dir, the email column, a webhook.
    """
    settings = current_settings()
    store = store_for(settings)
    if job_id is None:
        try:
            if verify is not None:
                job_id = await _db(create_job_for_form, store, settings, verify)
            elif file_path is not None and account_id is not None:
                job_id = await _db(
                    create_job_for_file, store, settings, file_path, account_id, email_column
                )
            else:
                raise FormError("Fill in the form: the account and the CSV file to verify.")
        except FormError as exc:
            return refused(str(exc))
    started = await start_job(
        store, job_id, attempt, flow_run_id=_flow_run_id(), retry_pass=retry_pass
    )
    if not isinstance(started, job_store.Job):
        return started
    job = started
    if verify is not None and job.webhook_url and job.status == "pending":
        secret = (job.options or {}).get("webhook_secret")
        get_run_logger().info("job %s: its webhook signing key is %s", job.id, secret)
    work = _retry(settings, store, job, retry_pass) if retry_pass else _run(settings, store, job)
    return await run_as_owner(
        settings, store, job, work, unverified=job_store.UNVERIFIED, kind="bulk"
    )


async def _run(settings: Settings, store: Store, job: job_store.Job) -> dict[str, Any]:
    logger = get_run_logger()
    # (Here, under the job's heartbeat: a slow Prefect API must not make the job look dead.)
    await name_this_run(run_name(job))
    engine = shared_engine(settings)
    directory = job_dir(settings.data_dir, job.id)
    upload = Path(job.upload_path or directory / "upload.csv")
    job_input: JobInput = await asyncio.to_thread(
        read_job_input,
        upload,
        job.email_column,
        settings.upload_max_rows,
        stored_info(settings, job),
    )
    prepared = await prepare_addresses(job_input.uniques)
    tally = _Tally(job_input.row_counts())
    await still_owned(store, job)  # (a run frozen while it read the list stops here)
    sink = ResultSink(directory, run=job.attempt)
    prepared.split_groups(PIECE_ADDRESSES)
    chunks = chunk_groups(prepared.groups)
    n_groups = len(prepared.groups)
    # Each result goes to the tally and the sink as it is known, and the engine forgets it:
    # the run holds the work still to do and one part of results, never the whole list.
    settled = list(engine.settle(prepared, prepared.decided_inputs()))
    prepared.groups = []  # the chunks hold them now
    tally.add(settled)
    sink.add(settled)
    total = max(job_input.address_rows, 1)
    artifact = None
    with contextlib.suppress(Exception):
        async with asyncio.timeout(ARTIFACT_TIMEOUT):
            artifact = await acreate_progress_artifact(
                progress=100.0 * tally.processed / total,
                key=artifact_key(settings, f"bulk-job-{job.id}-progress"),
                description=f"Bulk job {job.id}: {job_input.address_rows} addresses",
            )
    await db_retried(_progress, store, job, tally)
    logger.info(
        "job %s: %s rows, %s unique, %s domains, %s host groups in %s tasks",
        job.id,
        job_input.address_rows,
        len(job_input.uniques),
        prepared.stats.domains,
        n_groups,
        len(chunks),
    )
    # A set that loses each task as it is handled (a finished task holds its chunk and its
    # findings), and whose tasks are stopped with the run: cancelling this coroutine alone
    # would leave their SMTP sessions talking.
    pending = {asyncio.ensure_future(_chunk(c)) for c in chunks}
    del chunks
    try:
        while pending:
            finished, pending = await asyncio.wait(pending, return_when=FIRST_COMPLETED)
            for task in finished:
                chunk, results = task.result()
                for result in results:
                    engine.absorb(prepared, result)
                for group in chunk:
                    settled = list(engine.settle(prepared, prepared.emails_of(group), group))
                    tally.add(settled)
                    sink.add(settled)
            del finished, task, chunk, results
            await db_retried(_progress, store, job, tally)
            if artifact is not None:
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(ARTIFACT_TIMEOUT):
                        await aupdate_progress_artifact(
                            artifact, progress=100.0 * tally.processed / total
                        )
    finally:
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)  # they hang up first
    by_address = await asyncio.to_thread(sink.frame)
    await still_owned(store, job)
    waiting = await _park_or_finish(settings, job, directory, by_address, tally, done_pass=0)
    if waiting is not None:
        sink.remove()
        return waiting
    return await _finish(settings, store, job, upload, job_input, by_address, tally, prepared, sink)


async def _park_or_finish(
    settings: Settings,
    job: job_store.Job,
    directory: Path,
    by_address: pl.DataFrame,
    tally: _Tally,
    *,
    done_pass: int,
) -> dict[str, Any] | None:
    """After pass ``done_pass``: park the job, its put-off addresses to ask again, or None
    when it finishes now (see :func:`~verimail.flows.job_run.park_or_finish`)."""
    return await park_or_finish(
        settings,
        job,
        directory,
        by_address,
        key="normalised",
        done_pass=done_pass,
        processed=tally.processed,
        counts=tally.job_counts(),
    )


async def _retry(
    settings: Settings, store: Store, job: job_store.Job, retry_pass: int
) -> dict[str, Any]:
    """Deferred pass ``retry_pass``: ask the parked addresses again, replace their rows,
    then park again or finish. Other addresses keep the results they had."""
    engine = shared_engine(settings)
    directory = job_dir(settings.data_dir, job.id)
    upload = Path(job.upload_path or directory / "upload.csv")
    job_input: JobInput = await asyncio.to_thread(
        read_job_input,
        upload,
        job.email_column,
        settings.upload_max_rows,
        stored_info(settings, job),
    )
    earlier = await asyncio.to_thread(pl.read_parquet, retries.state_path(directory))
    again = retries.parked(earlier)
    fresh: dict[str, VerificationResult] = {}
    async for raw, result in engine.stream(again):
        fresh[raw] = result
    by_address = pl.concat(
        [earlier.filter(~pl.col("normalised").is_in(again)), results_frame(fresh)]
    )
    tally = _Tally(job_input.row_counts())
    tally.add_statuses(zip(by_address["normalised"], by_address["status"], strict=True))
    await still_owned(store, job)
    waiting = await _park_or_finish(
        settings, job, directory, by_address, tally, done_pass=retry_pass
    )
    if waiting is not None:
        return waiting
    summary = await _finish(settings, store, job, upload, job_input, by_address, tally, None, None)
    retries.state_path(directory).unlink(missing_ok=True)
    return summary


async def _finish(
    settings: Settings,
    store: Store,
    job: job_store.Job,
    upload: Path,
    job_input: JobInput,
    by_address: Any,
    tally: _Tally,
    prepared: Prepared | None,
    sink: ResultSink | None,
) -> dict[str, Any]:
    """The last pass's end: history, result files, and the job completed (credits settled)."""
    directory = job_dir(settings.data_dir, job.id)
    await asyncio.to_thread(
        append_history,
        settings.data_dir,
        by_address,
        job_id=job.id,
        account_id=job.account_id,
        source="bulk",
        once_per_job=True,
    )
    files = await asyncio.to_thread(
        write_job_results,
        directory,
        upload,
        job_input,
        by_address,
        run=job.attempt,
        previous=_previous_results(settings, job),
    )
    if sink is not None:
        sink.remove()
    await complete_run(
        store,
        job,
        files,
        tally.job_counts(),
        job_input.address_rows,
        processed=tally.processed,
    )
    return {
        "job_id": job.id,
        "status": "completed",
        **tally.job_counts(),
        **(prepared.stats.as_dict() if prepared is not None else {}),
    }


def _previous_results(settings: Settings, job: job_store.Job) -> Path | None:
    """A re-verification's job compares with the results of the run it re-verifies."""
    previous = (job.options or {}).get("reverify_of")
    if previous is None:
        return None
    return job_dir(settings.data_dir, int(previous)) / "results.parquet"


def _progress(store: Store, job: job_store.Job, tally: _Tally) -> None:
    job_store.update_progress(
        store.engine,
        job.id,
        tally.processed,
        tally.job_counts(),
        unique_emails=len(tally.rows),  # (one entry per distinct address)
        attempt=job.attempt,
    )


async def _chunk(chunk: list[HostGroup]) -> tuple[list[HostGroup], list[GroupResult]]:
    return chunk, await verify_host_groups(chunk)
