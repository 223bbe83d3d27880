"""Taking a job up again: a stale job resumed as a later run, and deferred retry passes.

A bulk run that ends with greylisted or temporarily failed addresses parks the job: it stays
``processing``, ``options["retry"]`` says which pass comes next and when, and its heartbeat
is set to that time (the job is not stale while it waits). The pass is claimed by the first
run that starts it (:func:`claim_retry_pass`), so a scheduled run and the reaper's catch-up
never both do it. A job whose runner died is claimed by one process that resumes it
(:func:`claim_for_resume`), which reopens a retry pass the dead run left mid-way.

Who uses them: ``jobs/recovery.py`` (resume), ``jobs/retries.py`` and ``flows/job_run.py``
(park, claim, what is due).
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from sqlalchemy import Engine, select

from verimail.store.db import utcnow, write_tx
from verimail.store.job_lock import (
    TERMINAL_STATUSES,
    lock_job,
    options_of,
    run_owns,
    store_options,
)
from verimail.store.jobs import Job, count_values, job_from_row
from verimail.store.tables import jobs


def claim_for_resume(
    engine: Engine, job_id: int, seen_heartbeat: datetime | None, *, now: datetime | None = None
) -> int | None:
    """Take over a stale job: beat and count the attempt, only if nobody beat meanwhile.

    Returns the new attempt number, or None when another process claimed it first (its
    heartbeat moved) or the job finished — so two API processes never resume one job twice.
    A job whose deferred retry pass died mid-way has that pass open again (``phase``
    ``waiting_to_retry``, due now), so the resumed run does that pass, not the whole job.
    """
    now = now or utcnow()
    with write_tx(engine) as conn:
        job = lock_job(conn, job_id)
        if job is None or job.status in TERMINAL_STATUSES:
            return None
        if job.heartbeat_at != seen_heartbeat:
            return None
        options = options_of(job)
        attempt = int(options.get("attempts", 1)) + 1
        options = {**options, "attempts": attempt}
        state = options.get("retry") or {}
        if state.get("phase") == "retrying":
            options["retry"] = {
                **state,
                "phase": "waiting_to_retry",
                "next_retry_at": now.isoformat(),
            }
        store_options(conn, job_id, options, heartbeat_at=now)
    return attempt


RetryPhase = Literal["verifying", "waiting_to_retry", "retrying"]


def park_for_retry(
    engine: Engine,
    job_id: int,
    attempt: int,
    *,
    retry_pass: int,
    waiting: int,
    next_retry_at: datetime,
    waited: float,
    processed: int,
    counts: dict[str, int],
) -> bool:
    """Park run ``attempt``'s job until ``next_retry_at``, ``waiting`` addresses to retry in
    pass ``retry_pass`` (``waited``: seconds of delay planned so far). False unless the job
    is processing and still this run's."""
    with write_tx(engine) as conn:
        job = lock_job(conn, job_id)
        if job is None or job.status != "processing" or not run_owns(job, attempt):
            return False
        state = {
            "phase": "waiting_to_retry",
            "pass": retry_pass,
            "waiting": waiting,
            "next_retry_at": next_retry_at.isoformat(),
            "waited": waited,
        }
        store_options(
            conn,
            job_id,
            {**options_of(job), "retry": state},
            heartbeat_at=next_retry_at,
            processed_emails=processed,
            **count_values(counts),
        )
    return True


def claim_retry_pass(
    engine: Engine, job_id: int, attempt: int, retry_pass: int, *, now: datetime | None = None
) -> bool:
    """Start pass ``retry_pass`` of a parked job: True for the one run that gets it."""
    with write_tx(engine) as conn:
        job = lock_job(conn, job_id)
        if job is None or job.status != "processing" or not run_owns(job, attempt):
            return False
        options = options_of(job)
        state = dict(options.get("retry") or {})
        if state.get("phase") != "waiting_to_retry" or state.get("pass") != retry_pass:
            return False
        state.update(phase="retrying", next_retry_at=None)
        store_options(conn, job_id, {**options, "retry": state}, heartbeat_at=now or utcnow())
    return True


def due_retries(engine: Engine, *, now: datetime | None = None) -> list[Job]:
    """Parked jobs whose next pass is due (or overdue: the process that was to start it
    died), for the reaper to start."""
    query = select(jobs).where(
        jobs.c.status == "processing", jobs.c.heartbeat_at <= (now or utcnow())
    )
    with engine.connect() as conn:
        found = [job_from_row(row) for row in conn.execute(query)]
    return [job for job in found if job.retry.get("phase") == "waiting_to_retry"]
