"""The Prefect side of a job its owner cancelled or deleted: its runs that have not started
are cancelled in Prefect, so no worker takes them (the one place that does this).

A run already at work is not touched here: the job's own heartbeat stops it (the job is
no longer its run's: ``jobs/cancel.py``), and it ends as a run that lost its job does. What
is cancelled: a parked job's planned retry pass (a Scheduled run of the deployment),
shard runs still waiting in the work pool, a run submitted but not yet taken, and the
planned run of a deleted list's re-verification schedule.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from verimail.config import Settings
from verimail.flows.planner import cancel_run
from verimail.jobs.context import store_for
from verimail.store import job_shards
from verimail.store import jobs as job_store

log = logging.getLogger(__name__)


def job_runs(settings: Settings, job_id: int) -> list[str]:
    """The Prefect runs the store names for job ``job_id`` (its own and its shards'), read
    before the job is deleted (the deletion forgets its shards)."""
    engine = store_for(settings).engine
    job = job_store.get_job_any(engine, job_id)
    runs = [job.flow_run_id] if job is not None and job.flow_run_id else []
    runs += [s.flow_run_id for s in job_shards.shards_of(engine, job_id) if s.flow_run_id]
    return runs


async def cancel_job_runs(
    settings: Settings, job_id: int, runs: Iterable[str] = (), *, why: str
) -> None:
    """Cancel in Prefect the runs of job ``job_id`` that are planned or queued, and ``runs``
    (read before a deletion). With the local runner, a job's runs are this process's
    threads, which the heartbeat stops: only ``runs`` are asked about. Best effort: a run
    that is gone, or started meanwhile, is left as it is (and stops at its next beat)."""
    wanted = list(runs)
    if settings.runner == "deployment":
        wanted += job_runs(settings, job_id)
    for run in dict.fromkeys(wanted):
        await cancel_run(run, why)
    if wanted:
        log.info("job %s: %s; its planned runs cancelled in Prefect", job_id, why)
