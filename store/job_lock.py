"""A job row under its lock: whose run has the job, and its ``options``.

Every write that must agree with a job's state takes this lock first: the transitions
(:mod:`verimail.store.jobs`), the resume and retry claims (:mod:`verimail.store.job_retries`),
the webhook leases (:mod:`verimail.store.job_webhooks`) and a run's charges
(:mod:`verimail.store.billing.job_charges`). It sits below all of them, so none of them
imports another to lock a job.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Row, select, update

from verimail.store.tables import jobs

TERMINAL_STATUSES: frozenset[str] = frozenset({"completed", "failed"})


def lock_job(conn: Connection, job_id: int) -> Row[Any] | None:
    """Lock and return the job row for the rest of the transaction (None: no such job)."""
    return conn.execute(select(jobs).where(jobs.c.id == job_id).with_for_update()).one_or_none()


def attempts(options: dict[str, Any] | None) -> int:
    """Which run of the job the ``options`` say is current: 1, then one more per resume."""
    return int((options or {}).get("attempts", 1))


def run_owns(job: Row[Any], attempt: int | None) -> bool:
    """Whether run ``attempt`` still has the (locked) job: recovery has not resumed it as a
    later run. A run taken for dead while it was only frozen may go on for a while; what it
    writes to the job must then be refused. ``None``: not a run (recovery, the runner
    settling a run that never started), always allowed."""
    if attempt is None:
        return True
    return attempts(options_of(job)) == attempt


def run_has_job(conn: Connection, job_id: int, attempt: int) -> bool:
    """Lock the job; whether run ``attempt`` still has it (open, and not resumed by a later
    run): what a run's charges and refunds are checked against."""
    row = lock_job(conn, job_id)
    return row is not None and row.status not in TERMINAL_STATUSES and run_owns(row, attempt)


def options_of(job: Row[Any]) -> dict[str, Any]:
    """A locked job row's ``options``, decoded (empty when it has none)."""
    return json.loads(job.options) if job.options else {}


def taken_from_run(job: Row[Any], cancelled: dict[str, Any], now: datetime) -> str:
    """The (locked) job's ``options`` once its owner cancelled it: ``cancelled`` kept with its
    time, and one more run counted, as recovery counts one, so the run that had the job
    finds it superseded at its next beat and stops."""
    current = options_of(job)
    return json.dumps(
        {
            **current,
            "attempts": attempts(current) + 1,
            "cancelled": {**cancelled, "at": now.isoformat()},
        }
    )


def store_options(conn: Connection, job_id: int, options: dict[str, Any], **values: Any) -> None:
    """Write back a job's ``options`` (read under the same lock), with any other columns."""
    conn.execute(
        update(jobs).where(jobs.c.id == job_id).values(options=json.dumps(options), **values)
    )
