"""Stopping and deleting jobs: ``POST /api/bulk/{id}/cancel``, ``DELETE /api/bulk/{id}``
and the same two for finder CSV jobs (``/api/find-email/csv/{id}``).

The rules are the job service's (``jobs/cancel.py``, ``jobs/delete.py``); the Prefect side
(planned runs cancelled) is the runners' (``runners/cancel_runs.py``). Another account's
job is a 404, as an unknown one; so is a deleted one.
"""

from __future__ import annotations

from typing import Any

from anyio import to_thread
from fastapi import APIRouter, Request, Response

from verimail.api.deps import AccountDep, JobId, StoreDep
from verimail.api.errors import ApiError, error_doc, pick_error_docs
from verimail.api.routes import bulk, finder_csv
from verimail.config import Settings
from verimail.jobs.cancel import cancel_for_owner
from verimail.jobs.delete import delete_job
from verimail.runners.cancel_runs import cancel_job_runs
from verimail.schemas.errors import ValidationErrorBody
from verimail.schemas.jobs import BulkJob, FinderJob
from verimail.store import jobs as job_store
from verimail.store.db import Store

router = APIRouter()

CANCEL_DOC = (
    "Stops the job: the rows settled so far are kept (download them with the job's download "
    "endpoint, which serves the partial results of a cancelled job), every address not "
    "settled is refunded, and the job ends `failed` with `cancelled_at` set and "
    '`failed_reason` "cancelled by its owner after N of M rows". A running flow stops '
    "within a heartbeat (seconds); a planned retry pass is cancelled in Prefect. "
    "Idempotent: cancelling a cancelled job answers the same job, and refunds nothing more."
)
DELETE_DOC = (
    "Deletes the job's data: the upload, the results (CSV, Parquet, segments, a cancelled "
    "job's partial results) and its rows in the verification history. The credit ledger "
    "keeps its rows, which name the job. A job still running is cancelled first (its "
    "unsettled addresses refunded). Afterwards the job is a 404 everywhere. Answers 204 "
    "with no body; deleting it again is a 404."
)
_422 = {"model": ValidationErrorBody, "description": "A malformed request; `detail` says what."}
_ERRORS: dict[int | str, dict[str, Any]] = {
    404: error_doc("No such job for this account (unknown ids and other accounts' jobs alike)."),
    422: _422,
    409: error_doc("The job had already ended (completed, or failed on its own): nothing to stop."),
}
_CANCEL_ERRORS = pick_error_docs(_ERRORS, (404, 409, 422))
_DELETE_ERRORS = {
    204: {"description": "Deleted: nothing of the job's data is left."},
    **pick_error_docs(_ERRORS, (404, 422)),
}


def _ended(job: job_store.Job, what: str) -> ApiError:
    """The 409 of a job that ended without its owner's cancellation."""
    if job.status == "completed":
        return ApiError(409, f"{what} had already completed: nothing to cancel; download it.")
    return ApiError(409, f"{what} had already failed: {job.failed_reason or 'unknown'}")


async def cancel_owned(
    request: Request, store: Store, job: job_store.Job, what: str
) -> job_store.Job:
    """Cancel the caller's own ``job``: the job cancelled (now or before); 409 when it had
    ended otherwise. ``what`` names it in the refusal."""
    settings: Settings = request.app.state.settings
    done = await to_thread.run_sync(cancel_for_owner, settings, store, job.id)
    if done is None:
        current = await to_thread.run_sync(job_store.get_job_any, store.engine, job.id)
        raise _ended(current or job, what)
    await cancel_job_runs(settings, job.id, why="cancelled by its owner")
    return done


async def delete_owned(request: Request, store: Store, job: job_store.Job) -> Response:
    """Delete the caller's own ``job`` (cancelled first if it runs) and cancel its planned
    runs in Prefect: the 204."""
    settings: Settings = request.app.state.settings
    deleted = await to_thread.run_sync(delete_job, settings, store, job.id)
    await cancel_job_runs(settings, job.id, deleted.planned_runs, why="deleted by its owner")
    return Response(status_code=204)


@router.post(
    "/api/bulk/{job_id}/cancel",
    response_model=BulkJob,
    tags=["bulk jobs"],
    summary="Cancel a bulk job",
    description=CANCEL_DOC,
    responses=_CANCEL_ERRORS,
)
async def cancel_bulk(
    job_id: JobId, account: AccountDep, store: StoreDep, request: Request
) -> BulkJob:
    job = await bulk.owned_job(store, account.id, job_id)
    return BulkJob.of(await cancel_owned(request, store, job, f"Job {job_id}"))


@router.delete(
    "/api/bulk/{job_id}",
    status_code=204,
    response_class=Response,
    tags=["bulk jobs"],
    summary="Delete a bulk job and its data",
    description=DELETE_DOC,
    responses=_DELETE_ERRORS,
)
async def delete_bulk(
    job_id: JobId, account: AccountDep, store: StoreDep, request: Request
) -> Response:
    return await delete_owned(request, store, await bulk.owned_job(store, account.id, job_id))


@router.post(
    "/api/find-email/csv/{job_id}/cancel",
    response_model=FinderJob,
    tags=["email finder"],
    summary="Cancel an Email Finder CSV job",
    description=CANCEL_DOC.replace(
        "every address not settled is refunded",
        "only the finds in the partial results stay charged",
    ),
    responses=_CANCEL_ERRORS,
)
async def cancel_finder(
    job_id: str, account: AccountDep, store: StoreDep, request: Request
) -> FinderJob:
    job = await finder_csv.owned_job(store, account.id, job_id)
    return FinderJob.of(await cancel_owned(request, store, job, f"Job {job_id}"))


@router.delete(
    "/api/find-email/csv/{job_id}",
    status_code=204,
    response_class=Response,
    tags=["email finder"],
    summary="Delete an Email Finder CSV job and its data",
    description=DELETE_DOC,
    responses=_DELETE_ERRORS,
)
async def delete_finder(
    job_id: str, account: AccountDep, store: StoreDep, request: Request
) -> Response:
    return await delete_owned(request, store, await finder_csv.owned_job(store, account.id, job_id))
