"""A job deleted by its owner or by retention: the row becomes a tombstone.

The row is not removed: its id must never be given to another job (SQLite hands out the
highest rowid again once it is gone) while the credit ledger keeps the rows that name it
(``job:<id>``, ``job:<id>:row:<n>``: billing's history is not the owner's to delete; only
a finder row's reason, which named the address found, is reworded without it). The
tombstone keeps the id, the account, the kind, the dates and the credit columns; it loses
what came from the upload (the webhook URL, the column name, the failure's words, the
options with the file's name; only the run count stays), is in no list and answers 404.
``upload_path`` is kept until the files are gone (:func:`files_removed`), so a sweep
finishes a deletion that stopped half-way.
"""

from __future__ import annotations

import json
from datetime import datetime

from sqlalchemy import Engine, delete, select, update

from verimail.store.billing.job_charges import forget_finds_in
from verimail.store.db import utcnow, write_tx
from verimail.store.job_lock import TERMINAL_STATUSES, attempts, lock_job, options_of
from verimail.store.jobs import Job, job_from_row
from verimail.store.tables import job_shards, jobs, reverify_runs, reverify_schedules


def tombstone(engine: Engine, job_id: int, *, now: datetime | None = None) -> Job | None:
    """Mark an ended job deleted, its shards, its list's schedule and history rows gone,
    all in one transaction; the job as it was (None: unknown, unfinished or deleted
    already — only an ended job is deleted, so no run can write to it any more). The
    schedule's planned run is the caller's to cancel (its id is in ``flow_run_id``)."""
    now = now or utcnow()
    with write_tx(engine) as conn:
        row = lock_job(conn, job_id)
        if row is None or row.status not in TERMINAL_STATUSES or row.deleted_at is not None:
            return None
        before = job_from_row(row)
        # (``attempts`` stays: a cancelled run still stopping must find the job not its own)
        kept = {"attempts": attempts(options_of(row))}
        conn.execute(delete(job_shards).where(job_shards.c.job_id == job_id))
        conn.execute(delete(reverify_schedules).where(reverify_schedules.c.list_job_id == job_id))
        conn.execute(delete(reverify_runs).where(reverify_runs.c.list_job_id == job_id))
        if row.kind == "finder_csv":  # (a find's ledger row named the address it found)
            forget_finds_in(conn, row)
        conn.execute(
            update(jobs)
            .where(jobs.c.id == job_id)
            .values(
                deleted_at=now,
                result_path=None,
                email_column=None,
                options=json.dumps(kept),
                failed_reason=None,
                webhook_url=None,
            )
        )
    return before


def files_removed(engine: Engine, job_id: int) -> None:
    """The deleted job's files are gone: nothing of its upload is named any more."""
    with write_tx(engine) as conn:
        conn.execute(update(jobs).where(jobs.c.id == job_id).values(upload_path=None))


def deleted_with_files(engine: Engine, since: datetime) -> list[Job]:
    """Jobs deleted after ``since`` whose files are to be removed (again: a deletion that
    stopped half-way, or a cancelled run that wrote a last part after it was deleted)."""
    query = select(jobs).where(jobs.c.deleted_at.is_not(None), jobs.c.deleted_at > since)
    with engine.connect() as conn:
        return [job_from_row(row) for row in conn.execute(query)]


def schedule_runs_of(engine: Engine, job_id: int) -> list[str]:
    """The planned Prefect run of the list's re-verification schedule, if any (read before
    :func:`tombstone` removes the schedule)."""
    query = select(reverify_schedules.c.flow_run_id).where(
        reverify_schedules.c.list_job_id == job_id, reverify_schedules.c.flow_run_id.is_not(None)
    )
    with engine.connect() as conn:
        return [str(run) for run in conn.execute(query).scalars()]


def expired_jobs(engine: Engine, ended_before: datetime, limit: int = 500) -> list[Job]:
    """Ended jobs, not deleted, that ended before ``ended_before`` (retention), oldest first;
    not a list on a re-verification schedule (its owner keeps it in use: the schedule's
    runs compare with it)."""
    scheduled = select(reverify_schedules.c.id).where(reverify_schedules.c.list_job_id == jobs.c.id)
    query = (
        select(jobs)
        .where(
            jobs.c.status.in_(TERMINAL_STATUSES),
            jobs.c.deleted_at.is_(None),
            jobs.c.completed_at < ended_before,
            ~scheduled.exists(),
        )
        .order_by(jobs.c.completed_at)
        .limit(limit)
    )
    with engine.connect() as conn:
        return [job_from_row(row) for row in conn.execute(query)]
