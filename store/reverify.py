"""A customer's lists re-verified: who re-verified what, when, and their schedules.

A *list* is the job its owner first uploaded; each re-verification of it is a new job
(``options["reverify_of"]``: the job it compares against, ``options["list_job_id"]``: the
list). ``reverify_runs`` keeps one row per re-verification made or skipped (the list's
history on the dashboard); ``reverify_schedules`` one row per list on a schedule, naming
the Prefect flow run that makes its next run.

Every read takes the account id, so one account never sees another's lists.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, Row, delete, insert, select, update

from verimail.store.db import utcnow, write_tx
from verimail.store.jobs import Job, job_from_row
from verimail.store.tables import jobs, reverify_runs, reverify_schedules


def list_job_id(job: Job) -> int:
    """The list a job belongs to: its own id for an upload, its list's for a re-verification."""
    return int((job.options or {}).get("list_job_id") or job.id)


@dataclass(frozen=True)
class Schedule:
    id: int
    account_id: int
    list_job_id: int
    every_days: int
    next_run_at: datetime
    flow_run_id: str | None
    created_at: datetime


def _schedule(row: Row[Any]) -> Schedule:
    return Schedule(**dict(row._mapping))


def get_schedule(engine: Engine, account_id: int, list_job: int) -> Schedule | None:
    """The account's schedule of a list (None for another account's)."""
    with engine.connect() as conn:
        row = conn.execute(
            select(reverify_schedules).where(
                reverify_schedules.c.account_id == account_id,
                reverify_schedules.c.list_job_id == list_job,
            )
        ).one_or_none()
    return _schedule(row) if row else None


def get_schedule_any(engine: Engine, schedule_id: int) -> Schedule | None:
    """Any account's schedule, by id: for the flow run that makes its next run."""
    with engine.connect() as conn:
        row = conn.execute(
            select(reverify_schedules).where(reverify_schedules.c.id == schedule_id)
        ).one_or_none()
    return _schedule(row) if row else None


def list_schedules(engine: Engine, account_id: int) -> list[Schedule]:
    with engine.connect() as conn:
        rows = conn.execute(
            select(reverify_schedules)
            .where(reverify_schedules.c.account_id == account_id)
            .order_by(reverify_schedules.c.list_job_id)
        ).all()
    return [_schedule(row) for row in rows]


def put_schedule(
    engine: Engine,
    account_id: int,
    list_job: int,
    every_days: int,
    next_run_at: datetime,
    flow_run_id: str,
) -> tuple[Schedule, str | None]:
    """Create the list's schedule or change it, naming the flow run planned for
    ``next_run_at``; (the schedule, the flow run it named before — the caller cancels it)."""
    where = (
        reverify_schedules.c.account_id == account_id,
        reverify_schedules.c.list_job_id == list_job,
    )
    values = {"every_days": every_days, "next_run_at": next_run_at, "flow_run_id": flow_run_id}
    with write_tx(engine) as conn:
        row = conn.execute(select(reverify_schedules).where(*where).with_for_update()).one_or_none()
        if row is None:
            conn.execute(
                insert(reverify_schedules).values(
                    account_id=account_id, list_job_id=list_job, created_at=utcnow(), **values
                )
            )
        else:
            conn.execute(update(reverify_schedules).where(*where).values(**values))
        new = conn.execute(select(reverify_schedules).where(*where)).one()
    return _schedule(new), row.flow_run_id if row is not None else None


def due_schedules(engine: Engine, now: datetime) -> list[Schedule]:
    """Every schedule whose next run is due (any account's: for the runner)."""
    with engine.connect() as conn:
        rows = conn.execute(
            select(reverify_schedules)
            .where(reverify_schedules.c.next_run_at <= now)
            .order_by(reverify_schedules.c.next_run_at)
        ).all()
    return [_schedule(row) for row in rows]


def any_due(engine: Engine, now: datetime) -> bool:
    """Whether some schedule's next run is due (so that Prefect is asked only then)."""
    with engine.connect() as conn:
        row = conn.execute(
            select(reverify_schedules.c.id).where(reverify_schedules.c.next_run_at <= now).limit(1)
        ).first()
    return row is not None


def set_flow_run(
    engine: Engine,
    schedule_id: int,
    flow_run_id: str,
    next_run_at: datetime,
    *,
    expected: str,
) -> bool:
    """Name the flow run that makes the schedule's next run, only while the schedule still
    names ``expected`` (a change or a cancel meanwhile wins): False, and nothing written,
    otherwise — the caller then cancels the run it planned."""
    with write_tx(engine) as conn:
        result = conn.execute(
            update(reverify_schedules)
            .where(
                reverify_schedules.c.id == schedule_id,
                reverify_schedules.c.flow_run_id == expected,
            )
            .values(flow_run_id=flow_run_id, next_run_at=next_run_at)
        )
    return result.rowcount == 1


def delete_schedule(engine: Engine, account_id: int, list_job: int) -> Schedule | None:
    """Cancel the list's schedule; the schedule it was (None if there was none)."""
    with write_tx(engine) as conn:
        row = conn.execute(
            select(reverify_schedules).where(
                reverify_schedules.c.account_id == account_id,
                reverify_schedules.c.list_job_id == list_job,
            )
        ).one_or_none()
        if row is None:
            return None
        conn.execute(delete(reverify_schedules).where(reverify_schedules.c.id == row.id))
    return _schedule(row)


# --- history -------------------------------------------------------------------------------


def record_run(
    engine: Engine,
    job: Job | None,
    *,
    account_id: int,
    list_job: int,
    previous_job_id: int,
    schedule_id: int | None = None,
    skipped_reason: str | None = None,
    flow_run_id: str | None = None,
) -> None:
    """Add a re-verification of a list to its history: its job, or why it was skipped."""
    with write_tx(engine) as conn:
        conn.execute(
            insert(reverify_runs).values(
                account_id=account_id,
                list_job_id=list_job,
                job_id=job.id if job is not None else None,
                previous_job_id=previous_job_id,
                schedule_id=schedule_id,
                skipped_reason=skipped_reason,
                flow_run_id=flow_run_id,
                created_at=utcnow(),
            )
        )


@dataclass(frozen=True)
class HistoryEntry:
    """One re-verification of a list: its job (None when skipped) and when it was asked."""

    created_at: datetime
    previous_job_id: int
    scheduled: bool
    job: Job | None
    skipped_reason: str | None

    @property
    def transitions(self) -> dict[str, int]:
        return dict((self.job.options or {}).get("transitions") or {}) if self.job else {}


def history(engine: Engine, account_id: int, list_job: int, limit: int = 50) -> list[HistoryEntry]:
    """The list's re-verifications, newest first (the account's own only)."""
    query = (
        select(reverify_runs, jobs)
        .join(jobs, jobs.c.id == reverify_runs.c.job_id, isouter=True)
        .where(
            reverify_runs.c.account_id == account_id,
            reverify_runs.c.list_job_id == list_job,
        )
        .order_by(reverify_runs.c.id.desc())
        .limit(limit)
    )
    out = []
    with engine.connect() as conn:
        for row in conn.execute(query):
            values = row._mapping
            job = None
            if values[jobs.c.id] is not None:
                job = job_from_row(_JobRow({c.name: values[c] for c in jobs.c}))
            out.append(
                HistoryEntry(
                    created_at=values[reverify_runs.c.created_at],
                    previous_job_id=values[reverify_runs.c.previous_job_id],
                    scheduled=values[reverify_runs.c.schedule_id] is not None,
                    job=job,
                    skipped_reason=values[reverify_runs.c.skipped_reason],
                )
            )
    return out


class _JobRow:
    """A joined row's job columns under their own names (what ``job_from_row`` reads)."""

    def __init__(self, mapping: dict[str, Any]) -> None:
        self._mapping = mapping


def latest_completed(engine: Engine, account_id: int, list_job: int) -> Job | None:
    """The list's most recent completed run (its upload or a re-verification): what the
    next re-verification compares against."""
    with engine.connect() as conn:
        ids = [list_job] + [
            row.job_id
            for row in conn.execute(
                select(reverify_runs.c.job_id).where(
                    reverify_runs.c.account_id == account_id,
                    reverify_runs.c.list_job_id == list_job,
                    reverify_runs.c.job_id.is_not(None),
                )
            )
        ]
        row = conn.execute(
            select(jobs)
            .where(
                jobs.c.id.in_(ids),
                jobs.c.account_id == account_id,
                jobs.c.status == "completed",
            )
            .order_by(jobs.c.completed_at.desc(), jobs.c.id.desc())
            .limit(1)
        ).one_or_none()
    return job_from_row(row) if row else None
