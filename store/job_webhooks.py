"""The webhook outbox: which finished job's webhook is still owed, and who delivers it.

A finished job's webhook is owed until a delivery ends (delivered, or given up after its
retries): ``options["webhook_done"]``. Whoever delivers first claims it for a while
(``options["webhook_claimed_at"]``), so the run that finished the job and the reaper that
catches what a crash left owed do not both POST. The delivery itself is ``jobs/notify.py``'s;
a job is marked owed when it is created (:func:`verimail.store.jobs.create_job`).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Engine, select

from verimail.store.db import utcnow, write_tx
from verimail.store.job_lock import TERMINAL_STATUSES, lock_job, options_of, store_options
from verimail.store.tables import jobs

WEBHOOK_OWED_FOR = timedelta(days=1)
"""A webhook still owed this long after its job finished is no longer tried."""


def claim_webhook(
    engine: Engine, job_id: int, lease: timedelta, *, now: datetime | None = None
) -> bool:
    """Take the delivery of a finished job's webhook for ``lease``: False when there is none
    to deliver, it was done, or another process holds a lease that has not run out."""
    now = now or utcnow()
    with write_tx(engine) as conn:
        job = lock_job(conn, job_id)
        if job is None or job.status not in TERMINAL_STATUSES or not job.webhook_url:
            return False
        options = options_of(job)
        if not _webhook_free(options, lease, now):
            return False
        store_options(conn, job_id, {**options, "webhook_claimed_at": now.isoformat()})
    return True


def _webhook_free(options: dict[str, Any], lease: timedelta, now: datetime) -> bool:
    """No delivery of the job's webhook ended, and none holds a lease that has not run out."""
    if options.get("webhook_done"):
        return False
    claimed = options.get("webhook_claimed_at")
    return not (claimed and datetime.fromisoformat(claimed) + lease > now)


def webhook_done(
    engine: Engine, job_id: int, *, error: str | None = None, now: datetime | None = None
) -> None:
    """The job's webhook delivery ended: delivered, or given up (``error``: why, kept as
    ``webhook_error`` so the job's owner sees it in the job and on the dashboard)."""
    with write_tx(engine) as conn:
        job = lock_job(conn, job_id)
        if job is None:
            return
        options = {**options_of(job), "webhook_done": (now or utcnow()).isoformat()}
        options.pop("webhook_error", None)
        if error:
            options["webhook_error"] = error
        store_options(conn, job_id, options)


def owed_webhooks(engine: Engine, lease: timedelta, *, now: datetime | None = None) -> list[int]:
    """Finished jobs (within :data:`WEBHOOK_OWED_FOR`) whose webhook no delivery has ended
    and no lease holds: a process died between finishing the job and its delivery."""
    now = now or utcnow()
    with engine.connect() as conn:
        rows = conn.execute(
            select(jobs.c.id, jobs.c.options)
            .where(
                jobs.c.webhook_url.is_not(None),
                jobs.c.status.in_(sorted(TERMINAL_STATUSES)),
                jobs.c.completed_at > now - WEBHOOK_OWED_FOR,
                jobs.c.completed_at < now - lease,
            )
            .order_by(jobs.c.id)
        ).all()
    owed = []
    for row in rows:
        options = options_of(row)
        # (jobs made before the outbox carry no "webhook_owed")
        if options.get("webhook_owed") and _webhook_free(options, lease, now):
            owed.append(row.id)
    return owed
