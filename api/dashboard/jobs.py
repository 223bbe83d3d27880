"""The account's jobs under ``/dashboard/jobs``: the list, a job's page (with the results
preview and the re-verification panel of their modules), its progress for the page's
polling script, and its download through the API's own.

A job is read with the account's id (``own_job``), so another account's job is a 404
exactly like an unknown one.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from anyio import to_thread
from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response

from verimail.api.dashboard import results as results_pages
from verimail.api.dashboard import reverify as reverify_pages
from verimail.api.dashboard.progress import progress_fields
from verimail.api.dashboard.web import (
    PAGE_SIZE,
    PREFIX,
    CurrentAccount,
    DashboardRoute,
    StoreDep,
    own_job,
    page_number,
    render,
)
from verimail.api.deps import JobId
from verimail.api.routes import bulk, finder_csv
from verimail.jobs.cancel import was_cancelled
from verimail.jobs.create import stored_info
from verimail.schemas.jobs import BulkJob, FinderJob
from verimail.store import jobs as job_store

router = APIRouter(prefix=PREFIX, route_class=DashboardRoute, include_in_schema=False)


def _job_view(job: job_store.Job) -> dict[str, Any]:
    """The job as the API shows it: a finder job's fields for a finder job (its rows
    under the names the progress bar and the page's polling script read)."""
    if job.kind == "finder_csv":
        view = FinderJob.of(job).model_dump(mode="json")
        view.update(processed_emails=view["processed_rows"], total_emails=view["total_rows"])
    else:
        view = BulkJob.of(job).model_dump(mode="json")
    view.update(progress_fields(job, view))
    return view


def job_rows(jobs: list[job_store.Job]) -> list[dict[str, Any]]:
    return [
        {"job": j, "view": _job_view(j), "downloadable": _downloadable(j), "partial": _partial(j)}
        for j in jobs
    ]


def _partial(job: job_store.Job) -> int:
    """A cancelled job's settled rows, downloadable (0: none, or not cancelled)."""
    if not was_cancelled(job):
        return 0
    return int((job.options or {})["cancelled"].get("settled_rows", 0))


def _downloadable(job: job_store.Job) -> bool:
    return job.status == "completed" and job.kind in (*bulk.BULK_KINDS, "finder_csv")


@router.get("/jobs")
async def jobs_page(
    request: Request, account: CurrentAccount, store: StoreDep, page: int = 1
) -> Response:
    page = page_number(page)
    rows = await to_thread.run_sync(
        lambda: job_store.list_jobs(
            store.engine, account.id, limit=PAGE_SIZE + 1, offset=(page - 1) * PAGE_SIZE
        )
    )
    return render(
        request,
        "jobs.html",
        {"jobs": job_rows(rows[:PAGE_SIZE]), "page": page, "has_next": len(rows) > PAGE_SIZE},
        account=account,
    )


@router.get("/jobs/{job_id}")
async def job_page(
    request: Request, job_id: JobId, account: CurrentAccount, store: StoreDep
) -> Response:
    job = await own_job(store, account.id, job_id)
    filename = (job.options or {}).get("filename")
    row = job_rows([job])[0]
    return render(
        request,
        "job.html",
        {
            "row": row,
            "filename": filename,
            "column_notice": await _column_notice(request, job),
            **results_pages.job_extras(job, row["view"]),
            **await reverify_pages.reverify_panel(store, job),
        },
        account=account,
    )


async def _column_notice(request: Request, job: job_store.Job) -> str | None:
    """Which column was verified, when more than one holds addresses (the upload's kept
    inspection says): the first one is, and the page says so (issue 36)."""
    if job.kind != "bulk_csv":
        return None
    info = await to_thread.run_sync(stored_info, request.app.state.settings, job)
    return info.column_notice("") if info is not None else None


@router.get("/jobs/{job_id}/progress")
async def job_progress(job_id: JobId, account: CurrentAccount, store: StoreDep) -> Response:
    """What the page's polling script reads (the API's job fields, as JSON)."""
    job = await own_job(store, account.id, job_id)
    body = _job_view(job)
    body["finished"] = job.finished
    return JSONResponse(body)


@router.get("/jobs/{job_id}/download")
async def job_download(
    request: Request,
    job_id: JobId,
    account: CurrentAccount,
    store: StoreDep,
    format: Annotated[Literal["csv", "parquet"], Query()] = "csv",
    include: Annotated[Literal["details"] | None, Query()] = None,
    neutralise_formulas: bool = False,
    segment: Annotated[bulk.Segment | None, Query()] = None,
) -> Response:
    """The API's download (same files, same 404/409), for the signed-in account."""
    job = await own_job(store, account.id, job_id)
    if job.kind == "finder_csv":
        return await finder_csv.download_finder_job(job.public_id, account, store, request)
    return await bulk.download_bulk(
        job_id,
        account,
        store,
        request,
        format=format,
        include=include,
        neutralise_formulas=neutralise_formulas,
        segment=segment,
    )
