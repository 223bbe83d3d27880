"""The account's jobs, a page at a time: ``GET /api/bulk`` and ``GET /api/find-email/csv``.

Each item is the job exactly as its poll endpoint gives it, so a script that lists its jobs
reads them with the model it already has. Only the caller's account is ever listed (the
store's query carries it); another account's jobs are never among the items. Paging is by
an opaque cursor (:mod:`verimail.api.cursors`), newest first.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from anyio import to_thread
from fastapi import APIRouter, Depends, Query

from verimail.api.cursors import decode_cursor, encode_cursor
from verimail.api.deps import AccountDep, StoreDep
from verimail.api.errors import ApiError, pick_error_docs
from verimail.api.routes.bulk import BULK_KINDS
from verimail.schemas.errors import ValidationErrorBody
from verimail.schemas.jobs import BulkJob, BulkJobList, FinderJob, FinderJobList
from verimail.schemas.limits import MAX_PAGE
from verimail.schemas.query_times import QueryDateTime
from verimail.store.db import Store
from verimail.store.job_list import JobFilter, jobs_page
from verimail.store.jobs import Job

router = APIRouter()

Status = Literal["pending", "processing", "completed", "failed"]
BulkKind = Literal["bulk_csv", "bulk_json"]

StatusQuery = Annotated[
    list[Status] | None,
    Query(
        max_length=4,
        description="Only jobs in these states (repeat it for several: "
        "`status=pending&status=processing`). Default: every state.",
    ),
]
FromQuery = Annotated[
    QueryDateTime | None,
    Query(
        description="Only jobs created at or after this time (ISO 8601; a date is its "
        "midnight; without a zone: UTC)."
    ),
]
ToQuery = Annotated[
    QueryDateTime | None,
    Query(
        description="Only jobs created before this time (excluded; same forms as `created_from`)."
    ),
]
LimitQuery = Annotated[
    int, Query(ge=1, le=MAX_PAGE, description=f"Jobs per page, 1 to {MAX_PAGE} (default 20).")
]
CursorQuery = Annotated[
    str | None,
    Query(
        max_length=200,
        description="The `next_cursor` of the previous page; leave it out "
        "for the first (newest) page. Send the same filters with it.",
    ),
]

_ERRORS: dict[int | str, dict[str, Any]] = {
    422: {
        "model": ValidationErrorBody,
        "description": "A bad filter: an unknown `status` or `kind`, a time that is not ISO "
        "8601, `created_from` not before `created_to`, `limit` outside 1 to "
        f"{MAX_PAGE}, or a `cursor` this list did not give. `detail` says which.",
    },
}


@dataclass
class ListQuery:
    """The query parameters both lists take (FastAPI fills it as a dependency)."""

    status: StatusQuery = None
    created_from: FromQuery = None
    created_to: ToQuery = None
    limit: LimitQuery = 20
    cursor: CursorQuery = None


ListQueryDep = Annotated[ListQuery, Depends()]


def _utc(name: str, value: datetime | None) -> datetime | None:
    """``value`` in UTC (a naive time is taken as UTC); 422 when it has no UTC equivalent."""
    if value is None:
        return None
    try:
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    except (OverflowError, ValueError):
        raise ApiError(422, f"{name}: {value.isoformat()} is out of range.") from None


def _filter(kinds: tuple[str, ...], query: ListQuery) -> JobFilter:
    start, end = _utc("created_from", query.created_from), _utc("created_to", query.created_to)
    if start is not None and end is not None and start >= end:
        raise ApiError(
            422,
            f"created_from ({start.isoformat()}) must be before created_to "
            f"({end.isoformat()}): no job can be in that window.",
        )
    return JobFilter(kinds, tuple(dict.fromkeys(query.status or ())), start, end)


async def _page(
    store: Store, account_id: int, kinds: tuple[str, ...], query: ListQuery
) -> tuple[list[Job], str | None]:
    """A page of jobs and the cursor of the next (a finder list's cursors are its own)."""
    where = _filter(kinds, query)
    tag = "f" if kinds == ("finder_csv",) else "j"
    before = decode_cursor(tag, query.cursor)
    found, last = await to_thread.run_sync(
        lambda: jobs_page(store.engine, account_id, where, limit=query.limit, before_id=before)
    )
    return found, encode_cursor(tag, last)


@router.get(
    "/api/bulk",
    response_model=BulkJobList,
    tags=["bulk jobs"],
    summary="List your bulk jobs, newest first",
    description="The account's bulk jobs (CSV uploads and JSON lists), newest first, a page "
    "at a time: pass the answer's `next_cursor` as `cursor` for the next page, until it is "
    "null. Filter by `status`, `kind` (`bulk_csv`: uploads, `bulk_json`: "
    "`POST /api/verify/bulk`) and creation time. Each item is the job as "
    "`GET /api/bulk/{job_id}` gives it. Costs no credit.",
    responses=pick_error_docs(_ERRORS, (422,)),
)
async def list_bulk_jobs(
    account: AccountDep,
    store: StoreDep,
    query: ListQueryDep,
    kind: Annotated[
        list[BulkKind] | None,
        Query(
            max_length=2,
            description="Only jobs of these kinds: `bulk_csv` (CSV uploads), `bulk_json` "
            "(JSON lists). Default: both.",
        ),
    ] = None,
) -> BulkJobList:
    kinds = tuple(dict.fromkeys(kind)) if kind else BULK_KINDS
    found, next_cursor = await _page(store, account.id, kinds, query)
    return BulkJobList(jobs=[BulkJob.of(job) for job in found], next_cursor=next_cursor)


@router.get(
    "/api/find-email/csv",
    response_model=FinderJobList,
    tags=["email finder"],
    summary="List your Email Finder CSV jobs, newest first",
    description="The account's Email Finder CSV jobs, newest first, a page at a time (pass "
    "`next_cursor` as `cursor` until it is null), filtered by `status` and creation time. "
    "Each item is the job as `GET /api/find-email/csv/{job_id}` gives it. Any key of the "
    "account may list them, also after its Email Finder is switched off. Costs no credit.",
    responses=pick_error_docs(_ERRORS, (422,)),
)
async def list_finder_jobs(
    account: AccountDep, store: StoreDep, query: ListQueryDep
) -> FinderJobList:
    found, next_cursor = await _page(store, account.id, ("finder_csv",), query)
    return FinderJobList(jobs=[FinderJob.of(job) for job in found], next_cursor=next_cursor)
