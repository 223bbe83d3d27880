"""The run wrapper every job flow shares: pick the job up, work it as its owner, and end it.

``bulk-verify`` and ``find-emails`` differ in their work and agree on everything around it:
a run for a finished job or a job a later run owns does nothing; the first run marks the job
``processing``; the work runs with the heartbeat (``jobs/heartbeat.py``); a failure marks
the job failed (refunding what was not verified), tells its webhook and publishes its
summary; a success tells the webhook and publishes the summary — or, for a job whose
first pass parked addresses for a deferred retry, parks it instead.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from verimail.config import Settings
from verimail.engine import metrics
from verimail.flows.failures import customer_reason, ends_the_process
from verimail.flows.summary import publish_job_summary
from verimail.jobs.context import no_such_job
from verimail.jobs.heartbeat import Superseded, as_owner, started_late, superseded_outcome
from verimail.jobs.notify import notify_job
from verimail.store import jobs as job_store
from verimail.store.db import Store

Outcome = dict[str, Any]


async def start_job(
    store: Store, job_id: int, attempt: int | None, *, flow_run_id: str | None = None
) -> job_store.Job | Outcome:
    """The job as it was when this run picked it up (marked ``processing`` now if it was
    pending), or the outcome that ends this run at once: the job is finished, or a later
    run owns it."""
    job = await asyncio.to_thread(job_store.get_job_any, store.engine, job_id)
    if job is None:
        raise no_such_job(store, job_id)
    if job.finished:
        return {"job_id": job.id, "status": job.status}
    if started_late(job, attempt):
        return superseded_outcome(job, attempt)
    if job.status == "pending":
        await asyncio.to_thread(
            job_store.mark_processing, store.engine, job.id, flow_run_id=flow_run_id
        )
        metrics.observe_queue_wait(job.kind, job.created_at)
    return job


async def run_as_owner(
    settings: Settings,
    store: Store,
    job: job_store.Job,
    work: Coroutine[Any, Any, Outcome],
    *,
    unverified: int,
    before_failing: Callable[[], Awaitable[None]] | None = None,
    park: Callable[[Outcome], Awaitable[Outcome]] | None = None,
) -> Outcome:
    """Run ``work`` as the job's owner and end the job with its outcome.

    ``unverified``: what a failure refunds (``job_store.UNVERIFIED``: all not verified; 0
    for a job that charges as it goes). ``before_failing``: saves what the run has done
    before the job is failed (best effort). ``park``: ends a run whose outcome is
    ``waiting_to_retry``.
    """
    try:
        summary = await as_owner(store, job, settings.job_stale_after, work)
    except Superseded:  # a later run has the job: it is not this run's to fail
        return superseded_outcome(job)
    except BaseException as exc:
        if ends_the_process(exc):  # (not the job's failure: the reaper resumes it)
            raise
        if before_failing is not None:
            with contextlib.suppress(Exception):
                await before_failing()
        await asyncio.to_thread(
            job_store.mark_failed,
            store.engine,
            job.id,
            customer_reason(job.id, "The job stopped", exc),
            unverified,
            attempt=job.attempt,  # (refused if a later run has the job: it is that run's)
        )
        with contextlib.suppress(Exception):
            await notify_job(settings, job.id)
        await publish_job_summary(settings, store, job.id)
        raise
    if park is not None and summary["status"] == "waiting_to_retry":
        return await park(summary)
    # (Outside the try: a run cancelled while it delivers must not deliver again as failed.)
    await notify_job(settings, job.id)
    await publish_job_summary(settings, store, job.id)
    return summary
