"""Email Finder CSV jobs: ``POST /api/find-email/csv``, ``GET …/{job_id}``, ``…/download``.

Job ids are strings (SPEC §2.7): the job's public id (``fj_…``), never the row number.
Finds are charged one by one as the job goes (``flows/finder.py``); creating the job
charges nothing but needs a balance that can pay for at least one find (else 402).
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from anyio import to_thread
from fastapi import APIRouter, Request
from fastapi.responses import FileResponse

from verimail.api.body_limit import streams_own_body
from verimail.api.deps import AccountDep, StoreDep
from verimail.api.downloads import csv_response, partial_response
from verimail.api.errors import (
    ApiError,
    error_doc,
    pick_error_docs,
)
from verimail.api.jobs import (
    dropped_on_failure,
    retry_option,
    start_run,
    upload_refusals,
    uploads_dir,
    webhook_options,
)
from verimail.api.routes.finder import FINDER_DISABLED, FinderAccountDep, SettingsDep
from verimail.api.uploads import ReceivedUpload, receive_upload, upload_body
from verimail.config import Settings
from verimail.files.csv_io import finder_columns
from verimail.jobs import create as job_service
from verimail.jobs.cancel import was_cancelled
from verimail.schemas.errors import ValidationErrorBody
from verimail.schemas.jobs import FinderJob
from verimail.store import jobs as job_store
from verimail.store.accounts import Account
from verimail.store.db import Store

router = APIRouter(tags=["email finder"])


_ERRORS: dict[int | str, dict[str, Any]] = {
    402: error_doc("The balance cannot pay for even one find; nothing was stored."),
    403: error_doc(FINDER_DISABLED),
    404: error_doc("No such finder job for this account."),
    409: error_doc("The job has not completed yet (or it failed: `detail` says why)."),
    413: error_doc("The upload is larger than the byte or row limit; nothing was stored."),
    422: {
        "model": ValidationErrorBody,
        "description": "No file, not a CSV, or a first-name, last-name or domain column "
        "that is neither detected nor named (the `detail` names what is missing).",
    },
}


def _docs(*codes: int) -> dict[int | str, dict[str, Any]]:
    return pick_error_docs(_ERRORS, codes)


UPLOAD_BODY = upload_body(
    "The CSV of people.",
    {
        "first_name_column": "Column of first names; optional when a header like "
        "`first_name`, `First Name`, `firstname` is present.",
        "last_name_column": "Column of last names; optional when a header like `last_name`, "
        "`surname` is present.",
        "domain_column": "Column of company domains; optional when a header like `domain`, "
        "`company_domain`, `website` is present (URLs are reduced to their domain).",
        "webhook_url": "Optional URL POSTed the final job (signed).",
        "retry_unknowns": "`false` to finish after the first pass: rows whose mail server "
        "greylisted or put off the lookup stay `not_found` instead of being looked up "
        "again later (default `true`).",
    },
)


@router.post(
    "/api/find-email/csv",
    response_model=FinderJob,
    summary="Upload a CSV of people for the Email Finder",
    description="Creates a job; each verified find is charged as the job goes, and when "
    "credits run out the remaining rows become `skipped_no_credits`. Rows whose mail "
    "server greylisted or put off the lookup (a temporary failure, a timeout, a refused "
    "connection) are looked up again in later passes, as a bulk job's addresses are: the "
    "job shows `phase` `waiting_to_retry` meanwhile, and the results come after the last "
    "pass (`retry_unknowns=false`: after the first). Poll "
    "`GET /api/find-email/csv/{job_id}`, then download: the upload plus `email`, `status`, "
    "`confidence` columns.",
    responses=_docs(402, 403, 413, 422),
    openapi_extra=UPLOAD_BODY,
)
@streams_own_body
async def create_finder_job(
    request: Request, account: FinderAccountDep, store: StoreDep, settings: SettingsDep
) -> FinderJob:
    folder = uploads_dir(request) / uuid.uuid4().hex
    with dropped_on_failure(folder):
        received = await receive_upload(
            request, folder / "upload.csv", max_bytes=settings.upload_max_bytes
        )
        job, hook = await create_from_upload(request, account, store, settings, received)
    await start_run(request, store, job)
    out = FinderJob.of(job)
    if hook:
        out.webhook_secret = hook["webhook_secret"]  # type: ignore[attr-defined]
    return out


async def create_from_upload(
    request: Request,
    account: Account,
    store: Store,
    settings: Settings,
    received: ReceivedUpload,
) -> tuple[job_store.Job, dict[str, str]]:
    """The job of a received people CSV (its columns found, the balance checked), not yet
    started; raises the API's 402/413/422. Shared with the dashboard's finder upload."""
    fields = received.fields
    webhook_url = fields.get("webhook_url") or None
    hook = await webhook_options(request, webhook_url)
    retry = retry_option(fields.get("retry_unknowns"))
    mapping = {
        key: fields.get(key) or None
        for key in ("first_name_column", "last_name_column", "domain_column")
    }

    with upload_refusals():
        info, _ = await to_thread.run_sync(
            finder_columns, received.path, mapping, settings.upload_max_rows
        )
    if info.row_count == 0:
        raise ApiError(422, "The file has no data rows.")
    try:
        job = await to_thread.run_sync(
            lambda: job_service.create_finder_job(
                store,
                settings,
                account.id,
                info.row_count,
                upload=received.path,
                info=info,
                options={**mapping, "filename": received.filename, **hook, **retry},
                webhook_url=webhook_url,
            )
        )
    except job_service.NotEnoughCredits as exc:
        raise ApiError(
            402,
            f"Not enough credits: a found address costs {exc.needed}, the "
            f"balance is {exc.have}; nothing was stored.",
        ) from None
    return job, hook


async def owned_job(store: StoreDep, account_id: int, job_id: str) -> job_store.Job:
    job = await to_thread.run_sync(
        lambda: job_store.get_job_by_public_id(store.engine, account_id, job_id)
    )
    if job is None or job.kind != "finder_csv":
        raise ApiError(404, f"No finder job {job_id!r} for this account.")
    return job


@router.get(
    "/api/find-email/csv/{job_id}",
    response_model=FinderJob,
    summary="Poll an Email Finder CSV job",
    description="The job's state (`pending` → `processing` → `completed` or `failed`), its "
    "progress, counts by outcome and the credits used so far. Any key of the account may "
    "poll it, also after the account's Email Finder is switched off. Another account's job "
    "is a 404, as an unknown one.",
    responses=_docs(404, 422),
)
async def get_finder_job(job_id: str, account: AccountDep, store: StoreDep) -> FinderJob:
    # Not FinderAccountDep: a job made while the finder was on stays the account's to poll
    # and download after it is switched off (only creating jobs needs the finder).
    return FinderJob.of(await owned_job(store, account.id, job_id))


@router.get(
    "/api/find-email/csv/{job_id}/download",
    summary="Download an Email Finder job's results CSV",
    description="The uploaded file byte for byte with `email`, `status` (`found`, "
    "`not_found`, `catch_all`, `invalid_input`, `skipped_no_credits`) and `confidence` "
    "columns appended. 409 until the job is `completed`. A job cancelled by its owner "
    "(`cancelled_at` set) gives the rows it had looked up (409 when there were none).",
    response_class=FileResponse,
    responses={
        200: {
            "description": "The results CSV.",
            "content": {"text/csv": {"schema": {"type": "string"}}},
        },
        **_docs(404, 409, 422),
    },
)
async def download_finder_job(
    job_id: str, account: AccountDep, store: StoreDep, request: Request
) -> FileResponse:
    job = await owned_job(store, account.id, job_id)
    if was_cancelled(job):
        return partial_response(request.app.state.settings, job, f"{job_id}-partial-results.csv")
    if job.status == "failed":
        raise ApiError(409, f"Job {job_id} failed, so it has no results: {job.failed_reason}")
    if job.status != "completed":
        raise ApiError(
            409,
            f"Job {job_id} is {job.status} ({job.processed_emails} of {job.total_emails} rows "
            "done); download it once its status is completed.",
        )
    path = Path(job.result_path or "")
    return csv_response(path, path.parent, filename=f"{job_id}-results.csv")
