"""The ``purge-expired-jobs`` flow: retention (``VERIMAIL_RETENTION_DAYS``) as a Prefect
deployment, run daily by workers (``verimail deploy``, ``prefect.yaml``). With the local
runner the API process's sweep does the same (``runners/sweep.py``). The rules are the job
service's (``jobs/delete.py``).
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger

from verimail.config import current_settings
from verimail.jobs.context import store_for
from verimail.jobs.delete import purge_expired


@flow(name="purge-expired-jobs", persist_result=False)
def purge_expired_jobs() -> dict[str, Any]:
    """Delete the data of every job that ended more than ``retention_days`` ago (0: none);
    the ids deleted."""
    settings = current_settings()
    deleted = purge_expired(settings, store_for(settings))
    get_run_logger().info(
        "retention %s day(s): %d job(s) deleted%s",
        settings.retention_days,
        len(deleted),
        f" ({', '.join(map(str, deleted))})" if deleted else "",
    )
    return {"retention_days": settings.retention_days, "deleted": deleted}
