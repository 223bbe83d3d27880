"""The run wrapper every job flow shares: pick the job up, work it as its owner, and end it.

``bulk-verify`` and ``find-emails`` differ in their work and agree on everything around it:
a run for a finished job or a job a later run owns does nothing; the first run marks the job
``processing``, a deferred retry pass claims its pass; the work runs with the heartbeat
(``jobs/heartbeat.py``); a failure marks the job failed (refunding what was not verified),
tells its webhook and publishes its summary; a success tells the webhook and publishes the
summary — or, for a job whose pass left work the servers put off, parks it until its next
pass (``jobs/retries.py``) instead.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Coroutine
from datetime import datetime
from pathlib import Path
from typing import Any

import polars as pl

from verimail.config import Settings
from verimail.engine import observe_queue_wait
from verimail.flows.failures import customer_reason, ends_the_process
from verimail.flows.planner import job_request
from verimail.flows.summary import publish_job_summary
from verimail.jobs import retries
from verimail.jobs.context import no_such_job
from verimail.jobs.heartbeat import Superseded, as_owner, started_late, superseded_outcome
from verimail.jobs.notify import notify_job
from verimail.schemas.status_groups import groups
from verimail.store import jobs as job_store
from verimail.store.db import Store
from verimail.store.job_retries import claim_retry_pass, park_for_retry

Outcome = dict[str, Any]


async def start_job(
    store: Store,
    job_id: int,
    attempt: int | None,
    *,
    retry_pass: int = 0,
) -> job_store.Job | Outcome:
    """The job as it was when this run picked it up (marked ``processing`` now if it was
    pending; ``retry_pass``: that deferred pass claimed now), or the outcome that ends this
    run at once: the job is finished, a later run owns it, or another run has the pass."""
    job = await asyncio.to_thread(job_store.get_job_any, store.engine, job_id)
    if job is None:
        raise no_such_job(store, job_id)
    flow_run_id = _flow_run_id()
    if job.finished:
        _nothing_to_do(job, f"it has ended ({job.status})")
        return {"job_id": job.id, "status": job.status}
    if started_late(job, attempt):
        _nothing_to_do(job, f"run {attempt} was superseded: run {job.attempt} has the job")
        return superseded_outcome(job, attempt)
    if not retry_pass and job.retry.get("phase") in ("waiting_to_retry", "retrying"):
        # (A second first pass of the same run — a sharded job's merge started twice — finds
        # the job parked by the first: its deferred passes have it.)
        _nothing_to_do(job, "it waits for a deferred retry pass, which will work it")
        return superseded_outcome(job, attempt)
    if job.status == "pending":
        await asyncio.to_thread(
            job_store.mark_processing, store.engine, job.id, flow_run_id=flow_run_id
        )
        observe_queue_wait(job.kind, job.created_at)
    if flow_run_id is not None and not retry_pass:
        await asyncio.to_thread(job_store.remember_first_run, store.engine, job.id, flow_run_id)
    if retry_pass:
        claimed = await asyncio.to_thread(
            claim_retry_pass, store.engine, job.id, job.attempt, retry_pass
        )
        if not claimed:  # (another run started this pass, or the job moved on)
            _nothing_to_do(job, f"retry pass {retry_pass} was taken by another run")
            return superseded_outcome(job, attempt)
    return job


def _nothing_to_do(job: job_store.Job, why: str) -> None:
    """Say in the run's log why this run ends at once (a run started by hand for an ended
    job otherwise ended Completed without a word)."""
    with contextlib.suppress(Exception):  # (outside a flow run there is no run log)
        from prefect import get_run_logger

        get_run_logger().info("%s job %s: nothing to do: %s", _kind(job), job.id, why)


def _kind(job: job_store.Job) -> str:
    return "finder" if job.kind == "finder_csv" else "bulk"


def _flow_run_id() -> str | None:
    """The id of the flow run this code runs in (None outside one)."""
    with contextlib.suppress(Exception):
        from prefect.context import get_run_context

        return str(get_run_context().flow_run.id)  # type: ignore[union-attr]
    return None


async def run_as_owner(
    settings: Settings,
    store: Store,
    job: job_store.Job,
    work: Coroutine[Any, Any, Outcome],
    *,
    unverified: int,
    before_failing: Callable[[], Awaitable[None]] | None = None,
) -> Outcome:
    """Run ``work`` as the job's owner and end the job with its outcome.

    ``unverified``: what a failure refunds (``job_store.UNVERIFIED``: all not verified; 0
    for a job that charges as it goes). ``before_failing``: saves what the run has done
    before the job is failed (best effort). A job the work parked (an outcome
    ``waiting_to_retry``, from :func:`park_or_finish`) returns its next pass's run in
    ``next_runs`` (``flows/planner.py``).
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
    if summary["status"] == "waiting_to_retry":
        return await _park(settings, store, job, summary)
    if summary["status"] == "sharded":  # (its shards run on: the last one starts the merge)
        return summary
    _log_end(job, summary)
    # (Outside the try: a run cancelled while it delivers must not deliver again as failed.)
    await notify_job(settings, job.id)
    await publish_job_summary(settings, store, job.id)
    return summary


def _log_end(job: job_store.Job, summary: Outcome) -> None:
    """The job's end in the run's Logs tab: its counts by status group (a bulk job's) or
    its outcome's counts (a finder job's)."""
    from prefect import get_run_logger

    counts = groups(summary) if "valid_count" in summary else summary
    shown = ", ".join(f"{k} {v}" for k, v in counts.items() if isinstance(v, int) and v)
    get_run_logger().info("job %s %s: %s", job.id, summary.get("status"), shown or "no rows")


def next_pass(
    settings: Settings, job: job_store.Job, done_pass: int
) -> tuple[int, datetime, float] | None:
    """The deferred pass that follows pass ``done_pass`` (0: the first run) if it leaves
    work put off: (its number, when it starts, delay planned in all); None when the job
    finishes after this pass whatever it leaves (it opted out, or passes or wait are used
    up). A pass may ask this before it starts (the finder asks more of a greylisting
    server when a retry will follow)."""
    if not retries.enabled(settings, job):
        return None
    waited = float(job.retry.get("waited", 0.0)) if done_pass else 0.0
    return retries.plan(settings, done_pass, waited)


def pass_greylist_retries(settings: Settings, job: job_store.Job, this_pass: int) -> int:
    """In-pass greylisting retries of pass ``this_pass`` of the job (0: the first run, a
    shard's too): none by default when a deferred pass follows it
    (:func:`~verimail.jobs.retries.in_pass_greylist_retries`)."""
    follows = next_pass(settings, job, this_pass) is not None
    return retries.in_pass_greylist_retries(settings, deferred_pass_follows=follows)


async def park_or_finish(
    settings: Settings,
    job: job_store.Job,
    directory: Path,
    results: pl.DataFrame,
    *,
    key: str,
    done_pass: int,
    processed: int,
    counts: dict[str, int],
) -> Outcome | None:
    """After pass ``done_pass``: the outcome of a job to park (``results`` saved beside it
    for the next pass, which asks again the ``key`` of each result put off: an address, a
    finder row), or None when it finishes now (nothing put off, or no pass left)."""
    waiting = retries.parked(results, key)
    planned = next_pass(settings, job, done_pass) if waiting else None
    if planned is None:
        return None
    retry_pass, at, waited = planned
    results = await asyncio.to_thread(retries.record_egresses, settings, results)
    await asyncio.to_thread(retries.save_state, directory, results)
    return {
        "job_id": job.id,
        "status": "waiting_to_retry",
        "retry_pass": retry_pass,
        "retry_waiting": len(waiting),
        "next_retry_at": at,
        "waited": waited,
        "processed": processed,
        "counts": counts,
    }


async def _park(settings: Settings, store: Store, job: job_store.Job, summary: Outcome) -> Outcome:
    """Park the job until its next pass (after the run's heartbeat stopped: a last beat
    must not overwrite the future one); the pass's run is the outcome's next run."""
    parked = await asyncio.to_thread(
        park_for_retry,
        store.engine,
        job.id,
        job.attempt,
        retry_pass=summary["retry_pass"],
        waiting=summary["retry_waiting"],
        next_retry_at=summary["next_retry_at"],
        waited=summary["waited"],
        processed=summary["processed"],
        counts=summary["counts"],
    )
    if not parked:
        return superseded_outcome(job)
    from prefect import get_run_logger

    get_run_logger().info(
        "job %s: %s waiting for retry pass %s at %s",
        job.id,
        summary["retry_waiting"],
        summary["retry_pass"],
        summary["next_retry_at"].isoformat(),
    )
    next_run = job_request(
        settings, job, retry_pass=summary["retry_pass"], at=summary["next_retry_at"]
    )
    return {
        **summary,
        "next_retry_at": summary["next_retry_at"].isoformat(),
        "next_runs": [next_run],
    }
