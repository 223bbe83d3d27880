"""A job deleted by its owner (``DELETE /api/bulk/{id}``, the finder's, the dashboard's
Delete button) or by retention (``VERIMAIL_RETENTION_DAYS``): its data goes, the ledger's
rows naming it stay.

A job still running is cancelled first (its settled rows kept and the rest refunded, as a
cancellation does), then deleted: the owner asked for the list to go, so no run may keep
working on it. The row becomes a tombstone (``store/job_deletion.py``), then the files go
(``files/job_removal.py``). A run that was still stopping may write a last result part
after that; the sweep removes the files of jobs deleted in the last day again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from verimail.config import Settings
from verimail.files.job_removal import remove_job_files
from verimail.jobs.cancel import cancel_for_owner
from verimail.store import job_deletion, job_shards
from verimail.store import jobs as job_store
from verimail.store.db import Store, utcnow

log = logging.getLogger(__name__)

RESWEEP = timedelta(days=1)
"""How long after a deletion the sweep removes a job's files again (a late writer's)."""


@dataclass(frozen=True)
class Deleted:
    """What a deletion did: the job as it was (None: deleted already), and the Prefect runs
    that may still be planned for it (its list's re-verification schedule, its shards not
    done), to cancel."""

    job: job_store.Job | None
    planned_runs: list[str]


def delete_job(settings: Settings, store: Store, job_id: int) -> Deleted:
    """Delete job ``job_id`` (an account's own: the caller checked), cancelling it first if
    it runs. Idempotent: a job deleted already is left as it is."""
    job = job_store.get_job_any(store.engine, job_id)
    if job is None or job.deleted_at is not None:
        return Deleted(None, [])
    if not job.finished:
        cancel_for_owner(settings, store, job_id)
    planned = job_deletion.schedule_runs_of(store.engine, job_id) + [
        shard.flow_run_id
        for shard in job_shards.shards_of(store.engine, job_id)
        if shard.flow_run_id and shard.status != "done"
    ]
    before = job_deletion.tombstone(store.engine, job_id)
    if before is None:  # (deleted meanwhile by another request or the sweep)
        return Deleted(None, [])
    remove_job_files(settings.data_dir, job_id, before.upload_path)
    job_deletion.files_removed(store.engine, job_id)
    return Deleted(before, planned)


def purge_expired(settings: Settings, store: Store, now: datetime | None = None) -> list[int]:
    """Retention: delete every job that ended more than ``retention_days`` ago (0: keep
    them all), and remove again what a late writer left of jobs deleted in the last day;
    the ids deleted now."""
    now = now or utcnow()
    for gone in job_deletion.deleted_with_files(store.engine, now - RESWEEP):
        remove_job_files(settings.data_dir, gone.id, gone.upload_path)
        if gone.upload_path is not None:
            job_deletion.files_removed(store.engine, gone.id)
    if settings.retention_days <= 0:
        return []
    deleted = []
    cutoff = now - timedelta(days=settings.retention_days)
    for job in job_deletion.expired_jobs(store.engine, cutoff):
        if delete_job(settings, store, job.id).job is not None:
            deleted.append(job.id)
    if deleted:
        log.info("retention: deleted the data of %d job(s) ended before %s", len(deleted), cutoff)
    return deleted
