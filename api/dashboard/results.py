"""A bulk job's results in the dashboard: the breakdown chart and segment links of its
page, and ``/dashboard/jobs/{id}/results``, a paged preview filtered by status,
sub-status and domain (read from the job's Parquet file, never the whole file at once)."""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import urlencode

from anyio import to_thread
from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from verimail.api.dashboard.charts import breakdown, finder_slices, job_slices
from verimail.api.dashboard.labels import status_label
from verimail.api.dashboard.web import (
    PREFIX,
    CurrentAccount,
    DashboardRoute,
    StoreDep,
    own_job,
    render,
)
from verimail.api.deps import JobId
from verimail.api.errors import ApiError
from verimail.api.routes.bulk import BULK_KINDS
from verimail.files.bulk_io import SEGMENTS, ResultFilter, job_dir, read_result_page, result_facets
from verimail.store.jobs import Job

router = APIRouter(prefix=PREFIX, route_class=DashboardRoute, include_in_schema=False)

PREVIEW_PAGE = 25
SEGMENT_LABELS = {
    "valid": "Valid only",
    "valid_and_catchall": "Valid, likely valid and catch-all",
    "invalid": "Invalid and disposable (remove them)",
    "unknown": "Unknown and risky (try again later)",
}
FILTER_MAX = 300
"""Longest filter value taken from the query (a domain is at most 253 characters)."""


def _segment_counts(view: dict[str, Any]) -> dict[str, int]:
    return {
        "valid": view["valid_count"],
        "valid_and_catchall": view["valid_count"] + view["catch_all_count"],
        "invalid": view["invalid_count"] + view["disposable_count"],
        "unknown": view["unknown_count"] + view["risky_count"],
    }


def job_extras(job: Job, view: dict[str, Any]) -> dict[str, Any]:
    """The job page's chart, its list of counts by status group, and the segment
    downloads (``chart`` None before any result)."""
    if job.kind == "finder_csv":
        slices = finder_slices(view)
        chart = breakdown(slices, title="Rows by result") if view["processed_emails"] else None
        return {"chart": chart, "segments": [], "status_groups": []}
    slices = job_slices(view)  # (the chart and the list under it: the same status groups)
    chart = breakdown(slices, title="Results by status") if view["processed_emails"] else None
    counts = _segment_counts(view)
    segments = [(key, SEGMENT_LABELS[key], counts[key]) for key in SEGMENTS]
    groups = [(s.key, s.label, s.count) for s in slices]
    return {"chart": chart, "segments": segments, "status_groups": groups}


def _clean(value: str | None) -> str | None:
    value = (value or "").strip()
    return value[:FILTER_MAX] or None


@router.get("/jobs/{job_id}/results")
async def results_page(
    request: Request,
    job_id: JobId,
    account: CurrentAccount,
    store: StoreDep,
    status: Annotated[str | None, Query(max_length=FILTER_MAX)] = None,
    sub_status: Annotated[str | None, Query(max_length=FILTER_MAX)] = None,
    domain: Annotated[str | None, Query(max_length=FILTER_MAX)] = None,
    page: Annotated[int, Query(ge=1, le=1_000_000)] = 1,
) -> Response:
    """One page of a completed bulk job's results, filtered."""
    job = await own_job(store, account.id, job_id)
    if job.kind not in BULK_KINDS:
        raise ApiError(404, "Only bulk verification jobs have a results preview.")
    if job.status != "completed":
        raise ApiError(
            409,
            f"Job {job.id} is {status_label(job.status).lower()}; its results "
            "can be previewed once it has completed.",
        )
    where = ResultFilter(
        statuses=(s,) if (s := _clean(status)) else (),
        sub_status=_clean(sub_status),
        domain=d.lower() if (d := _clean(domain)) else None,
    )
    directory = job_dir(request.app.state.settings.data_dir, job.id)
    offset = (page - 1) * PREVIEW_PAGE

    def read() -> tuple[list[dict[str, Any]], int, dict[str, list[tuple[str, int]]]]:
        rows, total = read_result_page(directory, offset, PREVIEW_PAGE, where)
        return rows, total, result_facets(directory)

    rows, total, facets = await to_thread.run_sync(read)
    chosen = {
        "status": where.statuses[0] if where.statuses else None,
        "sub_status": where.sub_status,
        "domain": where.domain,
    }
    query = {k: v for k, v in chosen.items() if v}

    def page_url(number: int) -> str:
        return f"{PREFIX}/jobs/{job.id}/results?" + urlencode({**query, "page": number})

    return render(
        request,
        "results.html",
        {
            "job": job,
            "rows": rows,
            "total": total,
            "facets": facets,
            "chosen": chosen,
            "page": page,
            "first": offset + 1,
            "prev_url": page_url(page - 1) if page > 1 else None,
            "next_url": page_url(page + 1) if offset + PREVIEW_PAGE < total else None,
            "filtered": bool(query),
        },
        account=account,
    )
