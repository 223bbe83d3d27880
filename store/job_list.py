"""An account's jobs a page at a time, newest first, for ``GET /api/bulk`` and the finder's
list: keyset pagination on the job id (ids grow with creation), so a page is one indexed
query however deep the client pages, and a job created meanwhile does not shift the next
page (as an offset would).

Only the account's own jobs are ever read: the account is part of every query.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Engine, select

from verimail.store.jobs import Job, job_from_row
from verimail.store.tables import jobs


@dataclass(frozen=True)
class JobFilter:
    """Which of the account's jobs a list shows: kinds (required: a surface lists its own),
    statuses (empty: any), and a creation window ``[created_from, created_to)`` (UTC)."""

    kinds: tuple[str, ...]
    statuses: tuple[str, ...] = ()
    created_from: datetime | None = None
    created_to: datetime | None = None


def jobs_page(
    engine: Engine,
    account_id: int,
    where: JobFilter,
    *,
    limit: int,
    before_id: int | None = None,
) -> tuple[list[Job], int | None]:
    """Up to ``limit`` of the account's jobs matching ``where``, newest first, older than
    ``before_id`` when given; and the id to pass as ``before_id`` for the next page (None
    on the last page)."""
    query = select(jobs).where(
        jobs.c.account_id == account_id,
        jobs.c.kind.in_(where.kinds),
        jobs.c.deleted_at.is_(None),  # (a deleted job's tombstone is no job of the account's)
    )
    if where.statuses:
        query = query.where(jobs.c.status.in_(where.statuses))
    if where.created_from is not None:
        query = query.where(jobs.c.created_at >= where.created_from)
    if where.created_to is not None:
        query = query.where(jobs.c.created_at < where.created_to)
    if before_id is not None:
        query = query.where(jobs.c.id < before_id)
    query = query.order_by(jobs.c.id.desc()).limit(limit + 1)
    with engine.connect() as conn:
        found = [job_from_row(row) for row in conn.execute(query)]
    page = found[:limit]
    return page, (page[-1].id if len(found) > limit else None)
