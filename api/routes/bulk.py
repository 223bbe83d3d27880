"""Bulk jobs: ``POST /api/bulk`` (CSV upload), ``GET /api/bulk/{id}``, ``…/download``;
``POST /api/verify/bulk`` (JSON list) and ``GET /api/verify/bulk/{id}`` (with results).

Both kinds are the same job and the same ``bulk-verify`` flow; the JSON list is stored as a
headerless one-column CSV. A job id of another account is a 404, exactly like an unknown
one, so ids reveal nothing.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Annotated, Any, Literal

from anyio import to_thread
from fastapi import APIRouter, Query, Request
from fastapi.responses import FileResponse

from verimail.api.body_limit import streams_own_body
from verimail.api.deps import AccountDep, JobId, StoreDep
from verimail.api.downloads import WholeFileResponse, csv_response, partial_response
from verimail.api.errors import ApiError, error_doc, pick_error_docs
from verimail.api.jobs import (
    create_and_start,
    dropped_on_failure,
    retry_option,
    upload_refusals,
    uploads_dir,
    webhook_options,
)
from verimail.api.uploads import receive_upload, upload_body
from verimail.files.bulk_io import (
    ADDRESS_LIST_COLUMN,
    job_dir,
    read_result_page,
    results_csv,
    segment_parquet,
    write_address_list,
)
from verimail.files.csv_columns import EMAIL_HEADERS
from verimail.files.csv_detect import inspect_csv
from verimail.jobs.cancel import was_cancelled
from verimail.jobs.partial_results import partial_results_csv, waiting_for_retry
from verimail.schemas.bulk import JsonBulkRequest
from verimail.schemas.errors import ValidationErrorBody
from verimail.schemas.jobs import BulkJob, JsonBulkCreated, JsonBulkJob
from verimail.schemas.limits import MAX_INT
from verimail.store import jobs as job_store

router = APIRouter(tags=["bulk jobs"])

BULK_KINDS = ("bulk_csv", "bulk_json")

Segment = Literal["valid", "valid_and_catchall", "invalid", "unknown"]
"""The ``segment`` of a download (``files.bulk_io.SEGMENTS`` says which statuses)."""
SEGMENT_DOC = (
    "Only the rows of one segment (the header is kept): `valid` (status valid), "
    "`valid_and_catchall` (valid, likely_valid, catchall), `invalid` (invalid, disposable) "
    "or `unknown` (unknown, risky). Rows without an address are in none. Without it: every row."
)

PARTIAL_DOC = (
    "`true`: while the job waits for a deferred retry pass (`phase` `waiting_to_retry`), "
    "the rows settled so far — every row of the upload, with `Safe to Send` and a last "
    "column `Retry Pending` (`Yes` on rows parked for the retry pass, whose verdict is not "
    "known yet). A CSV only: with `format=parquet` or `segment` it is a 422. A completed job "
    "gives its whole results, as without it."
)

_422 = {
    "model": ValidationErrorBody,
    "description": "Invalid request: no file, not a CSV, empty, no email column found (or "
    "`email_column` names none), no addresses, or a bad parameter. `detail` says which.",
}
_404 = error_doc("No such job for this account (unknown ids and other accounts' jobs alike).")
_409 = error_doc(
    "The job has not completed yet (or it failed: `detail` says why). With `partial=true`: "
    "the job is still in its first pass (nothing settled is kept yet), or it failed."
)


_ERRORS: dict[int | str, dict[str, Any]] = {
    402: error_doc("Not enough credits for 1 per address; nothing was stored or charged."),
    404: _404,
    409: _409,
    413: error_doc("The upload is larger than the byte or row limit; nothing was stored."),
    422: _422,
}


def _docs(*codes: int) -> dict[int | str, dict[str, Any]]:
    return pick_error_docs(_ERRORS, codes)


UPLOAD_BODY = upload_body(
    "The CSV (UTF-8/UTF-16/Latin-1; `,` `;` tab or `|`).",
    {
        "email_column": "The column holding the addresses, when it is not one of the "
        "recognised headers (a name, or a 1-based number).",
        "webhook_url": "Optional URL POSTed the final job (signed).",
        "retry_unknowns": "`false` to finish after the first pass: greylisted and "
        "temporarily failed addresses are not retried later (default `true`).",
    },
)


RECOGNISED_HEADERS = (
    ", ".join(f"`{name}`" for name in EMAIL_HEADERS)
    + " (letter case, spaces, `_`, `-` and `.` ignored: `Email Address` and `work_email` match)"
)
"""The email headers the reader knows, from its own list (a copy here named 7 of 11)."""


@router.post(
    "/api/bulk",
    response_model=BulkJob,
    summary="Upload a CSV for bulk verification",
    description="Creates a job and reserves 1 credit per address (every row with an "
    "address, duplicates included). Poll `GET /api/bulk/{job_id}` until `completed`, then "
    f"download. Recognised email headers: {RECOGNISED_HEADERS}; a column without one is "
    "found by its content, and a headerless one-column file is accepted.",
    responses=_docs(402, 413, 422),
    openapi_extra=UPLOAD_BODY,
)
@streams_own_body
async def create_bulk(request: Request, account: AccountDep, store: StoreDep) -> BulkJob:
    settings = request.app.state.settings
    folder = uploads_dir(request) / uuid.uuid4().hex
    with dropped_on_failure(folder):
        received = await receive_upload(
            request, folder / "upload.csv", max_bytes=settings.upload_max_bytes
        )
        column = received.fields.get("email_column") or None
        webhook_url = received.fields.get("webhook_url") or None
        hook = await webhook_options(request, webhook_url)
        retry = retry_option(received.fields.get("retry_unknowns"))
        with upload_refusals():
            info = await to_thread.run_sync(
                lambda: inspect_csv(
                    received.path, max_rows=settings.upload_max_rows, email_column=column
                )
            )
        if info.email_count == 0:
            raise ApiError(422, f"The column {info.email_column!r} holds no addresses.")
    job = await create_and_start(
        request,
        store,
        account.id,
        info.email_count,
        upload=received.path,
        info=info,
        email_column=info.email_reference,
        options={"filename": received.filename, **hook, **retry},
        webhook_url=webhook_url,
    )
    out = BulkJob.of(job)
    out.webhook_secret = hook.get("webhook_secret")
    out.notice = info.column_notice("Pass email_column to verify another.")
    return out


async def owned_job(store: StoreDep, account_id: int, job_id: int) -> job_store.Job:
    job = await to_thread.run_sync(lambda: job_store.get_job(store.engine, account_id, job_id))
    if job is None or job.kind not in BULK_KINDS:
        raise ApiError(404, f"No bulk job {job_id} for this account.")
    return job


@router.get(
    "/api/bulk/{job_id}",
    response_model=BulkJob,
    summary="Poll a bulk job",
    description="The job's state (`pending` → `processing` → `completed` or `failed`), its "
    "progress and counts by status, and the credits reserved and refunded. Poll every few "
    "seconds until `completed` (then download the results) or `failed` (`failed_reason` "
    "says why; addresses not verified were refunded). Another account's job is a 404, as "
    "an unknown one.",
    responses=_docs(404, 422),
)
async def get_bulk(job_id: JobId, account: AccountDep, store: StoreDep) -> BulkJob:
    return BulkJob.of(await owned_job(store, account.id, job_id))


def _not_ready(job: job_store.Job, partial: bool = False) -> ApiError:
    if job.status == "failed":
        return ApiError(
            409, f"Job {job.id} failed, so it has no results: {job.failed_reason or 'unknown'}"
        )
    progress = f"({job.processed_emails} of {job.total_emails} verified)"
    if waiting_for_retry(job):
        return ApiError(
            409,
            f"Job {job.id} is {job.status} {progress}, {job.retry.get('waiting', 0)} addresses "
            "waiting for a retry pass; download it once its status is completed, or its "
            "settled rows now with partial=true.",
        )
    if partial:
        return ApiError(
            409,
            f"Job {job.id} is {job.status} {progress} in its first pass; partial=true gives "
            "its settled rows once it waits for a retry pass (phase waiting_to_retry), and "
            "every row once its status is completed.",
        )
    return ApiError(
        409, f"Job {job.id} is {job.status} {progress}; download it once its status is completed."
    )


@router.get(
    "/api/bulk/{job_id}/download",
    summary="Download a completed job's results CSV",
    description="The uploaded file byte for byte, with a `Safe to Send` column (`Yes`/`No`) "
    "appended. `include=details` adds `Status`, `Reason`, `Score`; `format=parquet` gives "
    "every result field as Parquet; `neutralise_formulas=true` prefixes cells that a "
    "spreadsheet would run as formulas (`=`, `+`, `-`, `@`) with `'`; `segment` keeps only "
    "the rows of one segment (e.g. `valid_and_catchall` for a list to send to). While the "
    "job waits for a deferred retry pass, `partial=true` gives the rows settled so far, "
    "the parked ones marked `Retry Pending` `Yes`; without it the answer is 409 until the "
    "job is completed. A job cancelled by its owner (`cancelled_at` set) gives its settled "
    "rows, with the details columns (409 when none was settled, or with `format=parquet` "
    "or `segment`).",
    response_class=FileResponse,
    responses={
        200: {
            "description": "The results file (CSV by default, Parquet with `format=parquet`).",
            "content": {
                "text/csv": {"schema": {"type": "string"}},
                "application/vnd.apache.parquet": {
                    "schema": {"type": "string", "format": "binary"}
                },
            },
        },
        **_docs(404, 409, 422),
    },
)
async def download_bulk(
    job_id: JobId,
    account: AccountDep,
    store: StoreDep,
    request: Request,
    format: Annotated[Literal["csv", "parquet"], Query(description="csv or parquet")] = "csv",
    include: Annotated[Literal["details"] | None, Query(description="`details`")] = None,
    neutralise_formulas: bool = False,
    segment: Annotated[Segment | None, Query(description=SEGMENT_DOC)] = None,
    partial: Annotated[bool, Query(description=PARTIAL_DOC)] = False,
) -> FileResponse:
    job = await owned_job(store, account.id, job_id)
    if partial and (format != "csv" or segment is not None):
        raise ApiError(
            422, "partial=true gives a CSV of every row: leave out format=parquet and segment."
        )
    if was_cancelled(job):
        variant = "format=parquet" if format == "parquet" else None
        if segment is not None:
            variant = "segment"
        return partial_response(
            request.app.state.settings, job, f"bulk-{job.id}-partial-results.csv", variant=variant
        )
    if partial and job.status != "completed":
        return await _partial_download(request, job, include, neutralise_formulas)
    if job.status != "completed":
        raise _not_ready(job)
    directory = job_dir(request.app.state.settings.data_dir, job.id)
    upload = Path(job.upload_path or "")
    name = f"bulk-{job.id}-" + (f"{segment}-" if segment else "") + "results"
    if format == "parquet":
        parquet = directory / "results.parquet"
        if segment is not None:
            parquet = await to_thread.run_sync(segment_parquet, directory, segment)
        return WholeFileResponse(
            parquet, media_type="application/vnd.apache.parquet", filename=f"{name}.parquet"
        )
    if include == "details" or neutralise_formulas or segment is not None:
        path = await to_thread.run_sync(
            lambda: results_csv(
                directory,
                upload,
                details=include == "details",
                neutralise_formulas=neutralise_formulas,
                segment=segment,
            )
        )
    else:
        path = Path(job.result_path or directory / "results.csv")
    return csv_response(path, directory, filename=f"{name}.csv")


async def _partial_download(
    request: Request,
    job: job_store.Job,
    include: str | None,
    neutralise_formulas: bool,
) -> FileResponse:
    """``partial=true`` on a job not completed: its settled rows while it waits for a retry
    pass, else 409."""
    settings = request.app.state.settings
    path = None
    if waiting_for_retry(job):
        path = await to_thread.run_sync(
            lambda: partial_results_csv(
                settings,
                job,
                details=include == "details",
                neutralise_formulas=neutralise_formulas,
            )
        )
    if path is None:
        raise _not_ready(job, partial=True)
    name = f"bulk-{job.id}-partial-results.csv"
    return csv_response(path, path.parent, filename=name)


@router.post(
    "/api/verify/bulk",
    response_model=JsonBulkCreated,
    summary="Verify up to 10,000 addresses as a job",
    description="Reserves 1 credit per non-empty address (duplicates included); poll "
    "`GET /api/verify/bulk/{job_id}` for progress and, once completed, the results.",
    responses=_docs(402, 422),
)
async def create_json_bulk(
    body: JsonBulkRequest, request: Request, account: AccountDep, store: StoreDep
) -> JsonBulkCreated:
    emails = [e for e in body.emails if e.strip()]
    if not emails:
        raise ApiError(422, "emails: every entry is empty; send at least one address.")
    webhook_url = str(body.webhook_url) if body.webhook_url else None
    hook = await webhook_options(request, webhook_url)
    folder = uploads_dir(request) / uuid.uuid4().hex
    upload = folder / "upload.csv"
    with dropped_on_failure(folder):
        await to_thread.run_sync(write_address_list, upload, emails)
    job = await create_and_start(
        request,
        store,
        account.id,
        len(emails),
        upload=upload,
        kind="bulk_json",
        email_column=ADDRESS_LIST_COLUMN,
        options={**hook, **retry_option(body.retry_unknowns)} or None,
        webhook_url=webhook_url,
    )
    return JsonBulkCreated(
        job_id=job.id,
        status=job.status,  # type: ignore[arg-type]
        total_emails=job.total_emails,
        webhook_secret=hook.get("webhook_secret"),
    )


@router.get(
    "/api/verify/bulk/{job_id}",
    response_model=JsonBulkJob,
    summary="Poll a JSON bulk job; its results once completed",
    description="The job as `GET /api/bulk/{job_id}` gives it, plus, once `completed`, a "
    "page of its results in submission order: `limit` results (1 to 1,000, default 100) "
    "from `offset`; `next_offset` is the offset of the next page, null on the last. "
    "Results are null while the job is `pending` or `processing`, and for a `failed` job.",
    responses=_docs(404, 422),
)
async def get_json_bulk(
    job_id: JobId,
    account: AccountDep,
    store: StoreDep,
    request: Request,
    offset: Annotated[int, Query(ge=0, le=MAX_INT)] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> JsonBulkJob:
    job = await owned_job(store, account.id, job_id)
    out = JsonBulkJob(**BulkJob.of(job).model_dump(), offset=offset, limit=limit)
    if job.status == "completed":
        directory = job_dir(request.app.state.settings.data_dir, job.id)
        page, records = await to_thread.run_sync(read_result_page, directory, offset, limit)
        out.results = page
        out.next_offset = offset + limit if offset + limit < records else None
    return out
